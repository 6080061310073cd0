"""The plans a user would otherwise pick, scored by the same cost model: pure DDP, ZeRO-3/FSDP
everywhere, and the best uniform Megatron-style tp x pp x dp (even layer split, one strategy for all
layers). Each is the fastest member of its family that fits, or None.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.estimate import CostCache, PlanEstimate
from autopar.estimate.plan_cost import estimate_plan_if_faster
from autopar.modelspec.spec import CKPT_MODES, ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.search.options import SearchOptions
from autopar.search.progress import progress_bar
from autopar.search.space import divisors


def even_split(model: ModelSpec, p: int) -> list[list[int]]:
    """Megatron's split: the repeated blocks evenly (earlier stages take the remainder), the first
    stage also takes the units before the blocks and the last stage the units after them."""
    kinds = [ly.kind for ly in model.layers]
    blocks = [i for i, k in enumerate(kinds) if k == "block"] or list(range(model.num_layers))
    first, last = blocks[0], blocks[-1]
    nb = len(blocks)
    if p > nb:
        return []
    sizes = [nb // p + (1 if i < nb % p else 0) for i in range(p)]
    out, start = [], first
    for i, sz in enumerate(sizes):
        idx = list(range(start, start + sz))
        if i == 0:
            idx = list(range(0, first)) + idx
        if i == p - 1:
            idx = idx + list(range(last + 1, model.num_layers))
        out.append(idx)
        start += sz
    return out


def _uniform_stages(model: ModelSpec, cluster: Cluster, p: int, strategy_for) -> list[Stage] | None:
    """The even split over ``p`` stages with ``strategy_for`` on every layer (None: not expressible)."""
    n = cluster.num_devices // p
    split = even_split(model, p)
    if not split:
        return None
    stages = []
    for i, idx in enumerate(split):
        layers = []
        for j in idx:
            s = strategy_for(model.layers[j], n)
            if s is None:
                return None
            layers.append(StageLayer(model.layers[j].name, s))
        stages.append(Stage(list(range(i * n, (i + 1) * n)), layers))
    return stages


def _uniform_plan(model: ModelSpec, B: int, opts: SearchOptions, cluster: Cluster, stages: list[Stage], m: int,
                  name: str) -> Plan:
    pipe = Pipeline(B, B // m, m, stages)
    return Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), cluster, B, [pipe],
                schedule=opts.schedule, memory_budget_gib=opts.memory_budget_gib, search={"baseline": name})


def _ckpt_for(ly, ckpt: str) -> str:
    """``ckpt`` for unit ``ly``; op-level checkpointing where it is modelled (blocks), none elsewhere, as torchtitan."""
    return "none" if ckpt == "op" and ly.op is None else ckpt


def _families(model: ModelSpec, cluster: Cluster, max_tp: int | None = None) -> Iterator[tuple[str, int, object]]:
    N, G = cluster.num_devices, cluster.gpus_per_node
    G = G if max_tp is None else min(G, max_tp)
    for ckpt in CKPT_MODES:
        yield "ddp", 1, (lambda ly, n, c=ckpt: Strategy(1, 0, _ckpt_for(ly, c)))
        yield "zero3", 1, (lambda ly, n, c=ckpt: Strategy(1, 3 if n > 1 else 0, _ckpt_for(ly, c)))
    for p in divisors(N):
        n = N // p
        for t in divisors(min(n, G)):
            if n % t:
                continue
            for zero in (0, 1):
                for ckpt in CKPT_MODES:
                    for sp in ((False, True) if t > 1 else (False,)):
                        def strat(ly, n, t=t, zero=zero, ckpt=ckpt, sp=sp):
                            tt = t if ly.tp_ok(t) and ly.supports_tp else 1
                            if tt == 1 and t > 1 and ly.kind == "block":
                                return None  # Megatron cannot run this TP degree on the blocks
                            z = zero if n // tt > 1 else 0
                            return Strategy(tt, z, _ckpt_for(ly, ckpt), sp and tt > 1)
                        yield "megatron", p, strat


def baselines(model: ModelSpec, cluster: Cluster, B: int, opts: SearchOptions, cache: CostCache | None = None,
              deadline: float | None = None) -> dict[str, tuple[Plan, PlanEstimate] | None]:
    """name -> (plan, estimate) of the fastest fitting member of each family, or None.

    ``cache``: the cost model's memo to score them with (a fresh one by default). ``deadline``
    (``time.perf_counter()`` value): past it, each family keeps the best member scored so far.
    """
    cache = cache if cache is not None else CostCache()
    best: dict[str, tuple[Plan, PlanEstimate] | None] = {"ddp": None, "zero3": None, "megatron": None}
    ms = divisors(B)
    families = list(_families(model, cluster, opts.max_tp))
    bar = progress_bar(len(families), opts.progress, "baselines", "family")
    for name, p, strat in families:
        bar.update(1)
        if deadline is not None and time.perf_counter() > deadline and best[name] is not None:
            continue
        try:
            stages = _uniform_stages(model, cluster, p, strat)  # the same for every m
        except AutoparError:
            continue
        if stages is None:
            continue
        for m in ms:
            if deadline is not None and best[name] is not None and time.perf_counter() > deadline:
                break  # past the deadline a family stops at its first fitting member
            try:
                plan = _uniform_plan(model, B, opts, cluster, stages, m, name)
                if not _divides(plan):
                    continue
                # The family's best so far bounds the plan: one that cannot beat it is not simulated.
                than = best[name][1].step_time_s if best[name] is not None else float("inf")
                est = estimate_plan_if_faster(plan, model, opts.params, cache, than)
            except AutoparError:
                continue
            if est is not None and est.fits and (best[name] is None or est.step_time_s < best[name][1].step_time_s):
                best[name] = (plan, est)
    bar.close()
    for v in best.values():
        if v is not None:
            v[0].predicted = v[1].predicted()
    return best


def _divides(plan: Plan) -> bool:
    pipe = plan.pipelines[0]
    return all(pipe.micro_batch_size % (len(st.devices) // ly.strategy.tp) == 0
               for st in pipe.stages for ly in st.layers)
