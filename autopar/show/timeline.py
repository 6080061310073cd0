"""The pipeline schedule of a plan as a timeline: what each stage runs when, from the estimate's numbers.

Each stage runs the runtime's schedule order (``schedule_order``: 1F1B or GPipe) with the per-stage
figures of ``estimate_plan`` (``StageEstimate``): a forward takes ``fwd_s``, a backward ``bwd_s``
(split into the recomputation its checkpoint mode adds and the rest), each schedule slot its
``slot_overhead_s``, and a boundary send ``p2p_s``. A micro-batch's forward (backward) starts once the
previous (next) stage has sent it. After its last backward a stage pays its step-level tail
(``step_s``: gradient sync not hidden by backward, and the optimizer update); an asymmetric plan then
syncs gradients across pipelines for what ``cross_pipeline_sync_time`` leaves exposed.

The step the picture marks is the estimate's ``step_time_s``. The estimate prices a pipeline with
the standard closed form (``cost_models.pipeline``: every micro-batch carries 1/m of the step tail),
exact for one stage and an approximation for several, so the simulated schedule ends at the step
(one stage) or near it, before or after (``Timeline.simulated_s``, which the picture marks too);
until the later of the two, a stage not running anything is idle (bubble).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autopar.errors import AutoparError
from autopar.estimate import PlanEstimate
from autopar.estimate.cache import CostCache
from autopar.estimate.context import StageContext
from autopar.estimate.pipeline import spec_layers
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams
from cost_models.pipeline_schedules import stage_slots

KINDS = ("forward", "backward", "recompute", "p2p", "grad sync", "bubble")


def schedule_order(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> list[tuple[str, int]]:
    """The ("F" | "B", micro-batch) actions stage ``stage`` runs, in the order of the schedule table
    the runtime executes (``cost_models.pipeline_schedules``; 1F1B and GPipe run one chunk)."""
    if schedule not in ("1f1b", "gpipe"):
        raise AutoparError("schedule", f"no timeline for schedule {schedule!r}", "show draws 1f1b and gpipe plans")
    return [(kind, k) for slot in stage_slots(schedule, num_stages, stage, num_microbatches)
            for kind, k, _ in slot]


@dataclass
class Row:
    """One stage's line of the timeline: (kind, start s, end s, micro-batch or -1) segments."""

    pipeline: int
    stage: int
    devices: list[int]
    segments: list[tuple[str, float, float, int]] = field(default_factory=list)


@dataclass
class Timeline:
    rows: list[Row]
    step_s: float  # the estimate's step time: where the picture ends
    simulated_s: float  # where the simulated schedule's last action ends (see the module doc)
    pipeline_times_s: list[float]


def _recompute_share(model: ModelSpec, plan: Plan, params: CostParams, cache: CostCache) -> list[list[float]]:
    """Per pipeline and stage: seconds per micro-batch its checkpoint modes add to backward (the
    layer's backward under its strategy minus the same strategy without checkpointing)."""
    index = model.index()
    out = []
    for pipe in plan.pipelines:
        row = []
        for st in pipe.stages:
            ctx = StageContext(plan.cluster, tuple(st.devices), pipe.micro_batch_size, pipe.num_microbatches, params)
            extra = 0.0
            for spec, ly in zip(spec_layers(model, index, [x.name for x in st.layers]), st.layers):
                s = ly.strategy
                if s.ckpt != "none":
                    plain = replace(s, ckpt="none")  # every other field kept (sp, async_tp, ...)
                    extra += max(0.0, cache.layer_cost(spec, s, ctx).bwd - cache.layer_cost(spec, plain, ctx).bwd)
            row.append(extra)
        out.append(row)
    return out


def build_timeline(plan: Plan, model: ModelSpec, est: PlanEstimate, params: CostParams) -> Timeline:
    """The timeline of ``plan`` (estimated as ``est`` with ``params``): see the module docstring."""
    cache = CostCache()
    recompute = _recompute_share(model, plan, params, cache)
    o = params.slot_overhead_s
    rows: list[Row] = []
    sim_end = 0.0
    for pi, (pipe, stages) in enumerate(zip(plan.pipelines, est.pipelines)):
        p, m = len(stages), pipe.num_microbatches
        order = [schedule_order(plan.schedule, p, i, m) for i in range(p)]
        done: dict[tuple[str, int, int], float] = {}  # (kind, stage, mb) -> time its output reached the neighbour
        prow = [Row(pi, i, list(st.devices)) for i, st in enumerate(stages)]
        free = [0.0] * p
        nxt = [0] * p
        left = sum(len(a) for a in order)
        while left:  # run every stage's next action whose input has arrived (the order is deadlock-free)
            moved = False
            for i, st in enumerate(stages):
                while nxt[i] < len(order[i]):
                    kind, k = order[i][nxt[i]]
                    dep = (("F", i - 1, k) if i > 0 else None) if kind == "F" else (("B", i + 1, k) if i + 1 < p else None)
                    if dep is not None and dep not in done:
                        break
                    t = max(free[i], done.get(dep, 0.0) if dep else 0.0)
                    rc = min(recompute[pi][i], st.bwd_s) if kind == "B" else 0.0
                    dur = (st.fwd_s if kind == "F" else st.bwd_s) + o / 2
                    if rc > 0:
                        prow[i].segments.append(("recompute", t, t + rc, k))
                    prow[i].segments.append(("forward" if kind == "F" else "backward", t + rc, t + dur, k))
                    t += dur
                    send = (kind == "F" and i + 1 < p) or (kind == "B" and i > 0)
                    hop = (st.p2p_s if kind == "F" else stages[i - 1].p2p_s) if send else 0.0
                    if hop > 0:
                        prow[i].segments.append(("p2p", t, t + hop, k))
                    done[(kind, i, k)] = t + hop
                    free[i] = t + hop
                    nxt[i] += 1
                    left -= 1
                    moved = True
            if not moved:
                raise RuntimeError(f"internal: schedule {plan.schedule} deadlocked in the timeline")
        for i, st in enumerate(stages):
            if st.step_s > 0:
                prow[i].segments.append(("grad sync", free[i], free[i] + st.step_s, -1))
            sim_end = max(sim_end, free[i] + st.step_s)
        rows += prow
    step = est.step_time_s
    exposed = step - max(est.pipeline_times_s)
    if len(plan.pipelines) > 1 and exposed > 0:  # cross-pipeline sync: once every pipeline is done
        start = max(max(est.pipeline_times_s), sim_end)
        for r in rows:
            r.segments.append(("grad sync", start, start + exposed, -2))
        sim_end = start + exposed
    for r in rows:  # idle until the step ends
        _fill_bubbles(r, max(step, sim_end))
    return Timeline(rows, step, sim_end, list(est.pipeline_times_s))


def _fill_bubbles(row: Row, end: float) -> None:
    """Add a ``bubble`` segment for every idle gap of ``row`` before ``end``."""
    busy = sorted((s[1], s[2]) for s in row.segments)
    t = 0.0
    gaps = []
    for a, b in busy:
        if a > t + 1e-12:
            gaps.append(("bubble", t, a, -1))
        t = max(t, b)
    if end > t + 1e-12:
        gaps.append(("bubble", t, end, -1))
    row.segments += gaps


def kind_totals(row: Row) -> dict[str, float]:
    """Seconds ``row`` spends in each kind of ``KINDS``."""
    out = dict.fromkeys(KINDS, 0.0)
    for kind, a, b, _ in row.segments:
        out[kind] += b - a
    return out
