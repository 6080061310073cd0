"""Pipeline schedules as data: the ordered forward / backward actions one stage runs in a step.

The tables are ``cost_models.pipeline_schedules``' (the one generator: the cost model reads its bubble
and in-flight activations from the very tables this runtime executes); this module turns a size with
no table into the runtime's one-line refusal. Actions are ``(kind, micro_batch, chunk)``: 1F1B and
GPipe run chunk 0 only; the interleaved schedule runs the stage's ``virtual_stages`` model chunks;
``zb-h1`` adds ``"W"`` actions (weight gradients, runtime/zero_bubble.py) to 1F1B's split backwards.
Every table is deadlock-free even when every batch of sends and receives must complete before the
next (tests/runtime/schedule_check.py proves it), and all give the same gradients.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from cost_models.pipeline_schedules import Action, schedule_problem
from cost_models.pipeline_schedules import stage_slots as _table_slots

__all__ = ["Action", "stage_slots"]


def stage_slots(schedule: str, num_stages: int, stage: int, num_microbatches: int,
                virtual_stages: int = 1) -> list[list[Action]]:
    """The actions stage ``stage`` of a ``num_stages``-stage pipeline runs for ``num_microbatches``, in
    communication slots (a slot's inputs are received before it runs, its outputs sent after it)."""
    problem = schedule_problem(schedule, num_stages, num_microbatches, virtual_stages)
    if problem is not None:
        raise AutoparError("schedule", problem, "use 1f1b or gpipe, zb-h1 with 2+ stages, or interleaved with "
                           "virtual_stages >= 2 and num_microbatches a multiple of the stage count")
    return _table_slots(schedule, num_stages, stage, num_microbatches, virtual_stages)
