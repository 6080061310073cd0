"""Per-layer time and memory for a table of strategies inside one stage: the cost model's core.

Both the search (which scores every candidate strategy of a layer at once) and ``estimate_plan``
(which scores the chosen one) call ``layer_costs``, so the number the search optimises is the
number printed for the plan.

Per micro-batch a layer costs ``fwd + bwd`` (compute, TP collectives, ZeRO-3 gathers and per-micro-
batch gradient reduce-scatters, hidden behind compute as far as prefetch allows); once per step it
pays ``step`` (gradient sync not hidden by its own backward, plus the optimizer update). The
pipeline sees ``cost = fwd + bwd + step / m``: every micro-batch carries 1/m of the step-level tail,
which is exact for one stage and keeps the stage cost additive over layers (so dynamic programming
over layers is exact under this model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from autopar.cluster.cluster import Cluster
from autopar.modelspec.spec import LayerSpec
from autopar.plan.schema import Strategy
from cost_models import CostParams
from cost_models import communication as comm
from cost_models.compute import compute_time, memory_bound_time
from cost_models.memory import model_state_bytes

CKPT_CODE = {"none": 0, "selective": 1, "full": 2}


@dataclass(frozen=True)
class GroupLinks:
    """Slowest links of the groups of one kind (TP or DP) in a stage, in SI units."""

    size: int
    n_local: int
    n_nodes: int
    intra_bw: float
    intra_lat: float
    inter_bw: float  # per-rank share of the network bandwidth
    inter_lat: float


@dataclass
class StageContext:
    """What a layer's cost depends on besides its own strategy: the stage it runs in."""

    cluster: Cluster
    devices: tuple[int, ...]
    micro_batch_size: int
    num_microbatches: int
    params: CostParams = field(default_factory=CostParams)

    @property
    def n(self) -> int:
        return len(self.devices)

    @cached_property
    def shape_key(self) -> tuple:
        """Equal for stages whose costs are equal.

        A layer's cost depends on the devices only through which node each belongs to, those nodes'
        GPU and fabric, and the links between those nodes. So the key is the pattern of node
        membership (nodes relabelled in order of appearance), plus, on a cluster whose nodes or
        links differ, each involved node's properties and the links between them.
        """
        c = self.cluster
        relabel: dict[int, int] = {}
        pattern = tuple(relabel.setdefault(c.node_of(d), len(relabel)) for d in self.devices)
        key: tuple = (id(c), pattern, self.micro_batch_size, self.num_microbatches, self.params)
        if not c.is_homogeneous:
            nodes = list(relabel)
            props = tuple((c.nodes[n].gpu, c.nodes[n].intra_bw, c.nodes[n].intra_lat_us) for n in nodes)
            links = tuple(c.node_link(a, b) for a in nodes for b in nodes if a != b)
            key += (props, links)
        return key

    @cached_property
    def peak_flops(self) -> float:
        """The stage runs in lock step, so its slowest device sets the pace."""
        return min(self.cluster.gpu_of(d).flops for d in self.devices)

    @cached_property
    def hbm_bw(self) -> float:
        return min(self.cluster.gpu_of(d).hbm_gbps for d in self.devices) * 1e9

    @cached_property
    def memory_bytes(self) -> float:
        return min(self.cluster.gpu_of(d).memory_bytes for d in self.devices)

    @cached_property
    def ranks_per_node(self) -> int:
        """Most stage devices sharing one node's network interface."""
        return self.cluster.group_layout(list(self.devices))[0]

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
        return self._links_cached("tp", tp)

    def dp_links(self, tp: int) -> GroupLinks:
        return self._links_cached("dp", tp)

    def _links_cached(self, kind: str, tp: int) -> GroupLinks:
        cache = self.__dict__.setdefault("_link_cache", {})
        key = (kind, tp)
        if key not in cache:
            devs = list(self.devices)
            if kind == "tp":
                groups = [devs[i:i + tp] for i in range(0, len(devs), tp)]
            else:
                groups = [devs[j::tp] for j in range(tp)]
            cache[key] = self._links(groups)
        return cache[key]

    @cached_property
    def stage_links(self) -> GroupLinks:
        """The whole stage as one group (activation redistribution between layouts)."""
        return self._links([list(self.devices)])


def _fit(collective: str, g: GroupLinks, p: CostParams | None) -> tuple[float, float] | None:
    """A profile's measured (alpha, beta) for this group: one node and a size the profile covers."""
    return p.measured_comm(collective, g.size) if p is not None and g.n_nodes == 1 and g.size > 1 else None


def _measured(collective: str, nbytes, g: GroupLinks, p: CostParams | None):
    """A profile's measured ``alpha + beta * bytes`` for this group, else None."""
    fit = _fit(collective, g, p)
    if fit is None:
        return None
    b = np.asarray(nbytes, dtype=float)
    return np.where(b > 0, fit[0] + fit[1] * b, 0.0)


def _allreduce(nbytes, g: GroupLinks, p: CostParams | None = None):
    hit = _measured("allreduce", nbytes, g, p)
    if hit is not None:
        return hit
    return comm.hierarchical_allreduce_time(nbytes, g.n_local, g.n_nodes, g.intra_bw, g.intra_lat,
                                            g.inter_bw, g.inter_lat)


def _allgather(nbytes, g: GroupLinks, p: CostParams | None = None, collective: str = "allgather"):
    hit = _measured(collective, nbytes, g, p)
    if hit is not None:
        return hit
    return comm.hierarchical_allgather_time(nbytes, g.n_local, g.n_nodes, g.intra_bw, g.intra_lat,
                                            g.inter_bw, g.inter_lat)


def _reduce_scatter(nbytes, g: GroupLinks, p: CostParams | None = None):
    """Reduce-scatter: the all-gather's wire cost, unless the profile measured it on its own."""
    return _allgather(nbytes, g, p, "reduce_scatter")


def _reduction(nbytes, g: GroupLinks, collective: str, ctx: StageContext):
    """GenModel's gamma term, unless a measured fit of the collective already includes it."""
    if _fit(collective, g, ctx.params) is not None:
        return 0.0
    return comm.reduction_time(nbytes, g.size, ctx.hbm_bw)


@dataclass
class LayerCosts:
    """Arrays over the strategies, all per rank. Times in seconds, memory in bytes."""

    fwd: np.ndarray
    bwd: np.ndarray
    step: np.ndarray
    cost: np.ndarray  # fwd + bwd + step / m: what one micro-batch costs the pipeline
    mem_states: np.ndarray
    mem_act: np.ndarray  # per in-flight micro-batch

    def mem(self, inflight: int) -> np.ndarray:
        return self.mem_states + inflight * self.mem_act


def strategy_arrays(strategies: list[Strategy]) -> tuple[np.ndarray, ...]:
    tp = np.array([s.tp for s in strategies], dtype=float)
    zero = np.array([s.zero for s in strategies])
    ckpt = np.array([CKPT_CODE[s.ckpt] for s in strategies])
    sp = np.array([s.sp for s in strategies], dtype=bool)
    return tp, zero, ckpt, sp


def layer_costs(layer: LayerSpec, strategies: list[Strategy], ctx: StageContext) -> LayerCosts:
    """Time and memory of ``layer`` under each strategy (tp must divide the stage and the micro-batch split).

    Assumes every dp = n / tp divides ``ctx.micro_batch_size`` (the search and validator ensure it).
    """
    p = ctx.params
    tp, zero, ckpt, sp = strategy_arrays(strategies)
    dp = ctx.n / tp
    b_local = ctx.micro_batch_size / dp  # samples per rank per micro-batch

    # Compute: forward FLOPs split over TP; backward is twice forward; recompute per checkpoint mode.
    f_flops = layer.flops * b_local / tp
    recompute = np.select([ckpt == 0, ckpt == 1, ckpt == 2],
                          [0.0, layer.attn_core_flops, layer.flops]) * b_local / tp
    eff_max, overhead = p.eff_max, p.layer_overhead_s
    if p.eff_by_kind:  # measured curves per (kind, tp degree, ZeRO-3 or not)
        curves = [p.efficiency(layer.kind, int(t), int(z) if d > 1 else 0) for t, z, d in zip(tp, zero, dp)]
        eff_max, overhead = np.array([c[0] for c in curves]), np.array([c[1] for c in curves])
    f_comp = compute_time(f_flops, ctx.peak_flops, eff_max, overhead)
    b_comp = 2.0 * f_comp + compute_time(recompute, ctx.peak_flops, eff_max, overhead)

    # TP collectives (Megatron: all-reduces; with SP all-gather + reduce-scatter, the same bytes).
    tp_fwd = np.zeros_like(tp)
    for t in np.unique(tp):
        if t <= 1 or layer.tp_collectives == 0:
            continue
        g = ctx.tp_links(int(t))
        sel = tp == t
        per_coll = layer.tp_comm_bytes * b_local[sel] / layer.tp_collectives
        tp_fwd[sel] = layer.tp_collectives * _allreduce(per_coll, g, p)
        # autopar's runtime keeps unit boundaries at full sequence length, so a sequence-parallel
        # unit gathers its output sequence once more (and reduce-scatters its gradient in backward).
        sp_sel = sel & sp
        if sp_sel.any():
            tp_fwd[sp_sel] += _allgather(layer.boundary_bytes * b_local[sp_sel], g, p)
    tp_bwd = tp_fwd * np.where(ckpt == 2, 2.0, 1.0)  # full recompute repeats the forward collectives

    # Data-parallel traffic over each strategy's DP group.
    shard_params = layer.tp_params / tp + (layer.params - layer.tp_params)
    param_b = shard_params * p.param_bytes
    grad_b = shard_params * p.grad_comm_bytes
    ar = np.zeros_like(tp)
    ag_param = np.zeros_like(tp)
    rs_grad = np.zeros_like(tp)
    for t in np.unique(tp):
        sel = tp == t
        g = ctx.dp_links(int(t))
        ar[sel] = _allreduce(grad_b[sel], g, p)
        ag_param[sel] = _allgather(param_b[sel], g, p)
        rs_grad[sel] = _reduce_scatter(grad_b[sel], g, p)
        ar[sel] += _reduction(grad_b[sel], g, "allreduce", ctx)
        rs_grad[sel] += _reduction(grad_b[sel], g, "reduce_scatter", ctx)

    # Prefetching hides gathers and reduce-scatters behind compute as far as ``overlap_zero3`` allows.
    ov3 = p.overlap_zero3
    fwd_z3 = f_comp + np.maximum(0.0, ag_param - ov3 * f_comp)
    bwd_z3 = b_comp + np.maximum(0.0, ag_param + rs_grad - ov3 * b_comp)
    bwd_z2 = b_comp + np.maximum(0.0, rs_grad - ov3 * b_comp)
    fwd = np.where(zero == 3, fwd_z3, f_comp) + tp_fwd
    bwd = np.select([zero == 3, zero == 2], [bwd_z3, bwd_z2], b_comp) + tp_bwd

    # Step-level: gradient sync left after this layer's last backward, then the optimizer update.
    sync = np.select([zero == 0, zero == 1, zero == 2], [ar, rs_grad + ag_param, ag_param], 0.0)
    exposed = np.maximum(0.0, sync - p.overlap_sync * b_comp)
    owned = np.where(zero >= 1, shard_params / dp, shard_params)
    step = exposed + memory_bound_time(owned * p.opt_bytes_touched, ctx.hbm_bw) + p.step_overhead_per_unit_s

    mem_states = model_state_bytes(shard_params, zero, dp, p.state_bytes, p.param_bytes, p.state_table)
    saved = np.array([layer.saved_bytes(s.ckpt, s.tp, s.sp) for s in strategies], dtype=float)
    mem_act = saved * b_local
    cost = fwd + bwd + step / ctx.num_microbatches
    return LayerCosts(fwd, bwd, step, cost, mem_states, mem_act)


def layout_switch_time(boundary_bytes: float, prev: tuple[int, bool], new: tuple[int, bool],
                       ctx: StageContext) -> float:
    """Per micro-batch cost of re-laying out activations between adjacent layers of one stage.

    A change of (tp, sp) regroups the micro-batch: each rank receives its new share of the
    activation (forward) and sends back the gradient (backward), over the stage's slowest link.
    """
    if prev == new:
        return 0.0
    g = ctx.stage_links
    dp_new = ctx.n / new[0]
    nbytes = boundary_bytes * ctx.micro_batch_size / dp_new
    bw = g.intra_bw if g.n_nodes == 1 else min(g.intra_bw, g.inter_bw)
    lat = g.intra_lat if g.n_nodes == 1 else max(g.intra_lat, g.inter_lat)
    return 2.0 * float(comm.p2p_time(nbytes, bw, lat))


def transient_bytes(layer: LayerSpec, ctx: StageContext) -> float:
    """Working set beyond saved activations while the layer runs, whatever its strategy.

    Room for two unsharded copies of its parameters (ZeRO-3 gather + prefetch, or gradient
    buckets) and for its full activations of one micro-batch share (recompute under checkpointing,
    and the activation gradients of backward). Strategy-independent, so the stage's memory stays
    additive plus a max over its layers.
    """
    p = ctx.params
    return 2.0 * layer.params * p.param_bytes + layer.saved_bytes("none") * ctx.micro_batch_size / ctx.n
