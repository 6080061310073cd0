"""The generated scripts really start torch.distributed ranks (gloo, CPU) with ranks = the plan's device ids."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from launch_testlib import cpu_plan

from autopar.launch import write_launch_scripts

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]

TRAIN = '''
import argparse, os
from datetime import timedelta
import torch
import torch.distributed as dist
from autopar.plan.io import load_plan

parser = argparse.ArgumentParser()
parser.add_argument("--plan", required=True)
parser.add_argument("--tag", default="")
args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
plan = load_plan(args.plan)
# One write per line: the ranks share torchrun's stdout, and separate writes could interleave.
os.write(1, (f"RESULT rank={rank} world={world} local={os.environ['LOCAL_RANK']} sum={int(total.item())} "
             f"plan_world={plan.world_size} cdmc={os.environ['CUDA_DEVICE_MAX_CONNECTIONS']} tag={args.tag};\\n"
             ).encode())
dist.barrier()
dist.destroy_process_group()
'''
RESULT = re.compile(r"RESULT rank=(\d+) world=(\d+) local=(\d+) sum=(\d+) plan_world=(\d+) cdmc=(\S+) tag=([^;\s]*);")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # this venv's torchrun
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    env.pop("OMP_NUM_THREADS", None)
    return env


def _results(stdout: str) -> list[tuple]:
    return sorted((int(r), int(w), int(lr), int(s), int(pw), c, t) for r, w, lr, s, pw, c, t in RESULT.findall(stdout))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_local_starts_two_gloo_ranks(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    paths = write_launch_scripts(cpu_plan([2]), train, tmp_path / "launch", script_args=["--tag", "local"])
    run_local = paths[-1]
    assert run_local.name == "run_local.sh"
    r = subprocess.run(["bash", str(run_local)], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _results(r.stdout) == [(0, 2, 0, 3, 2, "1", "local"), (1, 2, 1, 3, 2, "1", "local")]


@pytest.mark.slow  # two torchrun agents and three ranks on this machine: about 9 s on 2 cores
def test_node_scripts_give_uneven_nodes_the_plan_device_ids(tmp_path):
    """Two 'nodes' on this machine with 2 and 1 ranks: node 1 is started first and still gets rank 2."""
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    paths = write_launch_scripts(cpu_plan([2, 1]), train, tmp_path / "launch")
    env = {**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [subprocess.Popen(["bash", str(paths[i + 1])], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in (1, 0)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    node1, node0 = (_results(out) for out, _ in outs)
    assert node0 == [(0, 3, 0, 6, 3, "1", ""), (1, 3, 1, 6, 3, "1", "")]
    assert node1 == [(2, 3, 0, 6, 3, "1", "")]
