"""What a user may set on the launch scripts, checked before anything is written.

``LaunchOptions`` holds the values as given (``autopar launch`` flags or library keywords);
``resolve`` checks every one and returns a ``Resolved`` with the paths made absolute and the
environment the scripts were written for (the torchrun they call and the Python that picks a free port).

* ``torchrun``: a path to an executable file (absolute in the scripts), or a bare command name looked
  up on the nodes' PATH when the script runs; default the ``torchrun`` beside this interpreter
  (``<dir of sys.executable>/torchrun``, the virtual environment autopar runs in).
* ``master_addr``: the head node's address for the per-node torchrun scripts (default: node 0 finds its
  own, the others need ``MASTER_ADDR``); ``port``: the rendezvous port (default: a free one, picked on
  the head node when the job starts).
* ``log_dir``: where torchrun writes each rank's stdout/stderr (``<log_dir>/node<k>/...``; default the
  ``logs`` folder beside the scripts).
* SLURM only: ``time``, ``partition``, ``cpus_per_task``, ``gpus_per_node`` become ``#SBATCH`` lines.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError

# SLURM's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (and 0 or UNLIMITED: no limit)
_TIME = re.compile(r"\d+(:[0-5]?\d){0,2}|\d+-\d{1,2}(:[0-5]?\d){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}(,[A-Za-z0-9_.-]{1,64})*")
_GPUS = re.compile(r"(?:([A-Za-z0-9_.-]{1,64}):)?(\d{1,4})")
_ADDR = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")
_COMMAND = re.compile(r"[A-Za-z0-9_.+-]{1,128}")
SLURM_ONLY = ("time", "partition", "cpus_per_task", "gpus_per_node")


@dataclass
class LaunchOptions:
    """Settings of the launch scripts (None: the default described in the module docstring)."""

    torchrun: str | None = None
    master_addr: str | None = None
    port: int | None = None
    log_dir: str | os.PathLike | None = None
    time: str | None = None
    partition: str | None = None
    cpus_per_task: int | None = None
    gpus_per_node: str | None = None


@dataclass(frozen=True)
class Resolved:
    """Checked options: ``torchrun`` and ``python`` as the scripts write them, ``log_dir`` absolute or None."""

    torchrun: str
    python: str
    master_addr: str | None
    port: int | None
    log_dir: str | None
    time: str | None
    partition: str | None
    cpus_per_task: int | None
    gpus_per_node: str | None


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _torchrun(value: str | None) -> tuple[str, str]:
    """(torchrun as the scripts call it, the Python that picks a free port)."""
    if value is None:
        here = Path(sys.executable).parent  # not resolved: a venv's python is a symlink out of the venv
        tr = here / "torchrun"
        if not (tr.is_file() and os.access(tr, os.X_OK)):
            raise AutoparError("--torchrun", f"no torchrun beside this interpreter ({tr} is missing)",
                               "pass --torchrun PATH (the torchrun of the environment the nodes run), or "
                               "--torchrun torchrun to use the one on the nodes' PATH")
        return str(tr.absolute()), str(Path(sys.executable).absolute())
    if not isinstance(value, str) or not value.isprintable() or not value:
        raise AutoparError("--torchrun", f"{value!r} is not a path or command name",
                           "give the path of torchrun (printable characters only)")
    if "/" not in value:
        if not _COMMAND.fullmatch(value):
            raise AutoparError("--torchrun", f"{value!r} is not a plain command name",
                               "give a path, or a name of letters, digits, _ . + -")
        return value, "python3"  # looked up on the nodes' PATH when the script runs
    path = Path(value).expanduser().absolute()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise AutoparError("--torchrun", f"{value} is not an executable file",
                           "give the torchrun of the environment the nodes run (e.g. .venv/bin/torchrun)")
    py = path.parent / "python"
    return str(path), str(py) if py.is_file() and os.access(py, os.X_OK) else "python3"


def _gpus_per_node(value: str, cluster: Cluster) -> str:
    m = _GPUS.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise AutoparError("--gpus-per-node", f"{value!r} is not N or TYPE:N", "give e.g. 8 or a100:8")
    counts = sorted({nd.count for nd in cluster.nodes})
    if any(nd.gpu.vendor == "cpu" or nd.gpu.name.lower() == "cpu" for nd in cluster.nodes):
        raise AutoparError("--gpus-per-node", "the plan's nodes are CPUs", "leave --gpus-per-node out")
    if len(counts) > 1:
        raise AutoparError("--gpus-per-node", f"the plan's nodes have {', '.join(map(str, counts))} GPUs; one value "
                           "cannot fit them all", "leave it out: each node group gets its own count")
    if int(m.group(2)) != counts[0]:
        raise AutoparError("--gpus-per-node", f"{m.group(2)} differs from the plan's {counts[0]} GPUs per node",
                           f"give {counts[0]} (optionally TYPE:{counts[0]}), or search a plan for that node size")
    return value


def resolve(opts: LaunchOptions | None, cluster: Cluster | None, scheduler: str) -> Resolved:
    """Check every option against the plan's cluster and the scheduler; AutoparError naming the flag."""
    opts = opts or LaunchOptions()
    if scheduler != "slurm":
        for field in SLURM_ONLY:
            if getattr(opts, field) is not None:
                raise AutoparError(_flag(field), "is a SLURM setting", "add --scheduler slurm, or leave it out")
    torchrun, python = _torchrun(opts.torchrun)
    if opts.master_addr is not None and not (isinstance(opts.master_addr, str) and _ADDR.fullmatch(opts.master_addr)):
        raise AutoparError("--master-addr", f"{opts.master_addr!r} is not a host name or IP address",
                           "give node 0's address, e.g. 10.0.0.1 or node001")
    port = opts.port
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise AutoparError("--port", f"{port!r} is not a TCP port", "give a whole number in 1..65535")
    log_dir = None
    if opts.log_dir is not None:
        text = os.fspath(opts.log_dir) if isinstance(opts.log_dir, (str, os.PathLike)) else None
        if not text or not text.isprintable():
            raise AutoparError("--log-dir", f"{opts.log_dir!r} is not a printable path",
                               "choose a directory path without control characters")
        log_dir = str(Path(text).expanduser().absolute())
    if opts.time is not None and not (isinstance(opts.time, str) and _TIME.fullmatch(opts.time)):
        raise AutoparError("--time", f"{opts.time!r} is not a SLURM time limit",
                           "give minutes, H:M:S or D-H:M:S, e.g. 90 or 1-12:00:00")
    if opts.partition is not None and not (isinstance(opts.partition, str) and _PARTITION.fullmatch(opts.partition)):
        raise AutoparError("--partition", f"{opts.partition!r} is not a partition name",
                           "give a name (or comma-separated names) of letters, digits, _ . -")
    cpus = opts.cpus_per_task
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1):
        raise AutoparError("--cpus-per-task", f"{cpus!r} is not a positive whole number",
                           "give the CPUs each node's task (all its ranks) may use, e.g. 32")
    gpus = None if opts.gpus_per_node is None or cluster is None else _gpus_per_node(opts.gpus_per_node, cluster)
    return Resolved(torchrun, python, opts.master_addr, port, log_dir, opts.time, opts.partition, cpus, gpus)
