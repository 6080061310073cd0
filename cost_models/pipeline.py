"""Pipeline step time with uneven stages (1F1B and GPipe share the bubble; they differ in memory)."""

from __future__ import annotations

from collections.abc import Sequence

from numpy.typing import ArrayLike

from cost_models import communication as comm


def boundary_p2p_time(boundary_bytes: ArrayLike, micro_batch_size: int, bw: float, lat: float) -> ArrayLike:
    """One micro-batch's activations (``boundary_bytes`` per sample) sent to the next stage, one way."""
    return comm.p2p_time(boundary_bytes * micro_batch_size, bw, lat)


def pipeline_time(stage_costs: Sequence[float], round_trips: Sequence[float], num_microbatches: int,
                  slot_overhead_s: float = 0.0) -> float:
    """Step time of a synchronous pipeline with per-micro-batch stage costs ``c_i`` (fwd + bwd + step / m).

    T = (m - 1) * max_i c_i + sum_i (c_i + P_i) + o * (m + p - 1)

    ``P_i``: stage i's boundary send, both directions (0 for the last stage). The slowest stage runs
    m micro-batches back to back; the others add their fill and drain once; each boundary is
    crossed once forward and once backward on the critical path. ``o`` (``CostParams.slot_overhead_s``)
    is the fixed cost of each of the m + p - 1 slots on that path; for a given number of stages it is
    a constant, so it never changes which split of the layers is best. Exact for equal stages, the
    standard bound (Narayanan et al., Galvatron, Metis) for uneven ones. Summed in stage order:
    the search's partition DP and the plan estimate both call this, so they agree to the last bit.
    """
    total = 0.0
    worst = 0.0
    for c, p in zip(stage_costs, round_trips):
        total = total + (c + p)
        worst = max(worst, c)
    return (num_microbatches - 1) * worst + total + slot_overhead_s * (num_microbatches + len(stage_costs) - 1)
