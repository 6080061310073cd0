"""What ``autopar calibrate`` may fit: one row per scalar CostParams field, as data.

A row names the field, its bounds, whether it is fitted in log space (scales: efficiencies, times) or
linearly (fractions that may reach 0), where the fit starts (None: the base value, clipped into the
bounds; an overlap starts inside its range, where the prediction still depends on it), whether it is
fitted by default, which runs identify it (the refusal's fix when no run's prediction depends on
it), and what it is fitted to: measured step times, or the peak memory a source publishes. A new cost parameter becomes fittable by adding its row here, nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from autopar.errors import AutoparError
from cost_models import CostParams


@dataclass(frozen=True)
class Fittable:
    """One fittable CostParams field (see the module docstring)."""

    name: str
    low: float
    high: float
    log: bool
    identified_by: str
    start: float | None = None
    default: bool = False
    target: str = "time"  # what the row is fitted to: "time" (step seconds) or "memory" (published peak GiB)

    def to_u(self, value: float) -> float:
        """The fit's coordinate of ``value`` (its log in log space), clipped into the bounds."""
        value = min(max(value, self.low), self.high)
        return math.log(value) if self.log else value

    def from_u(self, u: float) -> float:
        """The field's value at fit coordinate ``u``."""
        return math.exp(u) if self.log else u

    @property
    def bounds_u(self) -> tuple[float, float]:
        return self.to_u(self.low), self.to_u(self.high)


FITTABLE: tuple[Fittable, ...] = (
    Fittable("eff_max", 0.01, 1.0, True, "runs whose time is mostly compute", default=True),
    Fittable("layer_overhead_s", 1e-7, 0.05, True, "runs with little work per layer call (small micro-batches, "
             "high TP) next to runs with much", default=True),
    Fittable("overlap_sync", 0.0, 1.0, False, "runs with dp > 1 whose gradient sync is long against the backward",
             start=0.5),
    Fittable("overlap_zero3", 0.0, 1.0, False, "runs with zero: 3", start=0.5),
    Fittable("zero3_comm_eff", 0.01, 1.0, True, "runs with zero: 3 whose gathers are long against their compute "
             "(many nodes, small micro-batches) next to runs without ZeRO-3", start=0.3),
    Fittable("overlap_grad_reduce", 0.0, 1.0, False, "runs with zero: 1 and zero_overlap whose gradient "
             "reduce-scatter is long against one backward", start=0.5),
    Fittable("overlap_param_gather", 0.0, 1.0, False, "runs with zero: 1 or 2 and zero_overlap whose parameter "
             "all-gather is long against one forward", start=0.5),
    Fittable("async_tp_overlap", 0.0, 1.0, False, "runs with async_tp: true next to the same plans without it "
             "(vanilla / async TP pairs)", start=0.5),
    Fittable("act_traffic", 0.05, 30.0, True, "runs where memory-bound kernels weigh (small hidden sizes on "
             "low-bandwidth GPUs, eager attention) next to GEMM-bound ones"),
    Fittable("slot_overhead_s", 1e-7, 0.1, True, "runs with pipeline parallelism and different numbers of "
             "micro-batches or stages", start=1e-4),
    Fittable("collective_call_s", 1e-7, 0.02, True, "runs with many small collectives per step (TP at small "
             "micro-batches, many micro-batches) next to runs with few or none", start=1e-4),
    # Fitted to published peak memory (runs without one add nothing to these rows)
    Fittable("act_mem_factor", 0.5, 4.0, True, "runs with a published peak memory whose activations weigh "
             "(larger micro-batches, less recomputation)", target="memory"),
    Fittable("reserve_gib", 0.0, 40.0, False, "runs with a published peak memory next to runs of other "
             "activation sizes", target="memory"),
)
BY_NAME = {row.name: row for row in FITTABLE}
DEFAULT_FIT = tuple(row.name for row in FITTABLE if row.default)


def scalar_fields() -> set[str]:
    """The CostParams fields that are plain numbers (what a row may name)."""
    base = CostParams()
    return {f.name for f in fields(CostParams) if isinstance(getattr(base, f.name), (int, float))}


def choose(spec: str | None) -> list[Fittable]:
    """The rows of ``--fit a,b,c`` (``DEFAULT_FIT`` when None); AutoparError for an unknown or repeated name."""
    names = DEFAULT_FIT if spec is None else [n.strip() for n in spec.split(",")]
    rows = []
    for name in names:
        if name not in BY_NAME:
            raise AutoparError("--fit", f"{name!r} is not a fittable cost parameter",
                               f"pick from {', '.join(BY_NAME)}")
        if BY_NAME[name] in rows:
            raise AutoparError("--fit", f"names {name} twice", "name each field once")
        rows.append(BY_NAME[name])
    return rows


def start_u(rows: list[Fittable], base: CostParams) -> list[float]:
    """Where the fit starts, in fit coordinates: each row's ``start`` or the base value."""
    return [row.to_u(row.start if row.start is not None else float(getattr(base, row.name))) for row in rows]


def values(rows: list[Fittable], u) -> dict[str, float]:
    """The fitted fields at fit coordinates ``u``."""
    return {row.name: float(row.from_u(float(x))) for row, x in zip(rows, u)}
