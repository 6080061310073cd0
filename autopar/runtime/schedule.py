"""Pipeline schedules as data: the ordered forward / backward actions one stage runs in a step.

1F1B (PipeDream-flush): stage s of p runs min(p - s - 1, m) warm-up forwards, then alternates one
forward and one backward, then drains the remaining backwards; at most p - s micro-batches are in
flight. GPipe: all forwards, then all backwards. Both are deadlock-free even when every batch of sends
and receives must complete before the next (tests/runtime/schedule_check.py proves it), and both give the same gradients.
"""

from __future__ import annotations

from autopar.errors import AutoparError

Action = tuple[str, int]  # ("F" | "B", micro-batch index)


def stage_actions(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> list[Action]:
    """The actions stage ``stage`` of a ``num_stages``-stage pipeline runs for ``num_microbatches``."""
    m = num_microbatches
    if schedule == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    if schedule == "1f1b":
        warm = min(num_stages - stage - 1, m)
        acts: list[Action] = [("F", k) for k in range(warm)]
        f, b = warm, 0
        while f < m:
            acts += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        acts += [("B", k) for k in range(b, m)]
        return acts
    raise AutoparError("schedule", f"unknown schedule {schedule!r}", "use 1f1b or gpipe")
