"""A model of the batches a pipeline stage posts (p2p.py), to prove the runtime's schedules deadlock-free."""

from __future__ import annotations

from autopar.runtime import schedule as sched


def comm_points(schedule: str, num_stages: int, stage: int, num_microbatches: int,
                virtual_stages: int = 1) -> list[tuple[set, set]]:
    """The (sends, receives) batches stage ``stage`` posts: before its first action and after each one.

    Batch i carries the sends of slot i - 1 and the receives of slot i (see p2p.py). Messages are
    ("act", boundary, k) forward and ("grad", boundary, k) backward; boundary b joins virtual stages
    b, b + 1 (chunk c of stage s is virtual stage c * p + s; without interleaving, the stage itself).
    """
    slots = sched.stage_slots(schedule, num_stages, stage, num_microbatches, virtual_stages)
    last = num_stages * virtual_stages - 1

    def sends(a):
        kind, k, c = a
        g = c * num_stages + stage
        if kind == "W":  # zb-h1's weight gradients: nothing crosses stages
            return set()
        if kind == "F":
            return {("act", g, k)} if g < last else set()
        return {("grad", g - 1, k)} if g > 0 else set()

    def recvs(a):
        kind, k, c = a
        g = c * num_stages + stage
        if kind == "W":
            return set()
        if kind == "F":
            return {("act", g - 1, k)} if g > 0 else set()
        return {("grad", g, k)} if g < last else set()

    def all_of(f, slot):
        return set().union(*(f(a) for a in slot))

    points = [(set(), all_of(recvs, slots[0]))]
    for i, slot in enumerate(slots):
        points.append((all_of(sends, slot), all_of(recvs, slots[i + 1]) if i + 1 < len(slots) else set()))
    return points


def simulate(schedule: str, num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> int:
    """Play every stage's batches against each other; return the number of rounds, or raise on deadlock.

    Strict model (NCCL's): a batch completes only when the peer has posted the matching receive of each
    of its sends and the matching send of each of its receives; a stage posts its next batch only
    after the previous one completed.
    """
    points = [comm_points(schedule, num_stages, s, num_microbatches, virtual_stages) for s in range(num_stages)]
    pos = [0] * num_stages
    sent: set = set()
    wanted: set = set()
    rounds = 0
    while any(pos[s] < len(points[s]) for s in range(num_stages)):
        for s in range(num_stages):  # post the current batch of every stage
            if pos[s] < len(points[s]):
                snd, rcv = points[s][pos[s]]
                sent |= snd
                wanted |= rcv
        progressed = False
        for s in range(num_stages):
            if pos[s] < len(points[s]):
                snd, rcv = points[s][pos[s]]
                if snd <= wanted and rcv <= sent:
                    pos[s] += 1
                    progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule} deadlocks at batches {pos}")
        rounds += 1
    return rounds
