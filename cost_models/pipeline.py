"""Pipeline step time with uneven stages: the schedule table simulated (what plans are priced by), the
closed form (what the partition DP minimises) and a proven lower bound (what prunes the search)."""

from __future__ import annotations

from collections.abc import Sequence

from numpy.typing import ArrayLike

from cost_models import communication as comm
from cost_models.pipeline_schedules import Simulation, cached_structure, simulate_schedule


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
    """The closed form of a synchronous pipeline's (1F1B or GPipe) step with uneven stages: what the
    search's partition DP minimises. Plans are priced by ``simulated_pipeline_time`` (the schedule
    table the runtime executes), which this approximates; it is NOT a bound either way (a slow first
    stage: the closed form adds the later stages' fill that the simulation overlaps; slow links: the
    simulation puts every micro-batch's send on the chain). ``pipeline_lower_bound`` is the bound.

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


def action_times(cost: float, fwd: float, step: float, num_microbatches: int, slot_overhead_s: float = 0.0,
                 ) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch on a stage (or an interleaved chunk) whose per-micro-batch
    cost is ``cost = w + step / m`` with forward ``fwd`` (``StageCost``'s fields): the forward is ``fwd``, the
    backward the rest of ``w`` (``stage_work``), and the slot's fixed cost ``o`` is split half to each, so
    one micro-batch costs ``w + o``. The step tail is not in either: the simulation runs it once after
    the stage's last slot. The one split every schedule's pricing uses (1F1B, GPipe, interleaved)."""
    w = stage_work(cost, step, num_microbatches)
    return fwd + slot_overhead_s / 2, (w - fwd) + slot_overhead_s / 2


def simulate_pipeline(schedule: str, num_microbatches: int, costs: Sequence[float], fwds: Sequence[float],
                      steps: Sequence[float], sends: Sequence[float], slot_overhead_s: float = 0.0,
                      virtual_stages: int = 1, record: bool = False,
                      wgts: Sequence[float] | None = None) -> Simulation:
    """The schedule table (``schedule_table``) of a pipeline simulated (``simulate_schedule``).

    Per virtual stage g (stage order; with virtual stages, chunk c of physical stage s is g = c p + s):
    ``costs[g]`` per micro-batch (``w + step / m``), ``fwds[g]`` its forward, ``steps[g]`` its step tail,
    ``sends[g]`` one micro-batch's transfer to g + 1 (activations forward, the same bytes of gradients
    back over the reverse link; the last entry unused). Actions take ``action_times``; a physical stage's
    tail is the sum of its chunks' tails. ``record``: with each slot's and transfer's times (a timeline).
    ``wgts[g]`` (``zb-h1``): the weight-gradient part of g's backward, run as its W actions.
    """
    m, v = num_microbatches, virtual_stages
    p = len(costs) // v
    split = [action_times(c, f, s, m, slot_overhead_s) for c, f, s in zip(costs, fwds, steps)]
    tails = [sum(steps[g] for g in range(s, p * v, p)) for s in range(p)]
    table, structure = cached_structure(schedule, p, m, v)
    wgt = list(wgts) if wgts is not None else None
    bwd = [b - (wgt[g] if wgt else 0.0) for g, (_, b) in enumerate(split)]
    return simulate_schedule(table, [f for f, _ in split], bwd, list(sends), tails=tails, wgt_s=wgt, record=record,
                             structure=structure)


def simulated_pipeline_time(schedule: str, num_microbatches: int, costs: Sequence[float], fwds: Sequence[float],
                            steps: Sequence[float], sends: Sequence[float], slot_overhead_s: float = 0.0,
                            virtual_stages: int = 1) -> float:
    """A pipeline's step time: ``simulate_pipeline``'s step (what ``estimate_plan`` prices every pipeline by).

    Equal stages with free sends give (m + p - 1)(w + o) + s for 1F1B and GPipe, the closed form."""
    return simulate_pipeline(schedule, num_microbatches, costs, fwds, steps, sends, slot_overhead_s,
                             virtual_stages).step_s


def fill_factor(num_stages: int, num_microbatches: int) -> float:
    """``1 / (1 - (1 - 1/m)^p)``: ``pipeline_lower_bound``'s factor on the total work (m at p = 1, 1 at m = 1)."""
    p, m = num_stages, num_microbatches
    return 1.0 / (1.0 - (1.0 - 1.0 / m) ** p)


def pipeline_lower_bound(work: float, cost: float, num_stages: int, num_microbatches: int,
                         slot_overhead_s: float = 0.0, *, fwd_share: float | None = None,
                         schedule: str = "1f1b") -> float:
    """A lower bound of ``simulated_pipeline_time`` (1F1B or GPipe, p stages, m micro-batches) of any
    partition whose stages' forward + backward sum to at least ``work`` (W) and whose per-micro-batch
    costs ``w + s / m`` sum to at least ``cost`` (C):

        T >= max(m C / p + m o,  fill_factor(p, m) W',  W' (1 + 1 / sum_k 1 / a_k)),   W' = W + p o,

    the last only with ``fwd_share`` (phi: no stage's forward is more than phi of its forward + backward),
    a_k = m - 1 - n_k max(phi, 1/2), n_k = min(p - k - 1, m - 1) for 1F1B and m - 1 for GPipe.

    Proof. Write w_k + o for stage k's forward + backward (``action_times``), f_k its forward, s_k its
    tail. Stage k's first forward waits for micro-batch 0's forwards on stages j < k; its last action is
    micro-batch m - 1's backward, after which stages j < k still run theirs; the stage itself runs m
    micro-batches and then its tail. Sends and link queues only add. So T >= m (w_k + o) + s_k, whose
    mean over k is m C / p + m o; and T >= x_k := sum_{j<k} (w_j + o) + m (w_k + o). For weights a_k >= 0
    with sum 1, T >= sum_k a_k x_k = sum_j (w_j + o) (m a_j + sum_{k>j} a_k); a_k = (f / m) (1 - 1/m)^(p-1-k)
    with f = fill_factor(p, m) sums to 1 and makes every coefficient f, so T >= f (W + p o).
    Between its forward and its backward of micro-batch 0, stage k waits for the forwards and backwards of
    every later stage (sum_{j>k} (w_j + o)) and runs only its next n_k forwards (the schedule's order),
    each at most phi' = max(phi, 1/2) of w_k + o (a mediant: the slot cost and layout switches split
    half and half). So T >= W' + a_k (w_k + o); weights proportional to 1 / a_k give the third term
    (none when some a_k is 0, i.e. m = 1). Equal stages reach (m + p - 1)(W / p + o) + s, and
    f >= m / p + (p - 1) / (2 p) (``tests/cost_models/test_pipeline_simulated.py``).
    """
    p, m = num_stages, num_microbatches
    wide = work + p * slot_overhead_s
    bound = max(m * cost / p + m * slot_overhead_s, fill_factor(p, m) * wide)
    if fwd_share is None or m == 1:
        return bound
    phi = max(fwd_share, 0.5)
    n = [m - 1] * p if schedule == "gpipe" else [min(p - k - 1, m - 1) for k in range(p)]
    alphas = [m - 1 - nk * phi for nk in n]
    if min(alphas) <= 0.0:
        return bound
    return max(bound, wide * (1.0 + 1.0 / sum(1.0 / a for a in alphas)))
