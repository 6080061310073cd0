"""Pipeline schedules as tables, and what the cost model reads off them: in-flight activations and step time.

A schedule is, per physical stage s of p, the ordered list of actions it runs in one step:
``(kind, micro_batch, chunk)``, kind ``"F"`` (forward) or ``"B"`` (backward), ``chunk`` the local model
chunk. With v virtual stages (interleaved), stage s holds chunks c = 0 .. v-1 and chunk c is virtual
stage ``c * p + s`` of the p * v that make up the model in order (Megatron's layout: the model is cut
into p * v consecutive pieces and piece g runs on stage g mod p). Without interleaving v = 1 and every
action has chunk 0.

* ``gpipe``: every forward, then every backward.
* ``1f1b`` (PipeDream-flush): stage s warms up with min(p - s - 1, m) forwards, alternates one forward
  and one backward, then drains the backwards.
* ``interleaved`` (Narayanan et al. 2021, Megatron-LM's ``forward_backward_pipelining_with_interleaving``):
  forwards walk the micro-batches in groups of p, chunk after chunk ((i // p) % v is the chunk of the
  i-th forward, (i // (p v)) p + i % p its micro-batch), backwards the same with the chunks reversed;
  stage s warms up with min(2 (p - s - 1) + (v - 1) p, m v) forwards, then alternates, then drains.
  It needs m to be a multiple of p (Megatron's own constraint).
* ``zb-h1`` (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ZB-H1; torch's
  ``_get_1f1b_rank_ops(enable_zero_bubble=True)``): 1F1B's forwards and backwards, each backward split
  into ``"B"`` (input gradient, on the critical path) and ``"W"`` (weight gradient, no communication).
  Stage s runs its first s backwards without their W; from then on each B is followed by the W of the
  oldest backward still without one, and the s W's left over run last, in the drain's bubble. A
  micro-batch's activations stay until its W (``inflight_profile``), so every stage holds up to
  min(p, m) micro-batches: stage 0's 1F1B peak, on every stage. Needs p >= 2 (``zero_bubble_slots``).

The runtime executes these very tables (``autopar.runtime.schedule``) and the cost model reads its
bubble and peak in-flight activations from them (``inflight_profile``, ``simulate_step``), so the
two cannot drift. This module is pure: no autopar, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

Action = tuple[str, int, int]  # ("F" | "B" | "W", micro-batch index, local chunk index)
TABLE_SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")


def schedule_problem(schedule: str, num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> str | None:
    """Why the table of these sizes does not exist (one phrase), or None when it does."""
    p, m, v = num_stages, num_microbatches, virtual_stages
    if schedule not in TABLE_SCHEDULES:
        return f"unknown schedule {schedule!r}"
    if schedule == "zb-h1" and v == 1 and p < 2:
        return "the zb-h1 schedule needs at least 2 pipeline stages (one stage has no bubble to fill)"
    if schedule != "interleaved":
        return None if v == 1 else f"virtual_stages {v} needs the interleaved schedule (not {schedule})"
    if v < 2:
        return "the interleaved schedule needs virtual_stages >= 2 (with 1 it is 1f1b)"
    if p < 2:
        return "the interleaved schedule needs at least 2 pipeline stages"
    if m % p:
        return f"the interleaved schedule needs num_microbatches ({m}) to be a multiple of the stage count ({p})"
    return None


def stage_slots(schedule: str, num_stages: int, stage: int, num_microbatches: int,
                virtual_stages: int = 1) -> list[list[Action]]:
    """The actions stage ``stage`` of a ``num_stages``-stage pipeline runs for ``num_microbatches``, in
    communication slots: a stage receives every input of a slot before running it and sends its outputs
    after it (one batch of sends and receives between two slots).

    1F1B and GPipe: one action per slot. Interleaved: the steady state's (forward, backward) pairs share
    a slot, as in Megatron's ``send_forward_backward_recv_forward_backward``; one action per slot there
    deadlocks (e.g. p = 2, v = 2, m = 4: both stages send a gradient the other receives one slot later).
    Raises ValueError when the sizes have no table (``schedule_problem`` says why).
    """
    p, s, m, v = num_stages, stage, num_microbatches, virtual_stages
    problem = schedule_problem(schedule, p, m, v)
    if problem is not None:
        raise ValueError(problem)
    if schedule == "gpipe":
        return [[("F", k, 0)] for k in range(m)] + [[("B", k, 0)] for k in range(m)]
    if schedule == "zb-h1":
        return zero_bubble_slots(p, s, m)
    if schedule == "1f1b":
        fwd = [("F", k, 0) for k in range(m)]
        bwd = [("B", k, 0) for k in range(m)]
        warm = min(p - s - 1, m)
    else:
        n = m * v
        fwd = [("F", (i // (p * v)) * p + i % p, (i // p) % v) for i in range(n)]
        bwd = [("B", (i // (p * v)) * p + i % p, v - 1 - (i // p) % v) for i in range(n)]
        warm = min(2 * (p - s - 1) + (v - 1) * p, n)
    pairs = [[f, b] for f, b in zip(fwd[warm:], bwd)]
    if schedule == "1f1b":
        pairs = [[a] for pair in pairs for a in pair]
    return [[f] for f in fwd[:warm]] + pairs + [[b] for b in bwd[len(fwd) - warm:]]


def zero_bubble_slots(num_stages: int, stage: int, num_microbatches: int) -> list[list[Action]]:
    """ZB-H1's actions for stage ``stage``, one per slot: 1F1B's order with every backward split into B
    then, s backwards later (s = ``stage``), its W; the last s W's close the step. W slots send and
    receive nothing."""
    p, s, m = num_stages, stage, num_microbatches
    out: list[list[Action]] = []
    w = 0
    for kind, k, c in (a for slot in stage_slots("1f1b", p, s, m) for a in slot):
        out.append([(kind, k, c)])
        if kind == "B" and k >= s:
            out.append([("W", w, 0)])
            w += 1
    return out + [[("W", k, 0)] for k in range(w, m)]


def schedule_table(schedule: str, num_stages: int, num_microbatches: int, virtual_stages: int = 1,
                   ) -> list[list[list[Action]]]:
    """Every stage's slots (``stage_slots`` for s = 0 .. p - 1)."""
    return [stage_slots(schedule, num_stages, s, num_microbatches, virtual_stages) for s in range(num_stages)]


def inflight_profile(actions: Sequence[Action], virtual_stages: int = 1) -> list[tuple[int, ...]]:
    """Per chunk, the micro-batches whose activations the stage holds after each forward (F run, B not yet;
    in a table with W actions, W not yet: the weight gradient needs the saved activations).

    The peaks of activation memory are right after forwards, so these are the points to weigh.
    """
    live = [0] * virtual_stages
    out = []
    frees = "W" if any(kind == "W" for kind, _, _ in actions) else "B"
    for kind, _, c in actions:
        if kind == "F":
            live[c] += 1
            out.append(tuple(live))
        elif kind == frees:
            live[c] -= 1
    return out


def simulate_step(table: Sequence[Sequence[Sequence[Action]]], fwd_s: Sequence[float], bwd_s: Sequence[float],
                  p2p_s: Sequence[float], wgt_s: Sequence[float] | None = None) -> float:
    """Time for every stage to run its slots (``schedule_table``), as the runtime runs them: a slot starts
    when its stage is free and every input of the slot has arrived; its actions run back to back; its
    outputs leave when the slot ends.

    ``fwd_s[g]`` / ``bwd_s[g]``: one micro-batch's forward / backward on virtual stage g (g = c * p + s);
    ``p2p_s[g]``: the one-way transfer from virtual stage g to g + 1 (activations forward, gradients
    back; the last entry is unused). A forward of g > 0 needs g - 1's forward of the micro-batch, a
    backward of g < last g + 1's backward. ``wgt_s[g]``: a W action's time (tables with W only; their
    ``bwd_s`` is then the B part); a W needs nothing but its stage. Raises RuntimeError on a deadlock.
    """
    seconds = {"F": fwd_s, "B": bwd_s, "W": wgt_s}
    p = len(table)
    last = len(fwd_s) - 1
    sent: dict[tuple[str, int, int], float] = {}  # (kind, micro-batch, virtual stage) -> when its output left
    pos, clock = [0] * p, [0.0] * p
    remaining = sum(len(slots) for slots in table)
    while remaining:
        moved = False
        for s in range(p):
            slots = table[s]
            while pos[s] < len(slots):
                start = clock[s]
                for kind, k, c in slots[pos[s]]:
                    g = c * p + s
                    if kind == "F" and g > 0:
                        dep, delay = ("F", k, g - 1), p2p_s[g - 1]
                    elif kind == "B" and g < last:
                        dep, delay = ("B", k, g + 1), p2p_s[g]
                    else:
                        continue
                    if dep not in sent:
                        break
                    start = max(start, sent[dep] + delay)
                else:
                    end = start + sum(seconds[kind][c * p + s] for kind, k, c in slots[pos[s]])
                    for kind, k, c in slots[pos[s]]:
                        sent[(kind, k, c * p + s)] = end
                    clock[s] = end
                    pos[s] += 1
                    remaining -= 1
                    moved = True
                    continue
                break
        if not moved:
            raise RuntimeError(f"schedule deadlocks at slots {pos}")
    return max(clock)
