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
bubble and peak in-flight activations from them (``inflight_profile``, ``simulate_schedule``), so the
two cannot drift. This module is pure: no autopar, no torch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

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


def peak_inflight(slots: Sequence[Sequence[Action]], chunk_bytes: Sequence[float]) -> tuple[int, ...]:
    """Per chunk, the micro-batches in flight on one stage (its row of a schedule table: ``slots``) where it holds
    the most activation bytes, a chunk's micro-batch weighing ``chunk_bytes[chunk]`` (all 1: the most micro-batches)."""
    profile = inflight_profile([a for slot in slots for a in slot], len(chunk_bytes))
    return max(profile, key=lambda live: sum(n * b for n, b in zip(live, chunk_bytes)))

Structure = tuple  # (micro-batches, links, per stage per slot: (terms, deps, outs)): see table_structure


def table_structure(table: Sequence[Sequence[Sequence[Action]]], G: int) -> Structure:
    """What ``simulate_schedule`` needs of a table whatever the times: per slot its actions as (kind 0 F / 1 B
    / 2 W, virtual stage g), the keys of the outputs it waits for, and its outputs as (key, link, 0: activations
    on ``p2p_s[g]`` / 1: gradients on ``bwd_p2p_s[g]``, g); links numbered per (stage, receiving stage)."""
    p = len(table)
    last = G - 1
    m = 1 + max((k for slots in table for slot in slots for _, k, _ in slot), default=0)
    links: dict[tuple[int, int], int] = {}
    shape = []
    for s, slots in enumerate(table):
        rows = []
        for slot in slots:
            terms, deps, outs = [], [], []
            for kind, k, c in slot:
                g = c * p + s
                if kind == "W":
                    terms.append((2, g))
                    continue
                if kind == "F":
                    terms.append((0, g))
                    if g > 0:
                        deps.append(k * G + g - 1)
                    to, d, dg = (g + 1, 0, g) if g < last else (-1, 0, 0)
                else:
                    terms.append((1, g))
                    if g < last:
                        deps.append((m + k) * G + g + 1)
                    to, d, dg = (g - 1, 1, g - 1) if g > 0 else (-1, 1, 0)
                link = -1 if to < 0 else links.setdefault((s, to % p), len(links))
                outs.append((((kind == "B") * m + k) * G + g, link, d, dg))
            rows.append((tuple(terms), tuple(deps), tuple(outs)))
        shape.append(tuple(rows))
    return m, len(links), tuple(shape)


@functools.lru_cache(maxsize=32)
def cached_structure(schedule: str, num_stages: int, num_microbatches: int, virtual_stages: int = 1,
                     ) -> tuple[list, Structure]:
    """(``schedule_table``, ``table_structure``) of these sizes, built once: a search simulates the same table
    at many stage times. Callers must not modify the table."""
    table = schedule_table(schedule, num_stages, num_microbatches, virtual_stages)
    return table, table_structure(table, num_stages * virtual_stages)


class Simulation(NamedTuple):
    """What ``simulate_schedule`` found: the step, and when each slot ran and each output travelled."""

    step_s: float  # every stage done with its slots and its tail
    ends: list[float]  # per stage: when its last slot ended (its tail starts there)
    slots: list[list[tuple[float, float]]]  # per stage, per slot: (start, end)
    sends: dict[tuple[str, int, int], tuple[float, float]]  # (kind, micro-batch, virtual stage) -> its output on the link


def simulate_schedule(table: Sequence[Sequence[Sequence[Action]]], fwd_s: Sequence[float], bwd_s: Sequence[float],
                      p2p_s: Sequence[float], *, bwd_p2p_s: Sequence[float] | None = None,
                      tails: Sequence[float] | None = None, wgt_s: Sequence[float] | None = None,
                      record: bool = False, structure: Structure | None = None) -> Simulation:
    """Run every stage's slots (``schedule_table``) as the runtime runs them: a slot starts when its stage
    is free and every input of the slot has arrived; its actions run back to back; its outputs leave when
    the slot ends, each on the link from its stage to the receiving stage, which carries one transfer at
    a time in the order they were sent (a transfer takes the link for its whole time; the sender goes on).

    ``fwd_s[g]`` / ``bwd_s[g]``: one micro-batch's forward / backward on virtual stage g (g = c * p + s);
    ``p2p_s[g]``: the transfer of activations from virtual stage g to g + 1, ``bwd_p2p_s[g]`` (default
    ``p2p_s``) of gradients from g + 1 back to g (the last entries are unused). A forward of g > 0 needs
    g - 1's forward of the micro-batch, a backward of g < last g + 1's backward. ``tails[s]`` (default 0):
    what physical stage s runs once after its last slot (gradient sync not hidden, optimizer); the step
    ends when every stage has run its tail. ``wgt_s[g]``: a W action's time (tables with W only, ``zb-h1``:
    their ``bwd_s`` is then the B part); a W needs nothing but its stage and sends nothing. ``record``:
    also return each slot's (start, end) and each transfer's (leave, arrive) (else ``slots`` and ``sends``
    are empty). ``structure``: ``table_structure(table, len(fwd_s))`` when the caller has it (``cached_structure``:
    the same table simulated at many times builds it once). Raises RuntimeError on a deadlock.
    """
    p = len(table)
    G = len(fwd_s)
    back = p2p_s if bwd_p2p_s is None else bwd_p2p_s
    tails = [0.0] * p if tails is None else tails
    m, nlinks, shape = structure if structure is not None else table_structure(table, G)
    seconds = (fwd_s, bwd_s, wgt_s)
    delays = (p2p_s, back)
    arrived = [-1.0] * (2 * m * G)
    link_free = [0.0] * nlinks
    pos, clock = [0] * p, [0.0] * p
    times: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    leaves: dict[int, float] = {}
    remaining = sum(len(slots) for slots in table)
    while remaining:
        moved = False
        for s in range(p):
            rows, i, t = shape[s], pos[s], clock[s]
            while i < len(rows):
                terms, deps, outs = rows[i]
                start = t
                for d in deps:
                    a = arrived[d]
                    if a < 0.0:
                        break
                    if a > start:
                        start = a
                else:
                    dur = 0.0  # summed first, then added: the slot's time exactly as its actions' sum
                    for kind, g in terms:
                        dur += seconds[kind][g]
                    t = start + dur
                    for out, link, d, g in outs:
                        if link < 0:
                            arrived[out] = t
                            continue
                        leave = t if t > link_free[link] else link_free[link]
                        link_free[link] = arrived[out] = leave + delays[d][g]
                        if record:
                            leaves[out] = leave
                    if record:
                        times[s].append((start, t))
                    i += 1
                    continue
                break
            if i != pos[s]:
                moved = True
                remaining -= i - pos[s]
                pos[s], clock[s] = i, t
        if not moved:
            raise RuntimeError(f"schedule deadlocks at slots {pos}")
    step = max((c + t for c, t in zip(clock, tails)), default=0.0)
    sends: dict[tuple[str, int, int], tuple[float, float]] = {}
    for out, leave in leaves.items():
        kk, g = divmod(out, G)
        kind, k = divmod(kk, m)
        sends[("B" if kind else "F", k, g)] = (leave, arrived[out])
    return Simulation(step, clock, times, sends)
