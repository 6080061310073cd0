"""A stage on a cluster as the cost model reads it: devices -> slowest links of its groups, peak, HBM.

``StageContext`` satisfies ``cost_models.layer.Stage``: the adapter between autopar's Cluster and
the cost model's plain numbers. Also here: the link between two stages and a device's memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from autopar.cluster.cluster import GIB, Cluster, GPUType
from cost_models import CostParams
from cost_models.collectives import Collectives, GroupLinks
from cost_models.precision import precision


@dataclass
class StageContext:
    """What a layer's cost depends on besides its own strategy: the stage it runs in."""

    cluster: Cluster
    devices: tuple[int, ...]
    micro_batch_size: int
    num_microbatches: int
    params: CostParams = field(default_factory=CostParams)
    cp: int = 1  # the context-parallel degree the search gives this stage's units (estimates read strategies)
    # The devices of the stage holding the other copy of a tied tensor (tied embeddings: the first stage for the
    # last, the last for the first; ``pipeline_contexts``); empty: this stage holds both (cost_models.ties).
    tie_devices: tuple[int, ...] = ()

    @property
    def n(self) -> int:
        return len(self.devices)

    @cached_property
    def group(self) -> int:
        """The cluster's id of this device group (the key of what the cluster memoises about it)."""
        return self.cluster.intern("devices", self.devices)

    @cached_property
    def shape_key(self) -> tuple:
        """Equal for stages whose costs are equal.

        A layer's cost depends on the devices only through which node each belongs to, those nodes'
        GPU and fabric, and the links between those nodes. So the key is the pattern of node
        membership (nodes relabelled in order of appearance), plus, on a cluster whose nodes or
        links differ, each involved node's properties and the links between them.
        """
        c = self.cluster
        # Interned once per device group: hashing a pattern costs a pass over the stage's devices.
        pattern_id = c.memoised(("pattern_id", self.group), lambda: c.intern("pattern", self._pattern()[0]))
        key: tuple = (id(c), pattern_id, self.micro_batch_size, self.num_microbatches, self.params, self.cp)
        if not c.is_homogeneous:
            nodes = self.nodes
            props = tuple((c.nodes[n].gpu, c.nodes[n].intra_bw, c.nodes[n].intra_lat_us) for n in nodes)
            links = tuple(c.node_link(a, b) for a in nodes for b in nodes if a != b)
            key += (props, links)
        return key

    @cached_property
    def tie_key(self) -> tuple:
        """``shape_key`` for a unit with a tied tensor (``cost_models.ties``), whose cost also depends on where the
        other copy is (``tie_devices``): this stage's and that stage's devices themselves."""
        if not self.tie_devices:
            return self.shape_key
        return self.shape_key + (self.group, self.cluster.intern("devices", self.tie_devices))

    def _pattern(self) -> tuple[tuple[int, ...], list[int]]:
        """Each device's node, relabelled in order of appearance; and those nodes in that order
        (memoised per device group)."""
        return self.cluster.memoised(("pattern", self.group), self._node_pattern)

    def _node_pattern(self) -> tuple[tuple[int, ...], list[int]]:
        relabel: dict[int, int] = {}
        pattern = tuple(relabel.setdefault(self.cluster.node_of(d), len(relabel)) for d in self.devices)
        return pattern, list(relabel)

    @property
    def nodes(self) -> list[int]:
        """The nodes the stage's devices sit on, in order of first appearance."""
        return self._pattern()[1]

    @cached_property
    def peak_flops(self) -> float:
        """The stage runs in lock step, so its slowest device sets the pace."""
        return min(self.cluster.nodes[n].gpu.sustained_flops for n in self.nodes)

    @cached_property
    def attn_peak_flops(self) -> float:
        """What the attention core runs at on the slowest device (differs from ``peak_flops`` under fp8)."""
        return min(self.cluster.nodes[n].gpu.sustained_attn_flops for n in self.nodes)

    @cached_property
    def pace_gpu(self) -> GPUType:
        """The device that sets the pace (``peak_flops``)."""
        return min((self.cluster.nodes[n].gpu for n in self.nodes), key=lambda g: g.sustained_flops)

    @property
    def sms(self) -> int:
        """Streaming multiprocessors of the device that sets the pace; 0: not known."""
        return self.pace_gpu.sms

    @cached_property
    def matmul_ratios(self) -> tuple[float, float]:
        """``GPUType.matmul_ratio`` of the pacing device at its precision's linear-layer and attention columns."""
        g, prec = self.pace_gpu, precision(self.pace_gpu.precision)
        return g.matmul_ratio(prec.peak), g.matmul_ratio(prec.attn_peak)

    @cached_property
    def hbm_bw(self) -> float:
        return min(self.cluster.nodes[n].gpu.hbm_bw for n in self.nodes)

    @cached_property
    def collectives(self) -> Collectives:
        """How this stage's groups run collectives (measured fit or formula; gamma at its slowest HBM)."""
        return Collectives(self.params, self.hbm_bw)

    @cached_property
    def ranks_per_node(self) -> int:
        """Most stage devices sharing one node's network interface."""
        return self.cluster.memoised(("ranks_per_node", self.group),
                                     lambda: self.cluster.group_layout(list(self.devices))[0])

    def _links(self, groups: list[list[int]]) -> GroupLinks:
        worst = None
        for g in groups:
            n_local, n_nodes = self.cluster.group_layout(g)
            ibw, ilat, xbw, xlat = self.cluster.group_links(g)
            cand = GroupLinks(len(g), n_local, n_nodes, ibw, ilat, xbw / self.ranks_per_node, xlat)
            if worst is None or (cand.n_nodes, -cand.inter_bw, -cand.intra_bw) > (
                    worst.n_nodes, -worst.inter_bw, -worst.intra_bw):
                worst = cand
        return worst

    def tp_links(self, tp: int) -> GroupLinks:
        """The worst TP group of degree ``tp`` (consecutive devices)."""
        return self._links_cached("tp", tp)

    def dp_links(self, tp: int) -> GroupLinks:
        """The worst data-parallel group beside TP groups of degree ``tp`` (strided devices)."""
        return self._links_cached("dp", tp)

    def cp_links(self, tp: int, cp: int) -> GroupLinks:
        """The worst context-parallel group: devices ``tp`` apart inside each run of ``tp * cp``
        consecutive devices (one data-parallel replica; autopar/plan/cp_rules.py)."""
        def compute() -> GroupLinks:
            devs, w = list(self.devices), tp * cp
            return self._links([devs[b + j:b + w:tp] for b in range(0, len(devs), w) for j in range(tp)])

        return self.cluster.memoised(("cp", tp, cp, self.group), compute)

    def _links_cached(self, kind: str, tp: int) -> GroupLinks:
        def compute() -> GroupLinks:
            devs = list(self.devices)
            if kind == "tp":
                return self._links([devs[i:i + tp] for i in range(0, len(devs), tp)])
            return self._links([devs[j::tp] for j in range(tp)])

        return self.cluster.memoised((kind, tp, self.group), compute)

    @cached_property
    def stage_links(self) -> GroupLinks:
        """The whole stage as one group (activation redistribution between layouts)."""
        return self.cluster.memoised(("stage", self.group), lambda: self._links([list(self.devices)]))

    @property
    def tie_apart(self) -> bool:
        """Whether the other copy of a tied tensor sits on another stage (``tie_devices``)."""
        return bool(self.tie_devices)

    def tie_links(self) -> GroupLinks:
        """Every rank holding either copy of a tied tensor (this stage and ``tie_devices``) as one group."""
        if not self.tie_devices:
            return self.stage_links
        holders = sorted(set(self.devices) | set(self.tie_devices))
        return self.cluster.memoised(("tie", self.group, tuple(self.tie_devices)), lambda: self._links([holders]))

    def tie_pair_links(self) -> GroupLinks:
        """Each device of this stage with the device at the same position of ``tie_devices`` (the worst such
        pair, the network shared as by every rank of the stage at once); the stage itself without them."""
        if not self.tie_devices:
            return self.stage_links
        pairs = [[a, b] for a, b in zip(self.devices, self.tie_devices)]
        return self.cluster.memoised(("tie_pairs", self.group, tuple(self.tie_devices)), lambda: self._links(pairs))


def tie_partner(stage: int, stages: int) -> int | None:
    """The stage holding the other copy of a tied tensor for stage ``stage`` of ``stages``: the first and the
    last stage, where tied embeddings' two copies sit, name each other; None for the others and a lone stage."""
    if stages < 2 or 0 < stage < stages - 1:
        return None
    return stages - 1 if stage == 0 else 0


def pipeline_contexts(cluster: Cluster, stages: list[tuple[int, ...]], micro_batch_size: int, num_microbatches: int,
                      params: CostParams) -> list[StageContext]:
    """The contexts of one pipeline's stages (devices in stage order), each naming its ``tie_partner``'s devices
    (``tie_devices``)."""
    out = []
    for i, devs in enumerate(stages):
        partner = tie_partner(i, len(stages))
        out.append(StageContext(cluster, tuple(devs), micro_batch_size, num_microbatches, params,
                                tie_devices=() if partner is None else tuple(stages[partner])))
    return out


def stage_contexts(pipe: object, cluster: Cluster, params: CostParams) -> list[StageContext]:
    """A plan pipeline's context per physical stage (``pipeline_contexts`` of ``pipe.physical_stages``: every
    stage of a pipeline without interleaving)."""
    return pipeline_contexts(cluster, [tuple(st.devices) for st in pipe.physical_stages], pipe.micro_batch_size,
                             pipe.num_microbatches, params)


def chunk_contexts(pipe: object, cluster: Cluster, params: CostParams) -> list[StageContext]:
    """A plan pipeline's context per entry of ``pipe.stages`` (chunk g of an interleaved pipeline runs on
    physical stage g mod p): ``stage_contexts``."""
    phys = stage_contexts(pipe, cluster, params)
    return [phys[g % len(phys)] for g in range(len(pipe.stages))]


def context_link(src: StageContext, dst: StageContext) -> tuple[float, float]:
    """``stage_link`` between two stages' devices, memoised per pair of device groups."""
    return src.cluster.memoised(("stage_link", src.group, dst.group),
                                lambda: stage_link(src.cluster, src.devices, dst.devices))


def stage_link(cluster: Cluster, src_devices: list[int], dst_devices: list[int]) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of a transfer between two stages: the slowest link between them,
    times the lanes that carry it at once. Two stages on disjoint sets of nodes send over
    min(source nodes, destination nodes) node links in parallel (each device sends its own rows, as
    Megatron's pipeline sends each rank's shard: a 64-node stage feeding the next 64 nodes moves a
    micro-batch over 64 node links, not one); stages sharing a node are charged the one slowest link."""
    src_nodes = set(cluster.nodes_of(src_devices))
    dst_nodes = set(cluster.nodes_of(dst_devices))
    if cluster.bw_matrix_gbps is None and cluster.lat_matrix_us is None:  # every node pair alike
        a, b = min(src_nodes), max(dst_nodes)
        pair = (a, b) if a != b else (max(src_nodes), min(dst_nodes))
        links = [cluster.node_link(*pair)] if pair[0] != pair[1] else []
    else:
        links = [cluster.node_link(a, b) for a in src_nodes for b in dst_nodes if a != b]
    shared = src_nodes & dst_nodes
    for nd in shared:
        links.append((cluster.nodes[nd].intra_bw, cluster.nodes[nd].intra_lat_us * 1e-6))
    bw, lat = min(links, key=lambda x: (x[0], -x[1]))
    lanes = 1 if shared else min(len(src_nodes), len(dst_nodes))
    return bw * lanes, lat


def device_budget_bytes(cluster: Cluster, device: int, memory_budget_gib: float | None) -> float:
    """``Cluster.budget_gib`` in bytes: what a device may hold, its memory or the user's cap when smaller."""
    return cluster.budget_gib(device, memory_budget_gib) * GIB
