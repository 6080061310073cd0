"""Node and Cluster: machines of GPUs (``autopar.cluster.gpu.GPUType``) and the links between them.

Units in files and fields: bandwidth GB/s (1e9 bytes/s, one direction), latency microseconds, memory
GiB (a GPU's own units: ``gpu.py``). Methods that feed the cost model return SI units (bytes, bytes/s,
seconds). Devices are numbered node by node: node 0's GPUs first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autopar.cluster.gpu import (
    ECC_BANDWIDTH_FRACTION,
    ECC_MEMORY_FRACTION,
    GIB,
    MAMF_FIELDS,
    PEAK_FIELDS,
    GPUType,
)
from autopar.errors import AutoparError

# GPUType and its constants live in autopar/cluster/gpu.py; importers of this module keep finding them here.
__all__ = ["ECC_BANDWIDTH_FRACTION", "ECC_MEMORY_FRACTION", "GIB", "MAMF_FIELDS", "MAX_DEVICES", "MAX_MATRIX_NODES",
           "PEAK_FIELDS", "Cluster", "GPUType", "Node", "check_size"]

# Past these sizes no search can finish: refused up front, before any per-device or per-pair list.
MAX_DEVICES = 1_000_000
MAX_MATRIX_NODES = 4096  # nodes of a cluster whose links differ per node pair (a node x node matrix)


def check_size(where: str, devices: int, matrix_nodes: int = 0) -> None:
    """One-line AutoparError when a cluster has more devices (or matrix nodes) than the planner takes."""
    if devices > MAX_DEVICES:
        raise AutoparError(where, f"too large: {devices} devices (at most {MAX_DEVICES})",
                           "check the node and GPU counts")
    if matrix_nodes > MAX_MATRIX_NODES:
        raise AutoparError(where, f"too large: {matrix_nodes} nodes with per-pair links (at most "
                           f"{MAX_MATRIX_NODES})", "use nodes of one class and one inter-node network")


@dataclass(frozen=True)
class Node:
    """A machine: ``count`` GPUs of one type joined by an intra-node fabric."""

    gpu: GPUType
    count: int
    intra_bw_gbps: float = 0.0  # 0: the GPU type's default (NVLink or PCIe)
    intra_lat_us: float = 3.0
    zone: str = "default"
    name: str = ""

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise AutoparError(f"node {self.name or '?'}.count", f"must be at least 1, got {self.count}",
                               "remove the node or give it GPUs")
        if self.intra_bw_gbps < 0:
            raise AutoparError(f"node {self.name or '?'}.intra_bw_gbps", "is negative", "give GB/s > 0")

    @property
    def intra_bw(self) -> float:
        """Bytes/s between two GPUs of this node."""
        return (self.intra_bw_gbps or self.gpu.default_intra_bw_gbps) * 1e9


@dataclass
class Cluster:
    """Nodes plus the network between them.

    ``inter_bw_gbps`` / ``inter_lat_us``: one value for every node pair (the node's NIC bandwidth).
    ``bw_matrix_gbps`` / ``lat_matrix_us``: optional node x node matrices that override it (slow,
    uneven or geo-distributed networks); the diagonal is ignored.
    """

    nodes: list[Node]
    inter_bw_gbps: float = 25.0
    inter_lat_us: float = 10.0
    bw_matrix_gbps: list[list[float]] | None = None
    lat_matrix_us: list[list[float]] | None = None
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise AutoparError("cluster.nodes", "is empty", "give at least one node with GPUs")
        n = len(self.nodes)
        check_size("cluster", sum(nd.count for nd in self.nodes),
                   n if self.bw_matrix_gbps is not None or self.lat_matrix_us is not None else 0)
        if len(self.nodes) > 1 and self.bw_matrix_gbps is None and self.inter_bw_gbps <= 0:
            raise AutoparError("cluster.inter_bw_gbps", f"must be positive, got {self.inter_bw_gbps}",
                               "give the inter-node bandwidth in GB/s")
        for key, mat in (("bw_matrix_gbps", self.bw_matrix_gbps), ("lat_matrix_us", self.lat_matrix_us)):
            if mat is None:
                continue
            if len(mat) != n or any(len(row) != n for row in mat):
                raise AutoparError(f"cluster.{key}", f"must be {n}x{n} (one row and column per node)",
                                   "give one value per node pair")
            for i in range(n):
                for j in range(n):
                    if i != j and (mat[i][j] <= 0 if key.startswith("bw") else mat[i][j] < 0):
                        raise AutoparError(f"cluster.{key}[{i}][{j}]", f"is {mat[i][j]}",
                                           "bandwidths must be > 0 and latencies >= 0")
        self._homogeneous: bool | None = None
        self._memo: dict = {}
        self._dev_node: list[int] = [i for i, nd in enumerate(self.nodes) for _ in range(nd.count)]
        self._node_first: list[int] = []
        start = 0
        for nd in self.nodes:
            self._node_first.append(start)
            start += nd.count

    # -- devices -----------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self._dev_node)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def node_of(self, device: int) -> int:
        return self._dev_node[device]

    def first_devices(self) -> list[int]:
        """Each node's first device."""
        return list(self._node_first)

    def nodes_of(self, devices: list[int]) -> list[int]:
        """``node_of`` of each device, in order."""
        return list(map(self._dev_node.__getitem__, devices))

    def gpu_of(self, device: int) -> GPUType:
        return self.nodes[self._dev_node[device]].gpu

    def budget_gib(self, device: int, cap_gib: float | None = None) -> float:
        """What ``device`` may hold, GiB: its usable memory less the ``memory_margin`` share, or ``cap_gib``
        (a plan's ``memory_budget_gib``) where that is smaller. The one rule the estimate's ``fits``, the
        search and the validator share."""
        gpu = self.gpu_of(device)
        usable = gpu.usable_memory_gib * (1.0 - gpu.memory_margin)
        return usable if cap_gib is None else min(usable, cap_gib)

    def node_devices(self, node: int) -> list[int]:
        start = self._node_first[node]
        return list(range(start, start + self.nodes[node].count))

    @property
    def gpu_types(self) -> list[GPUType]:
        seen: dict[str, GPUType] = {}
        for nd in self.nodes:
            seen.setdefault(nd.gpu.name, nd.gpu)
        return list(seen.values())

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node when all nodes are alike (else the smallest node)."""
        return min(nd.count for nd in self.nodes)

    @property
    def is_homogeneous(self) -> bool:
        """One GPU type, equal nodes, one intra-node fabric and a uniform network (memoised)."""
        if self._homogeneous is None:
            self._homogeneous = self._compute_homogeneous()
        return self._homogeneous

    def _compute_homogeneous(self) -> bool:
        first = self.nodes[0]
        same_nodes = all(nd.gpu == first.gpu and nd.count == first.count and nd.intra_bw == first.intra_bw
                         for nd in self.nodes)
        return same_nodes and self._uniform_network()

    def _uniform_network(self) -> bool:
        n = self.num_nodes
        if n == 1 or (self.bw_matrix_gbps is None and self.lat_matrix_us is None):
            return True
        bws = {self.node_link(i, j) for i in range(n) for j in range(n) if i != j}
        return len(bws) == 1

    # -- links ------------------------------------------------------------------------------
    def node_link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) between nodes a != b."""
        bw = self.bw_matrix_gbps[a][b] if self.bw_matrix_gbps is not None else self.inter_bw_gbps
        lat = self.lat_matrix_us[a][b] if self.lat_matrix_us is not None else self.inter_lat_us
        return bw * 1e9, lat * 1e-6

    def link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) between devices a and b (a != b)."""
        na, nb = self._dev_node[a], self._dev_node[b]
        if na == nb:
            nd = self.nodes[na]
            return nd.intra_bw, nd.intra_lat_us * 1e-6
        return self.node_link(na, nb)

    def intern(self, kind: str, value: tuple) -> int:
        """A small id, equal for equal ``value`` of one ``kind`` (device groups, node patterns): cheap memo keys."""
        return self._memo.setdefault((kind, value), len(self._memo))

    def memoised(self, key: tuple, compute):
        """``compute()`` once per ``key`` for this cluster (facts of device groups: links, layouts)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def group_layout(self, devices: list[int]) -> tuple[int, int]:
        """(members per node, nodes spanned) of a device group, taking the largest per-node share."""
        per_node: dict[int, int] = {}
        for d in devices:
            per_node[self._dev_node[d]] = per_node.get(self._dev_node[d], 0) + 1
        return max(per_node.values()), len(per_node)

    def group_links(self, devices: list[int]) -> tuple[float, float, float, float]:
        """Slowest links inside a group: (intra bw, intra lat, inter bw, inter lat) in SI units.

        Hierarchical collectives run an intra-node phase and an inter-node phase; each phase is
        as slow as its slowest link. Inter values are inf/0 when the group sits in one node.
        """
        nodes = sorted({self._dev_node[d] for d in devices})
        intra_bw = min(self.nodes[n].intra_bw for n in nodes)
        intra_lat = max(self.nodes[n].intra_lat_us for n in nodes) * 1e-6
        if len(nodes) == 1:
            return intra_bw, intra_lat, float("inf"), 0.0
        if self.bw_matrix_gbps is None and self.lat_matrix_us is None:
            bw, lat = self.node_link(nodes[0], nodes[1])  # every node pair alike
            return intra_bw, intra_lat, bw, lat
        links = [self.node_link(a, b) for a in nodes for b in nodes if a != b]
        return intra_bw, intra_lat, min(b for b, _ in links), max(lt for _, lt in links)

    @property
    def precision(self) -> str:
        """The training precision its GPUs compute at (one for the whole cluster: ``at_precision``)."""
        return self.nodes[0].gpu.precision

    def at_precision(self, name: str) -> Cluster:
        """This cluster with every GPU computing at precision ``name``; one-line AutoparError when a GPU
        lacks that precision's peak (the refusal names the GPU's missing field)."""
        if all(nd.gpu.precision == name for nd in self.nodes):
            return self
        nodes = [replace(nd, gpu=replace(nd.gpu, precision=name)) for nd in self.nodes]
        return replace(self, nodes=nodes, meta=dict(self.meta))

    @property
    def memory_margin(self) -> float:
        """The fraction of each GPU's usable memory plans leave free (one for the whole cluster)."""
        return self.nodes[0].gpu.memory_margin

    def with_memory_margin(self, fraction: float) -> Cluster:
        """This cluster with plans keeping ``fraction`` of every GPU's usable memory free: a safety margin for
        what the memory model does not count (allocator fragmentation beyond its terms, a framework's extra
        buffers). One-line AutoparError outside [0, 1)."""
        if all(nd.gpu.memory_margin == fraction for nd in self.nodes):
            return self
        nodes = [replace(nd, gpu=replace(nd.gpu, memory_margin=fraction)) for nd in self.nodes]
        return replace(self, nodes=nodes, meta=dict(self.meta))

    def describe(self) -> str:
        """Short text like ``2x8xA100-80G`` or ``8x3090+8x4090``."""
        if self.name:
            return self.name
        parts: list[str] = []
        for nd in self.nodes:
            parts.append(f"{nd.count}x{nd.gpu.name}")
        return "+".join(parts)

    def to_dict(self) -> dict:
        """Plain data (YAML-ready) that ``cluster_from_doc(d, None, standalone=True)`` reads back equal."""
        d: dict = {
            "name": self.name,
            "nodes": [
                {
                    "gpu": {"name": nd.gpu.name, "memory_gib": nd.gpu.memory_gib, "tflops": nd.gpu.tflops,
                            "hbm_gbps": nd.gpu.hbm_gbps, "nvlink_gbps": nd.gpu.nvlink_gbps,
                            "pcie_gbps": nd.gpu.pcie_gbps, "vendor": nd.gpu.vendor,
                            **{k: getattr(nd.gpu, k) for k in (*PEAK_FIELDS, *MAMF_FIELDS) if getattr(nd.gpu, k)},
                            **({"sustained": nd.gpu.sustained} if nd.gpu.sustained != 1.0 else {}),
                            **({"gddr_ecc": True} if nd.gpu.gddr_ecc else {}),
                            **({"sms": nd.gpu.sms} if nd.gpu.sms else {})},
                    "count": nd.count,
                    "intra_bw_gbps": nd.intra_bw / 1e9,
                    "intra_lat_us": nd.intra_lat_us,
                    "zone": nd.zone,
                    "name": nd.name,
                }
                for nd in self.nodes
            ],
            "inter_bw_gbps": self.inter_bw_gbps,
            "inter_lat_us": self.inter_lat_us,
        }
        if self.bw_matrix_gbps is not None:
            d["bw_matrix_gbps"] = [list(map(float, r)) for r in self.bw_matrix_gbps]
        if self.lat_matrix_us is not None:
            d["lat_matrix_us"] = [list(map(float, r)) for r in self.lat_matrix_us]
        return d
