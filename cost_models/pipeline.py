"""Pipeline step time with uneven stages (1F1B and GPipe share the bubble; they differ in memory)."""

from __future__ import annotations

from collections.abc import Sequence

from numpy.typing import ArrayLike

from cost_models import communication as comm


def boundary_p2p_time(boundary_bytes: ArrayLike, micro_batch_size: int, bw: float, lat: float) -> ArrayLike:
    """One micro-batch's activations (``boundary_bytes`` per sample) sent to the next stage, one way."""
    return comm.p2p_time(boundary_bytes * micro_batch_size, bw, lat)


def stage_work(cost: ArrayLike, step: ArrayLike, num_microbatches: int) -> ArrayLike:
    """A stage's forward + backward per micro-batch, ``w = c - s / m``, from its per-micro-batch cost
    ``c = w + s / m`` (``stage_cost``'s ``cost``) and its step tail ``s``. The search (over tables) and
    the plan estimate (over floats) both derive ``w`` here, so they agree to the last bit."""
    return cost - step / num_microbatches


def pipeline_time(stage_costs: Sequence[float], round_trips: Sequence[float], num_microbatches: int,
                  slot_overhead_s: float = 0.0, *, steps: Sequence[float] | None = None) -> float:
    """Step time of a synchronous pipeline (1F1B or GPipe) with uneven stages.

    Stage i costs ``c_i = w_i + s_i / m`` per micro-batch (``stage_costs``): ``w_i`` its forward +
    backward, ``s_i`` (``steps``; none: 0) its once-per-step tail, the gradient sync its backward did
    not hide plus the optimizer update, run after its last backward. Then

        T = sum_i (w_i + P_i) + max_i ((m - 1) w_i + s_i) + o * (m + p - 1)

    The slowest stage k (slowest counting its tail) runs its m micro-batches back to back and then its
    tail; every other stage adds its fill and drain once; ``P_i``: stage i's boundary send, both
    directions (0 for the last stage), crossed once forward and once backward on the critical path;
    ``o`` (``CostParams.slot_overhead_s``) the fixed cost of each of the m + p - 1 slots on that path,
    a constant for a given number of stages. Equal stages give (m + p - 1) w + s, what a discrete-event
    simulation of either schedule gives (tests/cost_models/schedule_sim.py is that oracle, and bounds
    the uneven case). The tail is paid once per step, not once per slot: before, every stage's c_i
    (tail included) was summed and the bottleneck's repeated m - 1 times, which charged the tail
    (m + p - 1) / m times, up to p times at m = 1. Summed in stage order: the search's partition DP
    and the plan estimate both call this, so they agree to the last bit.
    """
    m = num_microbatches
    steps = [0.0] * len(stage_costs) if steps is None else steps
    total = 0.0
    worst = 0.0
    for c, p, s in zip(stage_costs, round_trips, steps):
        w = stage_work(c, s, m)
        total = total + (w + p)
        worst = max(worst, (m - 1) * w + s)
    return total + worst + slot_overhead_s * (m + len(stage_costs) - 1)
