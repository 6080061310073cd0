"""nccl-tests output written by the test, in the exact text nccl-tests prints (``src/util.cu`` of
NVIDIA/nccl-tests: writeDeviceReport, writeResultHeader, writeBenchmarkLinePreamble / Body, writeResultFooter),
with times from a known formula, so a fit must find the formula's parameters again. Generated, not measured:
the published measurements are the files under ``data/``."""

from __future__ import annotations

from collections.abc import Callable

BINARY = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
          "alltoall": "alltoall", "sendrecv": "sendrecv"}


def _float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: 2 decimals, fewer when the width is short."""
    for spec in (f"{width}.2f", f"{width}.1f", f"{width}.0f"):
        s = format(value, spec)
        if len(s) <= width:
            return s
    return format(value, f"{width}.1e")


def nccl_text(collective: str, hosts: list[str], time_s: Callable[[int], float], sizes: list[int],
              gpu: str = "NVIDIA A100-SXM4-80GB", wrong: int = 0) -> str:
    """The output of ``<collective>_perf`` over one rank per entry of ``hosts`` (its host name), with
    ``time_s(size)`` seconds per size (the same out of place and in place)."""
    n = len(hosts)
    factor = {"allreduce": 2 * (n - 1) / n, "sendrecv": 1.0}.get(collective, (n - 1) / n)
    redop = "sum" if collective in ("allreduce", "reduce_scatter", "sendrecv") else "none"
    lines = ["# nccl-tests version 2.18.2 nccl-headers=22907 nccl-library=22907",
             f"# Collective test starting: {BINARY[collective]}_perf",
             f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: 2(factor) warmup iters: 1 "
             "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    local: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        dev = local.setdefault(host, 0)
        local[host] += 1
        lines.append(f"#  Rank {rank:2d} Group {0:2d} Pid {1000 + rank:6d} on {host:>10s} device {dev:2d} "
                     f"[{0:04x}:{16 * dev + 1:02x}:{0:02x}] {gpu}")
    lines += ["#", f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}           out-of-place                       "
              "in-place          ",
              f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  {'algbw':>6s}  "
              f"{'busbw':>6s}  {'#wrong':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s} ",
              f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  "
              f"{'(GB/s)':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s} "]
    busbws = []
    for size in sizes:
        us = time_s(size) * 1e6
        alg = size / 1e3 / us
        busbws.append(alg * factor)
        count = size // 4 if collective in ("allreduce", "sendrecv") else size // 4 // n
        body = f"  {_float(us, 7):>7s}  {_float(alg, 6):>6s}  {_float(alg * factor, 6):>6s}  {wrong:6g}"
        lines.append(f"{size:12d}  {count:12d}  {'float':>8s}  {redop:>6s}  {-1:6d}{body}{body}")
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):g} ", "#",
              f"# Collective test concluded: {BINARY[collective]}_perf", "#"]
    return "\n".join(lines) + "\n"


SIZES = [8 << k for k in range(28)]  # 8 B to 1 GiB, doubling (-b 8 -e 1G -f 2)
