"""Pipeline step time with uneven stages (1F1B and GPipe share the bubble; they differ in memory)."""

from __future__ import annotations

import numpy as np


def pipeline_step_time(stage_costs, num_microbatches: int, p2p_per_microbatch: float = 0.0) -> float:
    """Step time of a synchronous pipeline with per-micro-batch stage costs ``c_i`` (fwd + bwd).

    T = (m - 1) * max_i c_i + sum_i c_i + 2 (p - 1) * t_p2p

    The slowest stage runs m micro-batches back to back; the others add their fill and drain once;
    each boundary is crossed once forward and once backward on the critical path. Exact for equal
    stages, the standard bound (Narayanan et al., Galvatron, Metis) for uneven ones.
    """
    c = np.asarray(stage_costs, dtype=float)
    p = c.shape[-1]
    return float((num_microbatches - 1) * c.max(axis=-1) + c.sum(axis=-1) + 2 * (p - 1) * p2p_per_microbatch)


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """Idle fraction of equal stages: (p - 1) / (m + p - 1)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)
