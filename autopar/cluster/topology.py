"""Views of a Cluster for the heterogeneous planner: type groups, the device graph, link matrices.

Matrices are in SI units (bytes/s, seconds), device x device in device order (node by node), and
are built per node pair then broadcast, so a 1024-device cluster costs milliseconds.
"""

from __future__ import annotations

import numpy as np

from autopar.cluster.cluster import Cluster


def node_groups_by_type(c: Cluster) -> dict[str, list[int]]:
    """GPU type name -> indices of the nodes of that type, in cluster order."""
    groups: dict[str, list[int]] = {}
    for i, nd in enumerate(c.nodes):
        groups.setdefault(nd.gpu.name, []).append(i)
    return groups


def device_nodes(c: Cluster) -> np.ndarray:
    """Node index of every device."""
    return np.repeat(np.arange(c.num_nodes), [nd.count for nd in c.nodes])


def node_bandwidth_matrix(c: Cluster) -> np.ndarray:
    """Node x node bytes/s: off-diagonal the inter-node link, diagonal the node's intra-node link."""
    n = c.num_nodes
    m = np.empty((n, n))
    for a in range(n):
        for b in range(n):
            m[a, b] = c.nodes[a].intra_bw if a == b else c.node_link(a, b)[0]
    return m


def node_latency_matrix(c: Cluster) -> np.ndarray:
    """Node x node seconds: off-diagonal the inter-node latency, diagonal the intra-node latency."""
    n = c.num_nodes
    m = np.empty((n, n))
    for a in range(n):
        for b in range(n):
            m[a, b] = c.nodes[a].intra_lat_us * 1e-6 if a == b else c.node_link(a, b)[1]
    return m


def bandwidth_matrix(c: Cluster) -> np.ndarray:
    """Device x device bytes/s (equal to ``c.link(a, b)[0]``), inf on the diagonal."""
    dn = device_nodes(c)
    m = node_bandwidth_matrix(c)[np.ix_(dn, dn)]
    np.fill_diagonal(m, np.inf)
    return m


def latency_matrix(c: Cluster) -> np.ndarray:
    """Device x device seconds (equal to ``c.link(a, b)[1]``), 0 on the diagonal."""
    dn = device_nodes(c)
    m = node_latency_matrix(c)[np.ix_(dn, dn)]
    np.fill_diagonal(m, 0.0)
    return m


def device_graph(c: Cluster):
    """networkx Graph of devices: node attrs gpu, node, tflops, flops (FLOP/s), memory_bytes;
    edge attrs bandwidth (bytes/s), latency (s), bandwidth_gbps, latency_us, and an integer
    ``weight`` (MB/s, at least 1) for METIS-style partitioners that want integer edge weights.

    Complete graph: n(n-1)/2 edges, fine for the tens to hundreds of devices a heterogeneous
    search partitions; use the matrices above for larger clusters.
    """
    import networkx as nx

    bw, lat = bandwidth_matrix(c), latency_matrix(c)
    g = nx.Graph()
    for d in range(c.num_devices):
        gpu = c.gpu_of(d)
        g.add_node(d, gpu=gpu.name, node=c.node_of(d), tflops=gpu.tflops, flops=gpu.flops,
                   memory_gib=gpu.memory_gib, memory_bytes=gpu.memory_bytes)
    rows, cols = np.triu_indices(c.num_devices, k=1)
    g.add_edges_from(
        (int(a), int(b), {"bandwidth": float(bw[a, b]), "latency": float(lat[a, b]),
                          "bandwidth_gbps": float(bw[a, b]) / 1e9, "latency_us": float(lat[a, b]) * 1e6,
                          "weight": max(1, int(bw[a, b] / 1e6))})
        for a, b in zip(rows, cols))
    return g
