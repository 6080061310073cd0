"""A discrete-event simulation of one training step of a synchronous pipeline: the oracle the closed
form ``cost_models.pipeline.pipeline_time`` is checked against.

Stage i runs a forward (``f[i]``) and a backward (``b[i]``) per micro-batch in its schedule's order
(GPipe: every forward, then every backward; 1F1B as Megatron-LM orders it: p - i - 1 warm-up
forwards, then one forward and one backward alternately, then the remaining backwards). A forward
needs the previous stage's forward of that micro-batch plus the one-way send ``d[i - 1]``; a backward
needs the next stage's backward plus ``d[i]`` (the last stage: its own forward). After its last
backward, stage i pays its step tail ``s[i]``; the step ends when every stage is done.
"""

from __future__ import annotations


def schedule_order(schedule: str, p: int, i: int, m: int) -> list[tuple[str, int]]:
    """Stage ``i``'s operations in order: ("F", j) / ("B", j) for micro-batch j."""
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(p - i - 1, m)
    ops = [("F", j) for j in range(warm)]
    nf, nb = warm, 0
    while nb < m:
        if nf < m:
            ops.append(("F", nf))
            nf += 1
        ops.append(("B", nb))
        nb += 1
    return ops


def simulate_step(f: list[float], b: list[float], d: list[float], s: list[float], m: int,
                  schedule: str = "1f1b") -> float:
    """The step's makespan: every operation starts when its stage is free and its input has arrived."""
    p = len(f)
    orders = [schedule_order(schedule, p, i, m) for i in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    ptr, free = [0] * p, [0.0] * p
    moved = True
    while moved:
        moved = False
        for i in range(p):
            while ptr[i] < len(orders[i]):
                kind, j = orders[i][ptr[i]]
                if kind == "F":
                    ready = 0.0 if i == 0 else done.get(("F", i - 1, j))
                    ready = ready if ready is None or i == 0 else ready + d[i - 1]
                    length = f[i]
                elif i == p - 1:
                    ready, length = done.get(("F", i, j)), b[i]
                else:
                    ready = done.get(("B", i + 1, j))
                    ready = None if ready is None else ready + d[i]
                    length = b[i]
                if ready is None:
                    break
                free[i] = max(free[i], ready) + length
                done[(kind, i, j)] = free[i]
                ptr[i] += 1
                moved = True
    assert ptr == [len(o) for o in orders], "the schedule deadlocked"
    return max(t + si for t, si in zip(free, s))
