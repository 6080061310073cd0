"""Per-layer time and memory for a table of strategies inside one stage: the cost model's core.

Both the search (which scores every candidate strategy of a layer at once) and the plan estimate
(which scores the chosen one) call ``layer_costs``, so the number the search optimises is the
number printed for the plan.

Per micro-batch a layer costs ``fwd + bwd`` (compute, TP collectives, ZeRO-3 gathers and per-micro-
batch gradient reduce-scatters, hidden behind compute as far as prefetch allows); once per step it
pays ``step`` (gradient sync not hidden by its own backward, plus the optimizer update). The
pipeline sees ``cost = fwd + bwd + step / m``: every micro-batch carries 1/m of the step-level tail,
which is exact for one stage and keeps the stage cost additive over layers (so dynamic programming
over layers is exact under this model).

The terms are separate functions (``compute_times``, ``activation_traffic_times``, ``tp_comm_times``,
``dp_comm_times``, ``zero_options.zero_exposed``) so that the profiler can take off a measured layer time exactly what this adds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from cost_models import communication as comm
from cost_models import moe as expert_parallel
from cost_models.async_tp import async_tp_layer
from cost_models.collectives import Collectives, GroupLinks
from cost_models.compute import activation_traffic_times, compute_time, linear_efficiency, memory_bound_time
from cost_models.context_parallel import cp_array, cp_comm_times, cp_kept_bytes
from cost_models.gemm_shapes import fixed_depth, wave_times
from cost_models.memory import model_state_bytes
from cost_models.params import CostParams
from cost_models.ties import held_params, tie_sync_times
from cost_models.tp_backward import async_backward
from cost_models.zero_options import (
    gathered_bytes,
    no_reshard_backward,
    option_arrays,
    overlapped_sync,
    zero3_floors,
    zero3_times,
    zero_exposed,
)

CKPT_CODE = {"none": 0, "selective": 1, "full": 2, "op": 3}
CKPT_NAME = {code: name for name, code in CKPT_CODE.items()}
# Backward's TP collectives as a multiple of forward's: full recomputation reruns the forward's; op-level selective
# checkpointing (torchtitan's policy) saves reduce-scatter outputs but no all-reduce or all-gather, so it reruns what full
# does without SP and the all-gather half with SP (autopar's runtime: tests/runtime/test_op_checkpoint_collectives.py).
TP_BWD_FACTOR = {"none": (1.0, 1.0), "selective": (1.0, 1.0), "full": (2.0, 2.0), "op": (2.0, 1.5)}  # (no sp, sp)


class Layer(Protocol):
    """A layer unit as the cost model reads it (autopar's ``LayerSpec`` is one): per-sample figures."""

    @property
    def kind(self) -> str: ...
    @property
    def params(self) -> int: ...
    @property
    def tp_params(self) -> int: ...  # the part of params TP shards (tp_local_params, optional: tp_local_grad_sum)
    @property
    def flops(self) -> float: ...  # forward FLOPs per sample
    @property
    def boundary_bytes(self) -> float: ...  # the unit's output per sample
    @property
    def tp_comm_bytes(self) -> float: ...  # all-reduced over the TP group per sample per forward
    @property
    def tp_collectives(self) -> int: ...  # TP collectives per forward

    def saved_bytes(self, ckpt: str, tp: int = 1, sp: bool = False, input_share: float = 1.0) -> float:
        """Activation bytes per sample kept for backward under (ckpt, tp, sp), linear inputs at ``input_share``."""

    def recompute_flops(self, ckpt: str) -> float:
        """Forward FLOPs per sample (tp 1) that backward reruns under ``ckpt``."""


class Strategy(Protocol):
    """One layer's parallel strategy (autopar's ``plan.schema.Strategy`` is one)."""

    @property
    def tp(self) -> int: ...
    @property
    def zero(self) -> int: ...
    @property
    def ckpt(self) -> str: ...  # none | selective | full | op
    @property
    def sp(self) -> bool: ...


class Stage(Protocol):
    """What a layer's cost depends on besides its own strategy (autopar's ``StageContext`` is one)."""

    @property
    def n(self) -> int: ...  # devices
    @property
    def micro_batch_size(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...
    @property
    def params(self) -> CostParams: ...
    @property
    def peak_flops(self) -> float: ...  # of the slowest device (the stage runs in lock step)
    @property
    def attn_peak_flops(self) -> float: ...  # what its attention core runs at (the bf16 peak under fp8)
    @property
    def sms(self) -> int: ...  # streaming multiprocessors of that device (0: not known; cost_models.gemm_shapes)
    @property
    def matmul_ratios(self) -> tuple[float, float]: ...  # its linear layers' and attention core's GPUType.matmul_ratio
    @property
    def hbm_bw(self) -> float: ...
    @property
    def collectives(self) -> Collectives: ...
    @property
    def stage_links(self) -> GroupLinks: ...  # the whole stage as one group
    @property
    def tie_apart(self) -> bool: ...  # the other copy of a tied tensor is on another stage (cost_models.ties)
    def tie_links(self) -> GroupLinks: ...  # every rank holding either copy of a tied tensor, as one group
    def tie_pair_links(self) -> GroupLinks: ...  # each rank with its counterpart on that stage (the worst pair)

    def tp_links(self, tp: int) -> GroupLinks:
        """The worst TP group of degree ``tp`` (consecutive devices)."""

    def dp_links(self, tp: int) -> GroupLinks:
        """The worst data-parallel group beside TP groups of degree ``tp`` (strided devices)."""

    def cp_links(self, tp: int, cp: int) -> GroupLinks:
        """The worst context-parallel group (stride ``tp`` inside ``tp * cp`` consecutive devices)."""


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
        """Bytes per rank with ``inflight`` micro-batches' activations held."""
        return self.mem_states + inflight * self.mem_act


class LayerCost(NamedTuple):
    """``LayerCosts`` of a single strategy, as floats."""

    cost: float
    fwd: float
    bwd: float
    step: float
    mem_states: float
    mem_act: float


def strategy_arrays(strategies: list[Strategy]) -> tuple[np.ndarray, ...]:
    """(tp as float, zero, ckpt code, sp) arrays over ``strategies``."""
    tp = np.array([s.tp for s in strategies], dtype=float)
    zero = np.array([s.zero for s in strategies])
    ckpt = np.array([CKPT_CODE[s.ckpt] for s in strategies])
    sp = np.array([s.sp for s in strategies], dtype=bool)
    return tp, zero, ckpt, sp


def per_ckpt(of_mode: Callable[[str], float], ckpt: np.ndarray) -> np.ndarray:
    """``of_mode(mode)`` for each strategy's checkpoint code, asked once per mode present."""
    table = np.zeros(len(CKPT_CODE))
    for c in np.unique(ckpt):
        table[c] = of_mode(CKPT_NAME[int(c)])
    return table[ckpt]


def compute_times(layer: Layer, tp: np.ndarray, zero: np.ndarray, ckpt: np.ndarray, dp: np.ndarray,
                  b_local: np.ndarray, peak_flops: float, p: CostParams,
                  attn_peak_flops: float | None = None, sms: int = 0,
                  ratios: tuple[float, float] = (1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) compute seconds of one micro-batch of ``b_local`` samples per rank.

    Forward FLOPs split over TP; backward is twice forward plus the recomputation its checkpoint
    mode asks for; measured curves per (kind, tp degree, ZeRO-3 or not) where the profile has them.
    On a device of ``sms`` SMs, the layer's matmuls (``gemms``) also pay for the tiles and waves
    their per-rank shapes leave idle (``cost_models.gemm_shapes``), unless a measured curve of the
    layer's kind already times them. ``ratios``: the linear layers' and the attention core's
    ``matmul_ratio`` (``Stage``), which move ``eff_max`` by ``compute.layer_efficiency``
    (``compute.linear_efficiency``: a measured curve is its precision's own).
    """
    f_flops = layer.flops * b_local / tp
    recompute = per_ckpt(layer.recompute_flops, ckpt) * b_local / tp
    eff_max, overhead = p.eff_max, p.layer_overhead_s
    if p.eff_by_kind:
        curves = [p.efficiency(layer.kind, int(t), int(z) if d > 1 else 0) for t, z, d in zip(tp, zero, dp)]
        eff_max, overhead = np.array([c[0] for c in curves]), np.array([c[1] for c in curves])
    lin_eff, attn_eff = (linear_efficiency(eff_max, r, p, layer.kind) for r in ratios)
    rate = peak_flops * lin_eff
    rate_f = rate_r = rate
    if layer.flops > 0 and ((attn_peak_flops is not None and attn_peak_flops != peak_flops) or ratios[1] != ratios[0]):
        # the linear layers at ``rate``, the attention core at its own: one call's time is
        # sum(F_part / rate_part), i.e. its FLOPs at the harmonic mix of the two rates
        attn = (peak_flops if attn_peak_flops is None else attn_peak_flops) * attn_eff
        a = layer.attn_core_flops / layer.flops
        rate_f = 1.0 / ((1.0 - a) / rate + a / attn)
        rate_r = np.select([ckpt == CKPT_CODE["selective"]], [attn], rate_f)  # reruns the attention core
    f_comp = compute_time(f_flops, rate_f, 1.0, overhead)
    b_comp = 2.0 * f_comp + compute_time(recompute, rate_r, 1.0, overhead)
    if sms > 0 and getattr(layer, "gemms", ()) and not p.has_curve(layer.kind):
        rec_gemm = per_ckpt(layer.recompute_gemm_flops, ckpt)
        w_fwd, w_bwd = wave_times(layer.gemms, layer.gemm_rows, tp, b_local, rec_gemm, sms, rate,
                                  fixed_depth(peak_flops, sms))
        f_comp, b_comp = f_comp + w_fwd, b_comp + w_bwd
    return f_comp, b_comp


def tp_comm_times(layer: Layer, tp: np.ndarray, sp: np.ndarray, ckpt: np.ndarray, b_local: np.ndarray,
                  tp_links: Callable[[int], GroupLinks], coll: Collectives,
                  boundary: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of TP collectives of one micro-batch, per strategy.

    Megatron: ``tp_collectives`` all-reduces of the activations per forward (with SP an all-gather
    and a reduce-scatter of the same bytes, priced alike); backward repeats them, plus what its
    checkpoint mode's recomputation reruns (``TP_BWD_FACTOR``). ``boundary``: SP boundary all-gathers per
    forward (``CostParams.tp_boundary_gather``).
    """
    tp_fwd = np.zeros_like(tp)
    for t in np.unique(tp):
        if t <= 1 or layer.tp_collectives == 0:
            continue
        g = tp_links(int(t))
        sel = tp == t
        per_coll = layer.tp_comm_bytes * b_local[sel] / layer.tp_collectives
        tp_fwd[sel] = layer.tp_collectives * coll.time("allreduce", per_coll, g)
        # autopar's runtime keeps unit boundaries at full sequence length, so a sequence-parallel unit gathers its
        # output sequence once more (and reduce-scatters its gradient in backward); Megatron's stays sharded (boundary 0).
        sp_sel = sel & sp
        if sp_sel.any():
            tp_fwd[sp_sel] += boundary * coll.time("allgather", layer.boundary_bytes * b_local[sp_sel], g)
    factor = np.array([TP_BWD_FACTOR[CKPT_NAME[c]][int(s)] for c, s in zip(ckpt, sp)], dtype=float)
    tp_bwd = tp_fwd * factor
    return tp_fwd, tp_bwd


def shard_params(layer: Layer, tp: np.ndarray, held: float = 0.0) -> np.ndarray:
    """Parameters one rank of a TP group holds: its share of the TP-sharded ones (and of the ``held`` copy of
    an earlier unit's tensors, ``cost_models.ties``) plus the replicated rest."""
    return (layer.tp_params + held) / tp + (layer.params - layer.tp_params)


def dp_comm_times(layer: Layer, tp: np.ndarray, dp_links: Callable[[int], GroupLinks], coll: Collectives,
                  p: CostParams, held: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gradient all-reduce, parameter all-gather, gradient reduce-scatter) over each strategy's DP group.

    Gradients travel at ``grad_comm_bytes`` per element and are reduced (gamma term unless measured);
    parameters are gathered at ``param_bytes``.
    """
    shard = shard_params(layer, tp, held)
    param_b = shard * p.param_bytes
    grad_b = shard * p.grad_comm_bytes
    ar = np.zeros_like(tp)
    ag_param = np.zeros_like(tp)
    rs_grad = np.zeros_like(tp)
    for t in np.unique(tp):
        sel = tp == t
        g = dp_links(int(t))
        ar[sel] = coll.reduced("allreduce", grad_b[sel], g)
        ag_param[sel] = coll.time("allgather", param_b[sel], g)
        rs_grad[sel] = coll.reduced("reduce_scatter", grad_b[sel], g)
    return ar, ag_param, rs_grad


def tp_local_grad_sum(layer: Layer, tp: np.ndarray, zero: np.ndarray, dp: np.ndarray,
                      tp_links: Callable[[int], GroupLinks], coll: Collectives, p: CostParams) -> np.ndarray:
    """Seconds per step to sum over TP the gradients of the unit's per-token sublayers kept whole on every rank
    (``tp_local_params``: an MoE family's router and experts in autopar's runtime, each rank running its own tokens
    under sequence parallelism): an all-reduce over the TP group, of the rank's ZeRO-3 shard (FSDP reduce-scatters
    over DP first), else of the whole gradient, beside the DP sync ``dp_comm_times`` prices."""
    local = float(getattr(layer, "tp_local_params", 0))
    out = np.zeros_like(tp, dtype=float)
    if local <= 0:
        return out
    for t in np.unique(tp):
        if t > 1:
            sel = tp == t
            nbytes = local * p.grad_comm_bytes / np.where(zero[sel] == 3, dp[sel], 1.0)
            out[sel] = coll.reduced("allreduce", nbytes, tp_links(int(t)))
    return out


def layer_costs(layer: Layer, strategies: list[Strategy], stage: Stage) -> LayerCosts:
    """Time and memory of ``layer`` under each strategy (tp must divide the stage and the micro-batch split).

    Assumes every dp = n / tp divides ``stage.micro_batch_size`` (the search and validator ensure it).
    With context parallel c (cost_models/context_parallel.py) ``dp`` is dp x c and ``b_local`` the
    rank's tokens in samples (mbs t / n, fractional when c exceeds the samples).
    """
    p = stage.params
    coll = stage.collectives
    tp, zero, ckpt, sp = strategy_arrays(strategies)
    dp = stage.n / tp
    b_local = stage.micro_batch_size / dp  # samples per rank per micro-batch

    f_comp, b_comp = compute_times(layer, tp, zero, ckpt, dp, b_local, stage.peak_flops, p, stage.attn_peak_flops,
                                   stage.sms, stage.matmul_ratios)
    saved = np.array([layer.saved_bytes(s.ckpt, s.tp, s.sp, p.linear_input_share) for s in strategies], dtype=float)
    if p.act_traffic > 0:
        saved_none = np.array([layer.saved_bytes("none", s.tp, s.sp, p.linear_input_share) for s in strategies])
        m_fwd, m_bwd = activation_traffic_times(saved_none, saved, ckpt, b_local, stage.hbm_bw, p)
        f_comp, b_comp = f_comp + m_fwd, b_comp + m_bwd
    tp_fwd, tp_bwd = tp_comm_times(layer, tp, sp, ckpt, b_local, stage.tp_links, coll, p.tp_boundary_gather)
    atp = np.array([getattr(s, "async_tp", False) for s in strategies], dtype=bool) & sp & (tp > 1)
    tp_bwd = np.where(atp, tp_bwd, async_backward(layer, tp_fwd, tp_bwd, sp, f_comp, p.tp_async_backward))  # async TP: own
    if atp.any():  # async TP: SP's collectives overlapped with the matmuls they feed (cost_models/async_tp.py)
        tp_fwd, tp_bwd = async_tp_layer(layer, stage, atp, tp, b_local, tp_fwd, tp_bwd)
    held = held_params(layer, stage, p)  # its copy of an earlier unit's tensors (tied embeddings), if it keeps one
    ar, ag_param, rs_grad = dp_comm_times(layer, tp, stage.dp_links, coll, p, held)
    shard = shard_params(layer, tp, held)
    floors = zero3_floors(shard, dp, p)  # a framework's own bound on its ZeRO-3 traffic, where one is stated
    z_fwd, z_bwd = zero_exposed(f_comp, b_comp, ag_param, rs_grad, zero, p.overlap_zero3, p.zero3_comm_eff, floors)
    reshard, overlap = option_arrays(strategies)  # ZeRO-3 reshard: false, ZeRO-1/2 zero_overlap (zero_options)
    rs3 = zero3_times(ag_param, rs_grad, p.zero3_comm_eff, floors)[1]  # what a reshard: false unit pays in backward
    z_bwd = no_reshard_backward(z_bwd, b_comp, rs3, zero, reshard, p.overlap_zero3)
    fwd = (f_comp + z_fwd) + tp_fwd
    bwd = (b_comp + z_bwd) + tp_bwd
    if p.grad_accum_bytes > 0:  # the framework's per-micro-batch gradient accumulation pass over the rank's parameters
        bwd = bwd + memory_bound_time(shard * p.grad_accum_bytes, stage.hbm_bw)
    cp = cp_array(strategies)  # context parallel: dp above is dp x cp, b_local per rank's tokens
    if (cp > 1).any():
        cp_fwd, cp_bwd = cp_comm_times(layer, tp, cp, ckpt, b_local, stage.cp_links, coll)
        fwd, bwd = fwd + cp_fwd, bwd + cp_bwd
        saved = saved + cp_kept_bytes(layer, tp, cp, ckpt)

    # Step-level: gradient sync left after this layer's last backward, then the optimizer update.
    sync = np.select([zero == 0, zero == 1, zero == 2], [ar, rs_grad + ag_param, ag_param], 0.0)
    sync = sync + tp_local_grad_sum(layer, tp, zero, dp, stage.tp_links, coll, p)
    exposed = np.maximum(0.0, sync - p.overlap_sync * b_comp)
    exposed = overlapped_sync(exposed, f_comp, b_comp, ag_param, rs_grad, zero, overlap, p)
    owned = np.where(zero >= 1, shard / dp, shard)
    step = exposed + memory_bound_time(owned * p.opt_bytes_touched, stage.hbm_bw) + p.step_overhead_per_unit_s
    step = step + tie_sync_times(layer, tp, zero, stage, coll, p)  # tied copies' gradients summed (cost_models.ties)

    mem_states = model_state_bytes(shard, zero, dp, p.state_bytes, p.param_bytes, p.state_table, p.grad_bytes)
    mem_states = mem_states + gathered_bytes(shard, dp, zero, reshard, p.param_bytes)
    mem_act = saved * b_local * p.act_mem_factor
    cost = fwd + bwd + step / stage.num_microbatches
    if getattr(layer, "moe", None) is not None and any(getattr(s, "ep", 1) > 1 for s in strategies):
        base = LayerCosts(fwd, bwd, step, cost, mem_states, mem_act)  # ep > 1 rows re-priced by cost_models.moe
        return LayerCosts(**expert_parallel.expert_parallel_costs(layer, strategies, stage, base, sys.modules[__name__]))
    return LayerCosts(fwd, bwd, step, cost, mem_states, mem_act)


def one_layer_cost(layer: Layer, strategy: Strategy, stage: Stage) -> LayerCost:
    """``layer_costs`` of one strategy, as floats."""
    lc = layer_costs(layer, [strategy], stage)
    return LayerCost(float(lc.cost[0]), float(lc.fwd[0]), float(lc.bwd[0]), float(lc.step[0]),
                     float(lc.mem_states[0]), float(lc.mem_act[0]))


def layout_switch_time(boundary_bytes: float, prev: tuple[int, bool], new: tuple[int, bool], stage: Stage) -> float:
    """Per micro-batch cost of re-laying out activations between adjacent layers of one stage.

    A change of (tp, sp) regroups the micro-batch: each rank receives its new share of the
    activation (forward) and sends back the gradient (backward), over the stage's slowest link.
    """
    if prev == new:
        return 0.0
    dp_new = stage.n / new[0]
    nbytes = boundary_bytes * stage.micro_batch_size / dp_new
    bw, lat = stage.stage_links.slowest
    return 2.0 * float(comm.p2p_time(nbytes, bw, lat))
