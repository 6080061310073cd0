"""A reader of NVIDIA nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``alltoall_perf``, ``sendrecv_perf``): the text each binary prints, as ``src/util.cu`` writes it.

What a run prints and what is read from it::

    # nccl-tests version 2.18.2 ...                  (newer versions)
    # Collective test starting: all_reduce_perf       (newer versions: which collective)
    # nThread 1 nGpus 8 minBytes 8 maxBytes ... step: 2(factor) warmup iters: 1 iters: 20 ...
    # Using devices
    #  Rank  0 Group  0 Pid  27238 on   crazy device  0 [0000:01:00] NVIDIA GeForce RTX 5090
                                                      (older: no "Group"; one line per rank: ranks, hosts, GPU)
    #       size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong
                                                      (the column header: out-of-place, then in-place;
                                                       older versions lack "root" and call #wrong "error")
         8  2  float  sum  -1  25.47  0.00  0.00  0  24.82  0.00  0.00  0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 66.4834

A data row is a line of the table whose type and redop columns hold an nccl-tests type and operation
name; its size, count and times must then parse, or the file is refused (one line naming the file,
the line and the field). Other lines (launcher noise, NCCL INFO, mpirun's ``[1,0]<stdout>:`` prefixes,
which are stripped) are not part of the table. ``size`` is bytes as NCCL counts them: the buffer of
an all-reduce, the gathered output of an all-gather, the input of a reduce-scatter, what each rank
sends in all and what one send moves in sendrecv; ``algbw = size / time`` for all five.

Refused: no data rows, a ``#wrong`` other than 0 (``N/A``: not checked, accepted), runs of different
GPU counts in one file, no device lines (GPUs and hosts unknown), a rank listed twice (each process
ran its own job), mixed GPU types, CPU time (``-C 1``) instead of the collective's time, a size or
time that does not parse, and an ``algbw`` column that is not ``size / time`` (columns out of line).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError

# nccl-tests binary -> the collective as autopar's cost model names it
COLLECTIVES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter",
               "alltoall": "alltoall", "sendrecv": "sendrecv"}
TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
         "f8e4m3", "f8e5m2", "char", "int"}
OPS = {"sum", "prod", "max", "min", "avg", "mulsum", "none"}
WRONG = ("#wrong", "error")  # the error-count column's name in newer / older versions
FIX = "give the complete text all_reduce_perf (or its siblings) printed"
_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")  # mpirun --tag-output
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[([^\]]*)\]\s*(.*?)\s*$")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_NTHREAD = re.compile(r"^#?\s*nThread\s+\d+\s+nGpus\s+\d+")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_NAMED = re.compile(r"(?:^|[^a-z])(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv)(?:_perf)?(?:[^a-z]|$)")


@dataclass(frozen=True)
class Row:
    """One size of a table: bytes, seconds out of place and in place (None where not printed)."""

    size: int
    time_s: float
    inplace_s: float | None
    line: int


@dataclass(frozen=True)
class NcclTable:
    """One nccl-tests run: which collective, over which ranks on which hosts, and its rows."""

    path: str
    collective: str  # autopar's name (COLLECTIVES' values)
    ranks: int  # GPUs in one group (the reported bandwidth is per group)
    hosts: tuple[str, ...]  # host of each rank of the first group, in rank order
    gpu: str  # the device name nccl-tests printed
    rows: tuple[Row, ...]
    avg_busbw_gbps: float | None  # the "# Avg bus bandwidth" line, where printed

    @property
    def n_nodes(self) -> int:
        return len(set(self.hosts))

    @property
    def n_local(self) -> int:
        """Most ranks on one host."""
        return max(self.hosts.count(h) for h in set(self.hosts))

    def describe(self) -> str:
        where = "1 host" if self.n_nodes == 1 else f"{self.n_nodes} hosts x {self.n_local}"
        return f"{self.collective} over {self.ranks} GPU(s) ({where}) of {self.gpu}"


def collective_of(name: str) -> str | None:
    """The collective a file or binary name names (``all_reduce_perf.txt`` -> allreduce), or None."""
    m = _NAMED.search(Path(name).name.lower())
    return COLLECTIVES[m.group(1)] if m else None


def _num(tok: str, where: str, field: str) -> float:
    try:
        v = float(tok)
    except ValueError:
        raise AutoparError(f"{where} {field}", f"is {tok!r}, not a number", FIX) from None
    if not math.isfinite(v) or v < 0:
        raise AutoparError(f"{where} {field}", f"is {tok!r}", FIX)
    return v


class _Run:
    """What one run's lines said so far (``parse_text`` fills it line by line)."""

    def __init__(self) -> None:
        self.starting: str | None = None
        self.devices: dict[int, tuple[int, str, str]] = {}  # rank -> (group, host, gpu name)
        self.columns: list[str] | None = None
        self.rows: list[Row] = []
        self.avg: float | None = None

    def empty(self) -> bool:
        return not (self.devices or self.rows or self.columns)


def _row(tokens: list[str], cols: list[str], where: str) -> Row:
    """A data row read by the column header's layout (out-of-place time, then in-place)."""
    size = tokens[0]
    if not size.isdigit():
        raise AutoparError(f"{where} size", f"is {size!r}, not a whole number of bytes", FIX)
    times = [i for i, c in enumerate(cols) if c in ("time", "cputime")]
    wrongs = [i for i, c in enumerate(cols) if c in WRONG]
    if len(tokens) < times[0] + 3:
        raise AutoparError(where, f"has {len(tokens)} columns, the header names {len(cols)}", FIX)
    vals = []
    for ti in times:
        if ti >= len(tokens):
            vals.append(None)
            continue
        t = _num(tokens[ti], where, "time (us)")
        if t <= 0:
            raise AutoparError(f"{where} time (us)", f"is {tokens[ti]}: no collective takes no time", FIX)
        alg = _num(tokens[ti + 1], where, "algbw (GB/s)")
        if abs(int(size) / 1e3 / t - alg) > 0.006 + 0.02 * alg:
            raise AutoparError(f"{where} algbw", f"is {alg:g} GB/s but size / time is {int(size) / 1e3 / t:.4g}: "
                               "the columns are out of line", FIX)
        vals.append(t * 1e-6)
    for wi in wrongs:
        if wi < len(tokens) and tokens[wi] != "N/A" and _num(tokens[wi], where, "#wrong") != 0:
            raise AutoparError(f"{where} #wrong", f"is {tokens[wi]}: NCCL returned wrong results at this size",
                               "fix the system and measure again; a run with errors is not a measurement")
    return Row(int(size), vals[0], vals[1] if len(vals) > 1 else None, 0)


def parse_text(text: str, path: str = "<text>") -> list[_Run]:
    """The runs in nccl-tests output ``text`` (several when outputs were concatenated), unchecked."""
    runs = [_Run()]
    for no, raw in enumerate(text.splitlines(), start=1):
        line = _PREFIX.sub("", raw).strip()
        where = f"{path}:{no}"
        if _STARTING.match(line) or _NTHREAD.match(line) or line.startswith("# nccl-tests version"):
            if not runs[-1].empty():  # a run's header comes before its devices and rows: the next run
                runs.append(_Run())
            if m := _STARTING.match(line):
                runs[-1].starting = m.group(1)
            continue
        run = runs[-1]
        if m := _RANK.match(line):
            rank = int(m.group(1))
            if rank in run.devices:
                raise AutoparError(f"{where} Rank", f"rank {rank} is listed twice: each process ran a job of its own",
                                   "build nccl-tests with MPI=1 and launch one job over all GPUs")
            run.devices[rank] = (int(m.group(2) or 0), m.group(4), m.group(7) or "unknown GPU")
        elif line.startswith("#") and {"size", "count", "type", "redop"} <= set(line[1:].split()):
            run.columns = line[1:].split()
            if "cputime" in run.columns:
                raise AutoparError(f"{where} cputime", "the run reports CPU time (-C 1), not the collective's time",
                                   "measure again without -C 1")
            if "time" not in run.columns:
                raise AutoparError(f"{where} time", "the column header names no time column", FIX)
        elif m := _AVG.match(line):
            run.avg = float(m.group(1))
        elif not line.startswith("#"):
            tokens = line.split()
            cols = run.columns or ["size", "count", "type", "redop"]
            t_at, op_at = cols.index("type"), cols.index("redop")
            if len(tokens) > op_at and tokens[t_at] in TYPES and tokens[op_at] in OPS:
                if run.columns is None:
                    raise AutoparError(f"{where} size", "a table row comes before any column header "
                                       "(# size count type redop ...)", FIX)
                row = _row(tokens, cols, where)
                run.rows.append(Row(row.size, row.time_s, row.inplace_s, no))
    return [r for r in runs if not r.empty()]


def _table(run: _Run, path: str, collective: str | None) -> NcclTable:
    name = collective or (collective_of(run.starting) if run.starting else None) or collective_of(path)
    if name is None:
        raise AutoparError(f"{path} collective", "is not named: no '# Collective test starting' line and the file "
                           "name names none of all_reduce, all_gather, reduce_scatter, alltoall, sendrecv",
                           f"give it as all_reduce={path} (or all_gather=, reduce_scatter=, alltoall=, sendrecv=)")
    if not run.rows:
        raise AutoparError(f"{path} rows", "holds no data rows (size count type redop ... lines)", FIX)
    if not run.devices:
        raise AutoparError(f"{path} devices", "lists no '#  Rank N ... device N [..] GPU' lines: the number of "
                           "GPUs and the hosts they are on are unknown", "keep nccl-tests' whole output, its header too")
    group0 = run.devices[min(run.devices)][0]
    members = sorted(r for r, (g, _, _) in run.devices.items() if g == group0)
    sizes = {g: sum(1 for gg, _, _ in run.devices.values() if gg == g) for g, _, _ in run.devices.values()}
    if len(set(sizes.values())) > 1:
        raise AutoparError(f"{path} Group", f"groups of different sizes {sorted(sizes.values())} (NCCL_TESTS_SPLIT)",
                           "split the GPUs into equal groups")
    gpus = sorted({gpu for _, _, gpu in run.devices.values()})
    if len(gpus) > 1:
        raise AutoparError(f"{path} device", f"mixes GPU types {', '.join(gpus)}", "measure one GPU type per run")
    if len(members) < 2:
        raise AutoparError(f"{path} devices", "lists one GPU per group: nothing is communicated",
                           "run nccl-tests over 2 or more GPUs")
    rows = tuple(r for r in run.rows if r.size > 0)  # a 0-byte call costs nothing in the cost model
    if not rows:
        raise AutoparError(f"{path} size", "every row has size 0", "measure sizes from 8 bytes up (-b 8)")
    return NcclTable(path, name, len(members), tuple(run.devices[r][1] for r in members), gpus[0], rows, run.avg)


def read_nccl_tests(spec: str) -> list[NcclTable]:
    """The runs of one ``--nccl-tests`` argument: ``PATH`` or ``COLLECTIVE=PATH`` (all_reduce=out.txt,
    for outputs that do not name their collective). AutoparError (one line, naming the file and the
    field) for an unreadable file or one the module docstring refuses."""
    collective, path = None, spec
    head, sep, tail = spec.partition("=")
    if sep and head in COLLECTIVES:
        collective, path = COLLECTIVES[head], tail
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise AutoparError("--nccl-tests", f"cannot read {path}: {e.strerror or e}", "give the file nccl-tests wrote") from None
    runs = parse_text(text, path)
    if not runs or not any(r.rows for r in runs):
        raise AutoparError(f"{path} rows", "holds no nccl-tests table (no size count type redop ... rows)",
                           FIX + " (RUNS go before --nccl-tests: autopar calibrate RUNS --nccl-tests FILE)")
    tables = [_table(r, path, collective) for r in runs]
    counts = sorted({t.ranks for t in tables})
    if len(counts) > 1:
        raise AutoparError(f"{path} nGpus", f"holds runs over different GPU counts {counts}",
                           "give each GPU count's runs in a file of its own")
    return tables
