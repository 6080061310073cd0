"""Is anyone else using this machine's CPUs? Timings on a shared host are only worth keeping when not.

``cpu_busy_share`` samples /proc/stat; ``wait_for_quiet`` waits (bounded) until the CPUs are idle
before a measurement; ``OthersMeter`` measures, over a block of our own work, the share of the CPUs
that *other* processes used: all busy time (and steal time, on a VM) minus the CPU time of this
process and its reaped children (the fork-started ranks). Linux only; elsewhere they report None.
"""

from __future__ import annotations

import os
import resource
import time


def _stat() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    vals = [float(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    idle = vals[3] + vals[4]
    total = sum(vals)
    return (total - idle) / hz, total / hz


def _own_cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def cpu_busy_share(interval: float = 0.5) -> float | None:
    """Fraction of all CPUs busy over the next ``interval`` seconds (ours included)."""
    a = _stat()
    if a is None:
        return None
    time.sleep(interval)
    b = _stat()
    return (b[0] - a[0]) / max(b[1] - a[1], 1e-9)


def wait_for_quiet(threshold: float = 0.1, max_wait_s: float = 120.0, interval: float = 0.5) -> dict:
    """Block until the CPUs are less than ``threshold`` busy, or ``max_wait_s`` passed; report both."""
    t0 = time.monotonic()
    share = cpu_busy_share(interval)
    while share is not None and share > threshold and time.monotonic() - t0 < max_wait_s:
        share = cpu_busy_share(interval)
    return {"waited_s": round(time.monotonic() - t0, 1), "busy_share": share}


class OthersMeter:
    """``with OthersMeter() as m: ...`` then ``m.share``: CPU share other processes took meanwhile."""

    def __enter__(self) -> OthersMeter:
        self.stat, self.own, self.t = _stat(), _own_cpu(), time.monotonic()
        self.share = None
        return self

    def __exit__(self, *exc) -> None:
        end = _stat()
        if self.stat is None or end is None:
            return
        busy = end[0] - self.stat[0]
        total = end[1] - self.stat[1]
        mine = _own_cpu() - self.own
        self.share = max(0.0, busy - mine) / max(total, 1e-9)


def collective_device():
    """Where small tensors for collectives on the default group must live (NCCL: this rank's GPU)."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def quietly(fn, threshold: float = 0.1, tries: int = 3, pause_s: float = 1.0):
    """Run ``fn()`` on every rank of the default group until other processes took at most ``threshold``
    of the CPUs meanwhile (at most ``tries`` times); returns (result, others' share of the last try).

    Collective: every rank must call it with the same arguments. The ranks sum their own CPU time and
    take the machine's busy time from rank 0, so all of them reach the same decision.
    """
    import torch
    import torch.distributed as dist

    share = None
    for attempt in range(tries):
        dist.barrier()
        st0, c0 = _stat(), time.process_time()
        result = fn()
        c1, st1 = time.process_time(), _stat()
        if st0 is None or st1 is None:
            return result, None
        first = dist.get_rank() == 0
        t = torch.tensor([c1 - c0, (st1[0] - st0[0]) if first else 0.0, (st1[1] - st0[1]) if first else 0.0],
                         dtype=torch.float64, device=collective_device())
        dist.all_reduce(t)
        share = max(0.0, float(t[1] - t[0])) / max(float(t[2]), 1e-9)
        if share <= threshold:
            break
        if attempt + 1 < tries:
            time.sleep(pause_s)
    return result, share
