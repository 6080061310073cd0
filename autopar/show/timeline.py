"""The pipeline schedule of a plan as a timeline: what each stage runs when, from the estimate's numbers.

Each pipeline's schedule table (1F1B or GPipe) is the estimate's own simulation
(``cost_models.pipeline.simulate_pipeline`` over ``estimate_plan``'s per-stage figures, the very call
that priced the pipeline), asked for its start and end times: a forward takes ``fwd_s``, a backward
``bwd_s`` (split into the recomputation its checkpoint mode adds and the rest), each with half the
slot's ``slot_overhead_s``; a stage waiting for its input while the neighbour's send is on the link
shows ``p2p``. After its last backward a stage pays its step-level tail (``step_s``: gradient sync not
hidden by backward, and the optimizer update); an asymmetric plan then syncs gradients across
pipelines for what ``cross_pipeline_sync_time`` leaves exposed. The simulation's end is the
pipeline's estimated step (``Timeline.simulated_s`` equals ``step_s`` up to that sync); a stage not
running anything before the step ends is idle (bubble).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autopar.errors import AutoparError
from autopar.estimate import PlanEstimate
from autopar.estimate.cache import CostCache
from autopar.estimate.context import chunk_contexts
from autopar.estimate.pipeline import StageEstimate, spec_layers
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams
from cost_models.pipeline import simulate_pipeline
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
    simulated_s: float  # where the simulated schedules (and any cross-pipeline sync) end: the step
    pipeline_times_s: list[float]


def _recompute_share(model: ModelSpec, plan: Plan, params: CostParams, cache: CostCache) -> list[list[float]]:
    """Per pipeline and stage: seconds per micro-batch its checkpoint modes add to backward (the
    layer's backward under its strategy minus the same strategy without checkpointing)."""
    index = model.index()
    out = []
    for pipe in plan.pipelines:
        row = []
        for st, ctx in zip(pipe.stages, chunk_contexts(pipe, plan.cluster, params)):
            extra = 0.0
            for spec, ly in zip(spec_layers(model, index, [x.name for x in st.layers]), st.layers):
                s = ly.strategy
                if s.ckpt != "none":
                    plain = replace(s, ckpt="none")  # every other field kept (sp, async_tp, ...)
                    extra += max(0.0, cache.layer_cost(spec, s, ctx).bwd - cache.layer_cost(spec, plain, ctx).bwd)
            row.append(extra)
        out.append(row)
    return out


def _pipeline_rows(pi: int, schedule: str, m: int, stages: list[StageEstimate], recompute: list[float],
                   params: CostParams) -> tuple[list[Row], float]:
    """The rows of one pipeline (its stages' segments from the simulation's times) and the end of its step."""
    p, o = len(stages), params.slot_overhead_s
    sim = simulate_pipeline(schedule, m, [st.cost_per_microbatch_s for st in stages], [st.fwd_s for st in stages],
                            [st.step_s for st in stages], [st.p2p_s for st in stages], o, record=True)
    rows = [Row(pi, i, list(st.devices)) for i, st in enumerate(stages)]
    for i, (st, row) in enumerate(zip(stages, rows)):
        prev = 0.0
        for slot, (start, end) in zip(stage_slots(schedule, p, i, m), sim.slots[i]):
            for kind, k, _ in slot:  # one action per slot in 1F1B and GPipe
                src = ("F", k, i - 1) if kind == "F" else ("B", k, i + 1)
                leave, arrive = sim.sends.get(src, (start, start))
                if arrive >= start > prev and max(prev, leave) < start:  # waited for the send on the link
                    row.segments.append(("p2p", max(prev, leave), start, k))
                rc = min(recompute[i], st.bwd_s) if kind == "B" else 0.0
                if rc > 0:
                    row.segments.append(("recompute", start, start + rc, k))
                row.segments.append(("forward" if kind == "F" else "backward", start + rc, end, k))
            prev = end
        if st.step_s > 0:
            row.segments.append(("grad sync", sim.ends[i], sim.ends[i] + st.step_s, -1))
    return rows, sim.step_s


def build_timeline(plan: Plan, model: ModelSpec, est: PlanEstimate, params: CostParams) -> Timeline:
    """The timeline of ``plan`` (estimated as ``est`` with ``params``): see the module docstring."""
    cache = CostCache()
    recompute = _recompute_share(model, plan, params, cache)
    rows: list[Row] = []
    sim_end = 0.0
    for pi, (pipe, stages) in enumerate(zip(plan.pipelines, est.pipelines)):
        schedule_order(plan.schedule, len(stages), 0, 1)  # refuses a schedule with no timeline
        prow, end = _pipeline_rows(pi, plan.schedule, pipe.num_microbatches, stages, recompute[pi], params)
        rows += prow
        sim_end = max(sim_end, end)
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
