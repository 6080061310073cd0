"""The sbatch file under a real SLURM: two nodes, the two-stage pipeline of test_launch_run.py, training that
equals one process, and a killed rank that ends the whole job (srun --kill-on-bad-exit) instead of a hang.

Runs where ``sinfo`` answers and at least two nodes are idle (skipped elsewhere). On one machine, Debian's
slurm-wlm runs two slurmd with ``-N n1`` / ``-N n2`` (NodeName=n1/n2, NodeHostname=this host, own ports):
``SLURM_CONF=... slurmctld; slurmd -N n1; slurmd -N n2``. The job's environment comes from the submitting
one (sbatch's default ``--export=ALL``), PYTHONPATH included.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_launch_run import ROOT, STEP, WRAP_TRAIN, _two_node_pipeline

from autopar.launch import write_launch_scripts


def _idle_nodes() -> int:
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        return 0
    try:
        r = subprocess.run(["sinfo", "-h", "-t", "idle", "-o", "%D"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(int(x) for x in r.stdout.split() if x.isdigit()) if r.returncode == 0 else 0


pytestmark = [pytest.mark.dist, pytest.mark.slow,
              pytest.mark.skipif(_idle_nodes() < 2, reason="no SLURM cluster with 2 idle nodes here")]


def _submit(tmp_path: Path, steps: list[str]) -> tuple[subprocess.Popen, Path]:
    train = tmp_path / "train.py"
    train.write_text(WRAP_TRAIN)
    paths = write_launch_scripts(_two_node_pipeline(), train, tmp_path / "launch", scheduler="slurm",
                                 script_args=steps)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
           "STATE_OUT": str(tmp_path / "state.pt")}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.Popen(["sbatch", "--wait", str(paths[-1])], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, tmp_path


def _output(tmp_path: Path) -> str:
    outs = list(tmp_path.glob("autopar-*.out"))
    return outs[0].read_text() if outs else ""


def test_two_slurm_nodes_train_like_one_process(tmp_path):
    from tests.runtime.cases import gpt, token_data
    from tests.runtime.reference import reference_train

    proc, _ = _submit(tmp_path, ["--steps", "3"])
    out, err = proc.communicate(timeout=300)
    log = _output(tmp_path)
    assert proc.returncode == 0, err + log
    head = re.search(r"autopar: job \d+: head node (\S+); every node waits for the rendezvous at (\S+):(\d+)", log)
    assert head and not head.group(2).startswith("127."), log  # an address the other nodes can reach
    assert f"node 1 of 2 waits for the rendezvous at {head.group(2)}:{head.group(3)}" in log
    ref, _ = reference_train(gpt, *token_data(), steps=3, lr=0.1)
    for rank in (0, 1):
        got = [float(v) for r, _, v in STEP.findall(log) if int(r) == rank]
        assert got == pytest.approx(ref, abs=1e-5, rel=1e-5)
        assert f"[rank{rank}]: STEP rank={rank}" in log


def test_a_killed_rank_ends_the_slurm_job(tmp_path):
    proc, _ = _submit(tmp_path, ["--steps", "100000", "--pause", "0.05"])
    worker, deadline = None, time.monotonic() + 180
    try:
        while worker is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"STEP rank=1 step=3 loss=\S+ pid=(\d+);", _output(tmp_path))
            worker = int(m.group(1)) if m else None
            time.sleep(0.5)
        assert worker is not None, _output(tmp_path)
        os.kill(worker, signal.SIGKILL)  # this machine runs both SLURM nodes: the rank is a local process
        start = time.monotonic()
        proc.communicate(timeout=180)
        waited = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    log = _output(tmp_path)
    assert proc.returncode != 0 and waited < 120, log[-3000:]  # the collective timeout is 600 s
    assert "ChildFailedError" in log and "Signal 9 (SIGKILL) received by PID" in log
    assert re.search(r"STEP \S+ CANCELLED|Terminating StepId", log), log[-3000:]  # srun ended the other node
