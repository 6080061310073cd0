"""SearchOptions: the knobs of a search, validated where they are made."""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.errors import AutoparError
from cost_models import CostParams

SEARCH_SCHEDULES = ("1f1b", "gpipe")  # 1f1b: interleaved re-cuts are tried too (search/interleave.py)


@dataclass
class SearchOptions:
    memory_budget_gib: float | None = None  # per-device cap (None: each device's memory)
    time_budget_s: float | None = None  # stop and return the best so far
    schedule: str = "1f1b"
    pp_degrees: list[int] | None = None  # restrict the PP degrees tried
    num_microbatches: list[int] | None = None  # restrict the micro-batch counts tried
    prune_dominated: bool = True
    progress: bool = False
    params: CostParams = field(default_factory=CostParams)
    # Virtual stage counts a 1f1b search tries on its best settings (interleaved re-cuts, search/interleave.py);
    # () tries none.
    virtual_stages: tuple[int, ...] = (2, 4)
    # A 1f1b search also tries the zero-bubble schedule (zb-h1) on its best settings (search/zero_bubble.py).
    zero_bubble: bool = True
    # Context parallel degrees the search tries (search/context_parallel.py); None: the default for
    # the sequence length (1 below 16384 tokens). ``cp``: the one degree a single planner run uses.
    cp_degrees: tuple[int, ...] | None = None
    cp: int = 1
    # The largest TP degree tried, by the planners and the Megatron baseline (None: as the nodes allow); 1 keeps a
    # model wrap runs without TP (docs/models.md) from getting a plan with TP
    max_tp: int | None = None

    def __post_init__(self) -> None:
        if self.memory_budget_gib is not None and self.memory_budget_gib <= 0:
            raise AutoparError("memory_budget", f"must be positive, got {self.memory_budget_gib}",
                               "pass --memory-budget GiB with a value > 0")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise AutoparError("time_budget", f"must be positive, got {self.time_budget_s}",
                               "pass --time-budget seconds with a value > 0")
        if self.max_tp is not None and (not isinstance(self.max_tp, int) or self.max_tp < 1):
            raise AutoparError("max_tp", f"must be a whole number >= 1, got {self.max_tp!r}",
                               "pass --max-tp N with N >= 1 (1: no tensor parallelism)")
        if any(not isinstance(v, int) or v < 2 for v in self.virtual_stages):
            raise AutoparError("virtual_stages", f"must be counts >= 2, got {self.virtual_stages!r}",
                               "give e.g. (2, 4), or () to try no interleaved schedule")
        if self.schedule not in SEARCH_SCHEDULES:
            raise AutoparError("schedule", f"the search takes schedule 1f1b or gpipe, not {self.schedule!r}",
                               "use 1f1b (the search tries interleaved virtual stages itself) or gpipe")


def nothing_fits_fix(opts: SearchOptions, memory_margin: float) -> str:
    """The fix of a 'no plan fits' refusal: each knob that would give the plan more room, as the user set them."""
    knobs = ["add devices", "raise --memory-budget"]
    knobs += ["lower --memory-margin"] if memory_margin else []
    knobs += ["use --schedule 1f1b (fewer micro-batches' activations held)"] if opts.schedule == "gpipe" else []
    knobs += ["raise --max-tp"] if opts.max_tp is not None else []
    return ", ".join(knobs) + ", or lower --global-batch-size / --seq-len"
