"""What a search returns, whichever planner ran: ``SearchResult`` (and the homogeneous search's
per-configuration records, ``ConfigResult``). Both planners import it; it imports no planner."""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.estimate.plan_cost import PlanEstimate
from autopar.plan.schema import Plan, Stage

HOMOGENEOUS = "homogeneous"
HETEROGENEOUS = "heterogeneous"


@dataclass
class ConfigResult:
    """One (pp, micro-batch) setting of the homogeneous search: its bound and what it achieved."""

    pp: int
    num_microbatches: int
    micro_batch_size: int
    lower_bound: float
    step_time: float = float("inf")
    stages: list[Stage] = field(default_factory=list)
    min_memory_gib: float = float("inf")  # least per-device need of any partition (for "nothing fits")
    note: str = ""
    virtual_stages: int = 1  # > 1: an interleaved re-cut of a 1F1B setting (search/interleave.py); stages = chunks
    schedule: str = ""  # set: a 1F1B setting re-run under this schedule (zb-h1: search/zero_bubble.py)


@dataclass
class SearchResult:
    """The plan a planner chose, its estimate (``estimate.step_time_s`` is the figure the planner
    optimised) and the search's statistics. ``seconds`` is the planner's own time (the plan's
    ``search.seconds``); ``baseline_seconds`` what scoring the baselines took after it.

    ``pruned`` maps rule keys (``autopar.search.rules.Rule`` values, plain strings) to counts, as in
    ``plan.search["pruned"]``. ``configs`` is filled by the homogeneous planner only. ``baselines``
    maps a baseline's name to ``(plan, estimate)``, or None when none of its family fits.
    """

    planner: str  # HOMOGENEOUS or HETEROGENEOUS, as plan.search["planner"]
    plan: Plan
    estimate: PlanEstimate
    seconds: float
    candidates: int
    pruned: dict[str, int]
    configs: list[ConfigResult] = field(default_factory=list)
    timed_out: bool = False
    baselines: dict[str, tuple[Plan, PlanEstimate] | None] = field(default_factory=dict)
    baseline_seconds: float = 0.0  # scoring the baselines, after the plan (not in ``seconds``)
