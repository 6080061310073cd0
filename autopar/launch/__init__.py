"""Launch scripts for a plan: torchrun per node (static rendezvous, ranks = plan device ids) or SLURM.

``write_launch_scripts(plan, "train.py", "launch/")`` writes into ``launch/``:

* ``plan.yaml``: a copy of the plan; every script passes ``--plan <it>`` to the training script;
* ``node<i>.sh``: torchrun for node i of the plan's cluster (``MASTER_ADDR=<node 0> bash node<i>.sh``);
* ``run_local.sh``: for one-node clusters (``4xcpu``, ``8xA100-80G``), all ranks here via ``--standalone``;
* ``autopar.sbatch`` (scheduler ``slurm``): ``sbatch`` it; it runs ``node<SLURM_NODEID>.sh`` on each node;
* ``autopar-launch.txt``: the manifest of these files (autopar.launch.outdir: a later launch into the same
  directory replaces them and removes the stale ones; a non-empty directory without it is refused).

``options`` (``LaunchOptions``) sets the torchrun the scripts call, the head address and port, the log
directory and the SLURM settings (autopar.launch.options).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from autopar.errors import AutoparError
from autopar.fileio import write_text_atomic
from autopar.launch.options import LaunchOptions, resolve
from autopar.launch.outdir import previous_files, remove_stale, write_manifest
from autopar.launch.slurm import sbatch_script
from autopar.launch.torchrun import RENDEZVOUS, local_script, node_script
from autopar.plan.io import load_plan, save_plan
from autopar.plan.schema import Plan
from autopar.plan.validate import validate_plan

SCHEDULERS = ("torchrun", "slurm")

__all__ = ["RENDEZVOUS", "SCHEDULERS", "LaunchOptions", "write_launch_scripts"]


def write_launch_scripts(plan: Plan | str | os.PathLike, script: str | os.PathLike, out_dir: str | os.PathLike,
                         scheduler: str = "torchrun", script_args: Sequence[str] = (),
                         rendezvous: str = "static", job_name: str = "autopar",
                         options: LaunchOptions | None = None) -> list[Path]:
    """Write the plan copy and launch scripts into ``out_dir``; return their paths (plan first).

    The plan must pass ``validate_plan`` (without a model): it is refused before anything is
    written. ``script`` must be an existing file; its absolute path goes into the scripts.
    ``script_args`` follow ``--plan PLAN`` on the training script's command line, shell-quoted (any
    text). Paths must be printable (a newline would end a comment line of the scripts), the job name
    plain; every name of the plan was checked when it was read (autopar.fields.as_name), and comment
    lines are rendered without control characters whatever they hold. Files are written whole
    (autopar.fileio): scripts executable as the umask allows. ``out_dir`` must be new, empty, or written
    by an earlier call (its manifest); every option is checked (autopar.launch.options) before writing.
    """
    if scheduler not in SCHEDULERS:
        raise AutoparError("scheduler", f"unknown scheduler {scheduler!r}", f"use one of {', '.join(SCHEDULERS)}")
    if rendezvous not in RENDEZVOUS:
        raise AutoparError("rendezvous", f"unknown rendezvous {rendezvous!r}", f"use one of {', '.join(RENDEZVOUS)}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", job_name):
        raise AutoparError("job_name", f"{job_name!r} is not a safe SLURM job name", "use letters, digits, _ . -")
    for field, value in (("script", script), ("out_dir", out_dir), *(("script_args", a) for a in script_args)):
        if not isinstance(value, (str, os.PathLike)):
            raise AutoparError(field, f"is {type(value).__name__} ({value!r}), expected a string", "pass text")
        # arguments may hold any text (quoted); paths also appear in comments: no control characters
        if field != "script_args" and not os.fspath(value).isprintable():
            raise AutoparError(field, f"{os.fspath(value)!r} holds a control character (a newline?)",
                               "choose a path without control characters")
    script_path = Path(script)
    if not script_path.is_file():
        raise AutoparError("script", f"training script {script} does not exist",
                           "give the path of your training script (it receives --plan PLAN)")
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    validate_plan(plan)
    script_s, args = str(script_path.resolve()), [str(a) for a in script_args]
    cluster = plan.cluster
    res = resolve(options, cluster, scheduler)
    texts: dict[str, str] = {f"node{i}.sh": node_script(plan, i, script_s, args, rendezvous, res)
                             for i in range(cluster.num_nodes)}
    if cluster.num_nodes == 1:
        texts["run_local.sh"] = local_script(plan, script_s, args, res)
    out = Path(out_dir)
    if scheduler == "slurm":
        texts["autopar.sbatch"] = sbatch_script(plan, out.resolve(), job_name, res)
    old = previous_files(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AutoparError("out_dir", f"cannot create {out}: {e.strerror or e}", "choose a writable directory (-o)") from e
    names = ["plan.yaml", *texts]
    write_manifest(out, old + names)  # an interrupted call still lists everything it may have written
    written = [save_plan(plan, out / "plan.yaml")]
    for name, text in texts.items():
        written.append(write_text_atomic(out / name, text, "out_dir", executable=True))
    remove_stale(out, old, names)
    write_manifest(out, names)
    return written
