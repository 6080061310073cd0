"""Topology views agree with Cluster.link and carry the weights the heterogeneous planner needs."""

import numpy as np
import pytest

from autopar.cluster import load_cluster
from autopar.cluster.topology import (
    bandwidth_matrix,
    device_graph,
    device_nodes,
    latency_matrix,
    node_bandwidth_matrix,
    node_groups_by_type,
)

SPECS = ["2x8xA100-80G", "2x8xA100+8x4090", "geo-us-3region", "8x3080Ti+8x3090+8x4090+8xA100", "4xcpu", "12x4090"]


def test_node_groups_by_type():
    assert node_groups_by_type(load_cluster("8x3080Ti+8x3090+8x4090+8xA100")) == {
        "RTX3080Ti": [0], "RTX3090": [1], "RTX4090": [2], "A100-80G": [3]}
    assert node_groups_by_type(load_cluster("8x3090+2x8xA100+16x3090")) == {"RTX3090": [0, 3, 4], "A100-80G": [1, 2]}


@pytest.mark.parametrize("spec", SPECS)
def test_matrices_match_cluster_links(spec):
    c = load_cluster(spec)
    n = c.num_devices
    bw, lat = bandwidth_matrix(c), latency_matrix(c)
    assert bw.shape == lat.shape == (n, n)
    assert np.all(np.isinf(np.diag(bw))) and np.all(np.diag(lat) == 0)
    for a in range(n):
        for b in range(n):
            if a != b:
                assert (bw[a, b], lat[a, b]) == c.link(a, b)
    assert list(device_nodes(c)) == [c.node_of(d) for d in range(n)]


def test_uneven_network_shows_in_the_matrix():
    c = load_cluster("2x8xA100+8x4090")
    bw = bandwidth_matrix(c)
    assert bw[0, 1] == 300e9 and bw[0, 8] == 200e9 and bw[0, 16] == 12.5e9 and bw[16, 17] == 16e9
    nb = node_bandwidth_matrix(c)
    assert nb.shape == (3, 3) and nb[0, 0] == 300e9 and nb[2, 2] == 16e9


def test_matrix_is_fast_for_1024_devices():
    import time

    c = load_cluster("128x8xA100-80G")
    t = time.perf_counter()
    bw = bandwidth_matrix(c)
    assert time.perf_counter() - t < 1.0
    assert bw[0, 7] == 300e9 and bw[0, 1023] == 200e9


def test_device_graph_weights():
    c = load_cluster("8x3090+8x4090+8xA100")
    g = device_graph(c)
    n = c.num_devices
    assert g.number_of_nodes() == n and g.number_of_edges() == n * (n - 1) // 2
    assert g.nodes[0]["gpu"] == "RTX3090" and g.nodes[20]["tflops"] == 312 and g.nodes[20]["node"] == 2
    assert g.nodes[20]["flops"] == 312e12 and g.nodes[0]["memory_bytes"] == 24 * 1024**3
    for a, b, e in g.edges(data=True):
        assert (e["bandwidth"], e["latency"]) == c.link(a, b)
        assert isinstance(e["weight"], int) and e["weight"] >= 1
    assert g.edges[16, 17]["weight"] > g.edges[0, 1]["weight"] > g.edges[0, 16]["weight"]
    plain = c.graph()  # the contract's own view agrees
    assert all(plain.edges[a, b]["bandwidth_gbps"] == pytest.approx(g.edges[a, b]["bandwidth_gbps"])
               for a, b in [(0, 1), (0, 16), (16, 17)])
