"""What a measured file becomes: runs autopar can estimate, and the cases it cannot, each with a reason."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan

# Why a case is not estimated (Skip.reason); the benchmark counts them under these names.
REASONS = ("inexpressible", "suspect", "unpublished", "unknown GPU", "refused")


@dataclass
class Run:
    """One case as autopar sees it: the plan, the model and what was measured.

    ``status`` is ``ok`` (``measured_s`` is the step time) or ``failed`` (did not run, e.g. out of
    memory; ``measured_s`` is None). ``group`` names the cases that did the same work on the same
    cluster (model shape with its heads, sequence length, global batch, GPUs; the case's ``container``, its
    software release, where it names one), whose plans can be ranked against each other.
    ``notes``: what the reader assumed (catalogue bandwidths, an even layer split, precision).
    """

    case_id: str
    plan: Plan
    model: ModelSpec
    measured_s: float | None
    status: str
    group: str
    source_predicted_s: float | None = None
    notes: list[str] = field(default_factory=list)
    measured_memory_gib: float | None = None  # peak per GPU where the source publishes it (``published_memory``)


@dataclass(frozen=True)
class Skip:
    """A case that is not estimated: ``reason`` (one of ``REASONS``) and a one-line ``detail``."""

    case_id: str
    reason: str
    detail: str


@dataclass
class RunSet:
    """Every case of one measured file: ``runs`` (status ok), ``failed`` (did not run, but the plan is
    expressible, so the model can say whether it fits) and ``skipped`` (with reasons)."""

    name: str
    path: str
    source: str
    runs: list[Run] = field(default_factory=list)
    failed: list[Run] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # file-wide: precision, assumed defaults

    @property
    def total(self) -> int:
        return len(self.runs) + len(self.failed) + len(self.skipped)

    def skip_counts(self) -> dict[str, int]:
        """Skipped cases per reason."""
        return dict(collections.Counter(s.reason for s in self.skipped))
