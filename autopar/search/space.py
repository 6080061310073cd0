"""The strategy space of one layer in one stage, and the decision-tree pruning rules that shrink it.

Every rule is a member of ``autopar.search.rules.Rule`` with a counter, so ``autopar search --explain``
can say what was dropped and why. Rules that only remove *equivalent* or *dominated* candidates never
change the optimum.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from autopar.estimate import LayerCosts, StageContext, head_excess, layer_costs, transient_bound
from autopar.modelspec.spec import CKPT_MODES, LayerSpec
from autopar.plan.schema import Strategy
from autopar.search.rules import Rule
from autopar.search.zero_variants import zero_variants


def divisors(n: int) -> list[int]:
    """The degrees that divide ``n``, ascending (PP degrees, TP degrees, micro-batch counts).

    Trial division up to sqrt(n): a millisecond for n = 1e7, a fraction of a second for 1e12.
    """
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


@dataclass
class LayerCandidates:
    """The strategies kept for one layer signature in one stage context, with their cost arrays."""

    strategies: list[Strategy]
    costs: LayerCosts
    layouts: np.ndarray  # index into the layout table, per strategy
    transient: float  # transient_bound over every legal strategy (before pruning): what the search reserves


def tp_degrees(ctx: StageContext, pruned: Counter, max_tp: int | None = None) -> list[int]:
    """TP degrees whose groups divide the stage and stay inside nodes, up to ``max_tp`` (SearchOptions.max_tp)."""
    out = []
    degrees = divisors(ctx.n)
    if ctx.n > len(degrees):
        pruned[Rule.TP_NOT_DIVIDING_STAGE] += ctx.n - len(degrees)
    for tp in degrees:
        if max_tp is not None and tp > max_tp:
            pruned[Rule.TP_ABOVE_MAX] += 1
            continue
        if ctx.cluster.memoised(("tp_crosses_node", tp, ctx.group), lambda tp=tp: _crosses_node(ctx, tp)):
            pruned[Rule.TP_CROSSES_NODE] += 1
            continue
        out.append(tp)
    return out


def _crosses_node(ctx: StageContext, tp: int) -> bool:
    """Whether some TP group of degree ``tp`` (consecutive stage devices) spans two nodes."""
    c = ctx.cluster
    nodes = c.memoised(("node_array", ctx.group), lambda: np.array([c.node_of(d) for d in ctx.devices]))
    nodes = nodes.reshape(-1, tp)
    return bool((nodes.min(axis=1) != nodes.max(axis=1)).any())


def ep_degrees(layer: LayerSpec, tp: int, dp: int, pruned: Counter) -> list[int]:
    """Expert-parallel degrees for ``layer`` at (tp, dp): 1, and for an MoE unit with tp 1 every ep > 1 dividing
    both dp and its expert count (``plan.expert_rules``); dense units get [1], so their space is unchanged."""
    if layer.moe is None or dp == 1:
        return [1]
    if tp > 1:
        pruned[Rule.EP_WITH_TP] += 1
        return [1]
    out = [e for e in divisors(dp) if layer.moe.num_experts % e == 0]
    pruned[Rule.EP_NOT_DIVIDING] += len(divisors(dp)) - len(out)
    return out


def enumerate_strategies(layer: LayerSpec, ctx: StageContext, tps: list[int], pruned: Counter) -> list[Strategy]:
    """All (tp, zero, ckpt, sp, async_tp, ep and the ZeRO options) left after the structural rules, in a fixed
    order, every one with the stage's context-parallel degree ``ctx.cp`` (one per pipeline:
    search/context_parallel.py); async TP beside each sp strategy on NVLink GPUs (the dominance rule keeps it
    only where it is faster)."""
    has_attn = layer.attn_core_flops > 0 or layer.act_attn_bytes > 0
    cp = ctx.cp
    out = []
    for tp in tps:
        if tp > 1 and not layer.supports_tp:
            pruned[Rule.TP_UNSUPPORTED] += 1
            continue
        if not layer.tp_ok(tp):
            pruned[Rule.TP_NOT_DIVIDING_UNIT] += 1
            continue
        if (ctx.n // tp) % cp:
            pruned[Rule.CP_NOT_DIVIDING_STAGE] += 1
            continue
        dp = ctx.n // tp // cp
        if ctx.micro_batch_size % dp:
            pruned[Rule.DP_NOT_DIVIDING_MICROBATCH] += 1
            continue
        for zero in (0, 1, 2, 3):
            if dp * cp == 1 and zero > 0:  # ZeRO shards over dp x cp
                pruned[Rule.ZERO_WITHOUT_DP] += 1
                continue
            for ckpt in CKPT_MODES:
                if ckpt == "selective" and not has_attn:
                    pruned[Rule.SELECTIVE_EQUALS_NONE] += 1
                    continue
                if ckpt == "op" and layer.op is None:
                    pruned[Rule.OP_UNMODELLED] += 1
                    continue
                for sp in ((False, True) if tp > 1 else (False,)):
                    if tp > 1 and not sp and (layer.moe is not None or layer.tp_needs_sp):  # plan.rules.layer_rules
                        pruned[Rule.MOE_TP_WITHOUT_SP] += 1
                        continue
                    if sp and layer.act_seq_bytes == 0:
                        pruned[Rule.SP_NO_EFFECT] += 1
                        continue
                    if sp and cp > 1:
                        pruned[Rule.SP_WITH_CP] += 1
                        continue
                    base = Strategy(tp=tp, zero=zero, ckpt=ckpt, sp=sp, cp=cp)
                    out.extend(zero_variants(base, ctx.params, pruned))  # ep > 1 with plain ZeRO (expert_rules)
                    if sp:  # async TP only where SP's collectives exist; kept when it wins (prune_dominated)
                        if async_tp_fabric(ctx):
                            out.extend(zero_variants(replace(base, async_tp=True), ctx.params, pruned))
                        else:
                            pruned[Rule.ASYNC_TP_NO_NVLINK] += 1
                    if cp == 1:  # expert parallel with context parallel is not built (expert_rules)
                        out.extend(replace(base, ep=ep) for ep in ep_degrees(layer, tp, dp, pruned) if ep > 1)
    return out


def async_tp_fabric(ctx: StageContext) -> bool:
    """Whether every device of the stage can run async TP: an NVIDIA GPU with NVLink (symmetric memory)."""
    return ctx.cluster.memoised(("async_tp_fabric", ctx.group), lambda: all(
        g.vendor == "nvidia" and g.nvlink_gbps > 0 for g in {ctx.cluster.gpu_of(d) for d in ctx.devices}))


def prune_dominated(strategies: list[Strategy], costs: LayerCosts, pruned: Counter) -> np.ndarray:
    """Indices of strategies not dominated inside their (tp, sp) layout.

    A dominates B when A's per-micro-batch cost, model-state bytes and activation bytes are all <=
    B's (ties broken by order, so of equal candidates the first stays). Layout-equal strategies pay
    the same switching costs, so dropping B can never lose the optimum.
    """
    n = len(strategies)
    keep = np.ones(n, dtype=bool)
    c, ms, ma = costs.cost, costs.mem_states, costs.mem_act
    layout = [(s.tp, s.sp) for s in strategies]
    eps = 1e-12
    for j in range(n):
        for i in range(n):
            if i == j or not keep[i] or layout[i] != layout[j]:
                continue
            le = c[i] <= c[j] * (1 + eps) and ms[i] <= ms[j] * (1 + eps) and ma[i] <= ma[j] * (1 + eps)
            strict = c[i] < c[j] * (1 - eps) or ms[i] < ms[j] * (1 - eps) or ma[i] < ma[j] * (1 - eps)
            if le and (strict or i < j):
                keep[j] = False
                pruned[Rule.DOMINATED] += 1
                break
    return np.flatnonzero(keep)


def layer_candidates(layer: LayerSpec, ctx: StageContext, tps: list[int], layout_index: dict,
                     pruned: Counter, prune: bool = True) -> LayerCandidates:
    """Strategies of ``layer`` after pruning, scored in ``ctx``. ``layout_index`` maps (tp, sp) -> id."""
    strategies = enumerate_strategies(layer, ctx, tps, pruned)
    if not strategies:
        return LayerCandidates([], LayerCosts(*(np.zeros(0) for _ in range(6))), np.zeros(0, dtype=int), 0.0)
    costs = layer_costs(layer, strategies, ctx)
    excess = head_excess(layer, ctx, strategies)  # a head's strategy-dependent transient: priced, not reserved
    transient = transient_bound(layer, ctx, strategies, excess)
    costs = replace(costs, mem_states=costs.mem_states + excess)
    if prune:
        keep = prune_dominated(strategies, costs, pruned)
        strategies = [strategies[i] for i in keep]
        costs = LayerCosts(*(getattr(costs, f)[keep] for f in ("fwd", "bwd", "step", "cost", "mem_states", "mem_act")))
    layouts = np.array([layout_index.setdefault((s.tp, s.sp), len(layout_index)) for s in strategies], dtype=int)
    return LayerCandidates(strategies, costs, layouts, transient)
