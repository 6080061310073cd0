"""The closest plan a target can express, built as a real Plan, validated and estimated with the same cost model.

``project`` maps each feature of the plan to the nearest value the target takes (the TP degree, ZeRO
level and checkpoint mode covering the most parameters; the plan's own layer split, pipeline depth and
micro-batching where they are expressible). When that projection is valid and fits in memory it is the
answer: nothing else moves. Otherwise ``closest`` scores the target's whole uniform space (pipeline
depth, TP, ZeRO, checkpointing, micro-batches, and for MoE models the expert-parallel degree) and keeps the fastest plan that is valid and fits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from autopar.errors import AutoparError
from autopar.estimate import CostCache, PlanEstimate, estimate_plan
from autopar.export.caps import Caps
from autopar.export.options import option_pairs, sharding_options
from autopar.export.shape import Shape, build_plan, even_split, recomputed, weighted_choice
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from autopar.plan.validate import plan_problems
from cost_models import CostParams

# When a mode is not expressible: the nearest ones first (by what they keep and recompute).
NEAREST_CKPT = {"none": ("none", "op", "selective", "full"), "selective": ("selective", "op", "none", "full"),
                "op": ("op", "selective", "none", "full"), "full": ("full", "op", "selective", "none")}
NEAREST_ZERO = {0: (0, 1, 2, 3), 1: (1, 2, 0, 3), 2: (2, 1, 3, 0), 3: (3, 2, 1, 0)}


@dataclass
class Candidate:
    """A shape, its plan and estimate (``problem``: why it cannot be used, empty when it can)."""

    shape: Shape
    plan: Plan | None
    estimate: PlanEstimate | None
    problem: str = ""


def _first(prefs: tuple, allowed: tuple):
    return next(v for v in prefs if v in allowed)


def _tp_options(caps: Caps, pp: int, n: int, model: ModelSpec, cp: int = 1) -> list[int]:
    """TP degrees the target takes on stages of ``n`` devices (``cp`` of them per TP rank) that every block accepts."""
    if not caps.tp or (pp > 1 and not caps.tp_with_pp):
        return [1] if n % cp == 0 else []
    blocks = [ly for ly in model.layers if recomputed(ly, model)]
    return [t for t in range(1, n + 1) if n % (t * cp) == 0 and all(ly.tp_ok(t) for ly in blocks)]


def _ep_options(caps: Caps, model: ModelSpec, tp: int, zero: int, dp: int) -> list[int]:
    """Expert-parallel degrees the target runs here: 1, and for an MoE model with tp 1 and a ZeRO level the
    target runs expert parallelism with, the degrees dividing dp and every MoE unit's expert count."""
    experts = {ly.moe.num_experts for ly in model.layers if ly.moe is not None}
    if not experts or tp > 1 or zero not in caps.ep_zero:
        return [1]
    return [e for e in range(1, dp + 1) if dp % e == 0 and all(x % e == 0 for x in experts)]


def _split_for(caps: Caps, plan: Plan, model: ModelSpec, pp: int):
    """The plan's own split when the target takes any split and the plan has one pipeline of ``pp`` stages."""
    if caps.split == "any" and len(plan.pipelines) == 1 and len(plan.pipelines[0].stages) == pp:
        index = {ly.name: i for i, ly in enumerate(model.layers)}
        return tuple(tuple(index[ly.name] for ly in st.layers) for st in plan.pipelines[0].stages)
    return even_split(model, pp)


def _sp(caps: Caps, tp: int, wanted: bool) -> bool:
    return tp > 1 and (caps.sp == "always" or (caps.sp == "free" and wanted))


def project(plan: Plan, model: ModelSpec, caps: Caps) -> Shape | None:
    """The target's shape nearest to ``plan`` feature by feature (None: no shape of its depth exists)."""
    world = plan.world_size
    depths = [len(p.stages) for p in plan.pipelines]
    pp = max(set(depths), key=lambda d: (depths.count(d), d)) if caps.pp else 1
    replicas = len(plan.pipelines) if caps.replicas and len(set(map(len, (p.devices for p in plan.pipelines)))) == 1 \
        and len(set(depths)) == 1 else 1
    if world % (replicas * pp) or plan.global_batch_size % replicas:
        replicas = 1
    if world % pp:
        return None
    n = world // (replicas * pp)
    cp = (weighted_choice(plan, model, lambda s: s.cp) or 1) if caps.cp else 1  # one per pipeline in a plan
    tps = _tp_options(caps, pp, n, model, cp)
    if not tps:
        return None
    want_tp = weighted_choice(plan, model, lambda s: s.tp, blocks_only=True) or 1
    tp = min(tps, key=lambda t: (abs(t - want_tp), -t))
    want_ep = max((ly.strategy.ep for st in plan.stages for ly in st.layers), default=1)  # 1 on every dense unit
    order = NEAREST_ZERO[weighted_choice(plan, model, lambda s: s.zero) or 0]
    with_ep = [z for z in order if z in caps.ep_zero and z in caps.zero_levels(pp)]
    # an expert-parallel plan keeps its experts split where the target can: the nearest ZeRO level it runs EP with
    zero = with_ep[0] if want_ep > 1 and with_ep else _first(order, caps.zero_levels(pp))
    ckpt = _first(NEAREST_CKPT[weighted_choice(plan, model, lambda s: s.ckpt, blocks_only=True) or "none"], caps.ckpt)
    sp = _sp(caps, tp, bool(weighted_choice(plan, model, lambda s: s.sp, blocks_only=True))) and cp == 1
    atp = caps.async_tp and sp and bool(weighted_choice(plan, model, lambda s: s.async_tp, blocks_only=True))
    split = _split_for(caps, plan, model, pp)
    if split is None:
        return None
    ms = _microbatch_options(plan.global_batch_size, replicas, n // (tp * cp))
    if not ms:
        return None
    want_m = plan.pipelines[0].num_microbatches
    m = min(ms, key=lambda k: (abs(k - want_m), k))
    ep = min(_ep_options(caps, model, tp, zero, n // tp), key=lambda e: (abs(e - want_ep), -e))
    # expert parallel runs with plain ZeRO (plan.expert_rules): no reshard / overlap option beside it
    reshard, overlap = sharding_options(plan, model, caps, zero) if ep == 1 else (True, False)
    return Shape(pp, tp, zero, ckpt, sp, m, split, replicas, _schedule(caps, plan, pp), ep, reshard, overlap,
                 cp, atp)


def _schedule(caps: Caps, plan: Plan, pp: int) -> str:
    """The plan's schedule where the target runs it with pipelining, else 1F1B."""
    return plan.schedule if pp > 1 and plan.schedule in caps.schedules else "1f1b"


def _microbatch_options(batch: int, replicas: int, dp: int) -> list[int]:
    """Micro-batch counts that split each replica's share into whole samples per data-parallel rank."""
    share = batch // replicas
    return [m for m in range(1, share + 1) if share % m == 0 and (share // m) % dp == 0]


def score(original: Plan, model: ModelSpec, params: CostParams, shape: Shape, cache: CostCache) -> Candidate:
    """Build, validate (structure, then each device's memory) and estimate ``shape``."""
    try:
        plan = build_plan(original, model, shape)
        problems = plan_problems(plan, model)
        if problems:
            return Candidate(shape, plan, None, problems[0])
        est = estimate_plan(plan, model, params, cache)
    except AutoparError as e:
        return Candidate(shape, None, None, str(e))
    problems = plan_problems(plan, model, est.memory_gib)
    return Candidate(shape, plan, est, problems[0] if problems else "")


def _space(plan: Plan, model: ModelSpec, caps: Caps) -> Iterator[Shape]:
    """Every uniform shape of the target on the plan's cluster (one replica, even split)."""
    world = plan.world_size
    blocks = sum(1 for ly in model.layers if recomputed(ly, model))
    for pp in ([d for d in range(1, min(world, blocks) + 1) if world % d == 0] if caps.pp else [1]):
        n, split = world // pp, even_split(model, pp)
        if split is None:
            continue
        for tp in _tp_options(caps, pp, n, model):
            for m in _microbatch_options(plan.global_batch_size, 1, n // tp):
                if m < pp and m != 1:
                    continue  # fewer micro-batches than stages: all bubble (m = 1 kept for the no-PP case)
                for zero in caps.zero_levels(pp):
                    for ckpt in caps.ckpt:
                        sp = _sp(caps, tp, True)
                        for ep in _ep_options(caps, model, tp, zero, n // tp):
                            for reshard, overlap in option_pairs(caps, zero) if ep == 1 else [(True, False)]:
                                for atp in ((False, True) if sp and caps.async_tp else (False,)):
                                    yield Shape(pp, tp, zero, ckpt, sp, m, split, schedule=_schedule(caps, plan, pp),
                                                ep=ep, reshard=reshard, overlap=overlap, async_tp=atp)


def closest(plan: Plan, model: ModelSpec, params: CostParams, caps: Caps) -> tuple[Candidate, Candidate | None]:
    """(chosen, projection): the projection when it is valid and fits, else the fastest valid fitting
    shape of the target's space. Raises AutoparError (one line) when no shape of the target fits."""
    cache = CostCache()
    shape = project(plan, model, caps)
    first = score(plan, model, params, shape, cache) if shape is not None else None
    if first is not None and not first.problem:
        return first, first
    best: Candidate | None = None
    for s in _space(plan, model, caps):
        if shape is not None and s == replace(shape, replicas=1):
            continue
        c = score(plan, model, params, s, cache)
        if not c.problem and (best is None or c.estimate.step_time_s < best.estimate.step_time_s):
            best = c
    if best is None:
        why = f"the nearest ({label(shape)}): {first.problem}" if first is not None else _no_shape(plan, caps)
        raise AutoparError(f"export --to {caps.name}", f"no plan {caps.name} can express is valid and fits; {why}",
                           "search a plan for a larger cluster or a smaller batch, or use autopar's own runtime")
    return best, first


def _no_shape(plan: Plan, caps: Caps) -> str:
    world = plan.world_size
    if not caps.pp and not caps.tp:
        return (f"{caps.name} is data parallel only and the global batch {plan.global_batch_size} does not split "
                f"into whole samples over {world} devices")
    return f"no pipeline depth and TP degree of {caps.name} splits the global batch {plan.global_batch_size} " \
           f"over the data-parallel ranks of {world} devices"


def label(shape: Shape | None) -> str:
    if shape is None:
        return "-"
    r = f" x{shape.replicas} replicas" if shape.replicas > 1 else ""
    e = f" ep{shape.ep}" if shape.ep > 1 else ""
    c = f" cp{shape.cp}" if shape.cp > 1 else ""
    opts = (" nr" if not shape.reshard else "") + (" ov" if shape.overlap else "")
    return (f"pp{shape.pp} tp{shape.tp}{c} z{shape.zero}{opts} {shape.ckpt}{' sp' if shape.sp else ''}"
            f"{' atp' if shape.async_tp else ''}{e} "
            f"m{shape.num_microbatches}{r}")


