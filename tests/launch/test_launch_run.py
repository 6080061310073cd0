"""The generated scripts really start torch.distributed ranks (gloo, CPU) with ranks = the plan's device ids."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from launch_testlib import cpu_plan

from autopar.launch import LaunchOptions, write_launch_scripts

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


# -- two nodes on this machine: autopar.wrap training, and a node lost mid-run ---------------------------------
WRAP_TRAIN = '''
import argparse, os, time
import torch
import torch.distributed as dist
import autopar
from tests.runtime.cases import gpt, token_data

parser = argparse.ArgumentParser()
parser.add_argument("--plan", required=True)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--pause", type=float, default=0.0)
args = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
pm = autopar.wrap(gpt(), args.plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))  # 600 s collective timeout
rank = dist.get_rank()
inputs, targets = token_data()
for step in range(args.steps):
    loss = pm.step(inputs, targets)
    os.write(1, f"STEP rank={rank} step={step} loss={loss!r} pid={os.getpid()};\\n".encode())
    time.sleep(args.pause)
state = pm.full_state_dict()
if rank == 0:
    torch.save(state, os.environ["STATE_OUT"])
dist.barrier()
dist.destroy_process_group()
'''
STEP = re.compile(r"STEP rank=(\d+) step=(\d+) loss=(\S+) pid=\d+;")


def _two_node_pipeline():
    """The GPT of tests/runtime/cases.py as a two-stage pipeline, one stage per node (one rank each)."""
    from launch_testlib import CPU

    from autopar.cluster.cluster import Cluster, Node
    from autopar.plan.compact import make_plan
    from tests.runtime.cases import GPT_UNITS, same

    plan = make_plan([(4, 2, [([0], same(GPT_UNITS[:2])), ([1], same(GPT_UNITS[2:]))])])
    plan.cluster = Cluster(nodes=[Node(CPU, 1), Node(CPU, 1)], name="2x1xcpu")
    return plan


def _start_nodes(paths, env, extra=()):
    """node1.sh then node0.sh, each in its own session (a node's processes can be killed together)."""
    return [subprocess.Popen(["bash", str(paths[1 + node]), *extra], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True) for node in (1, 0)]


def _finish(procs, timeout):
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.slow  # two torchrun agents, two ranks, three pipeline steps: about 30 s on 2 loaded cores
def test_two_nodes_train_like_one_process(tmp_path):
    """Two torchrun 'nodes' on 127.0.0.1 train the two-stage pipeline: every rank reports the losses of
    single-process training, and the final parameters match it."""
    from tests.runtime.cases import gpt, token_data
    from tests.runtime.reference import reference_train

    train = tmp_path / "train.py"
    train.write_text(WRAP_TRAIN)
    paths = write_launch_scripts(_two_node_pipeline(), train, tmp_path / "launch",
                                 options=LaunchOptions(master_addr="127.0.0.1", port=_free_port()))
    env = {**_env(), "STATE_OUT": str(tmp_path / "state.pt")}
    procs = _start_nodes(paths, env)
    outs = _finish(procs, 240)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    steps = sorted((int(r), int(s), float(v)) for out, _ in outs for r, s, v in STEP.findall(out))
    ref_losses, ref_state = reference_train(gpt, *token_data(), steps=3, lr=0.1)
    assert [r for r, _, _ in steps] == [0, 0, 0, 1, 1, 1]
    for rank in (0, 1):
        got = [v for r, _, v in steps if r == rank]
        assert got == pytest.approx(ref_losses, abs=1e-5, rel=1e-5)
    state = torch.load(tmp_path / "state.pt")
    assert set(state) == set(ref_state)
    for k, v in ref_state.items():
        torch.testing.assert_close(state[k], v, atol=1e-5, rtol=1e-5)
    node1_err, node0_err = outs[0][1], outs[1][1]
    assert "node 1 of 2 waits for the rendezvous at 127.0.0.1:" in node1_err
    assert "node 0 of 2 hosts the rendezvous at 127.0.0.1:" in node0_err
    assert "[rank0]: " in outs[1][0] and "[rank1]: " in outs[0][0]  # console lines carry the global rank
    logs = sorted((tmp_path / "launch" / "logs").glob("node*/*/attempt_0/0/stdout.log"))
    assert [p.relative_to(tmp_path / "launch" / "logs").parts[0] for p in logs] == ["node0", "node1"]
    assert "STEP rank=1 step=2" in logs[1].read_text()  # each rank's own log file


@pytest.mark.slow  # about 20 s on 2 loaded cores
@pytest.mark.parametrize("lost", ["rank", "node"])
def test_a_lost_rank_or_node_ends_the_other_node_with_an_error_not_a_hang(tmp_path, lost):
    """Mid-training, node 1's rank is killed (SIGKILL), or the whole node (its torchrun agent too; the agent
    puts its rank in a session of its own, so both are killed): node 0 exits non-zero naming the failure
    (seconds here), long before its 600 s collective timeout; with only the rank lost, node 1's torchrun
    reports it too. The 120 s bound only tells a hang from an error on a loaded machine."""
    train = tmp_path / "train.py"
    train.write_text(WRAP_TRAIN)
    paths = write_launch_scripts(_two_node_pipeline(), train, tmp_path / "launch",
                                 options=LaunchOptions(master_addr="127.0.0.1", port=_free_port()))
    env = {**_env(), "STATE_OUT": str(tmp_path / "state.pt")}
    node1, node0 = procs = _start_nodes(paths, env, ["--steps", "100000", "--pause", "0.05"])
    worker = None
    try:
        for line in node1.stdout:  # wait until node 1's rank has trained a few steps
            m = re.search(r"STEP rank=1 step=3 loss=\S+ pid=(\d+);", line)
            if m:
                worker = int(m.group(1))
                break
        assert worker is not None, "node 1 never reached step 3"
        os.kill(worker, signal.SIGKILL)
        if lost == "node":
            os.killpg(node1.pid, signal.SIGKILL)
        start = time.monotonic()
        out, err = node0.communicate(timeout=180)
        waited = time.monotonic() - start
        rest1 = node1.communicate(timeout=60)
    finally:
        _finish(procs, 5)
        if worker is not None:
            _kill_quietly(worker)
    assert node0.returncode != 0, out + err
    assert waited < 120, f"node 0 took {waited:.0f} s to notice"
    assert re.search(r"Connection closed by peer|Connection reset by peer|ChildFailedError", err), err[-3000:]
    if lost == "rank":
        assert node1.returncode != 0 and "Signal 9 (SIGKILL) received by PID" in rest1[1], rest1[1][-3000:]


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.slow  # about 35 s on 2 loaded cores
def test_sbatch_body_under_a_stand_in_srun_runs_real_torchrun(tmp_path):
    """Where no SLURM runs (CI), the sbatch file itself, under real bash, with stand-ins for the two SLURM
    commands it calls (srun: start the command once per node with SLURM_NODEID, concurrently; scontrol: the
    node list), starts real torchrun on both nodes; the head is found and the pipeline trains as one process.
    tests/launch/test_slurm_real.py runs the same file under a real SLURM where one answers."""
    from launch_testlib import fake_tools

    from tests.runtime.cases import gpt, token_data
    from tests.runtime.reference import reference_train

    train = tmp_path / "train.py"
    train.write_text(WRAP_TRAIN)
    paths = write_launch_scripts(_two_node_pipeline(), train, tmp_path / "launch", scheduler="slurm")
    fake = fake_tools(tmp_path / "bin", {
        "srun": 'while [[ $1 == --* ]]; do shift; done\nfor k in 0 1; do SLURM_NODEID=$k "$@" & done\n'
                'rc=0\nfor k in 0 1; do wait -n || rc=$?; done\nexit $rc\n',
        "scontrol": 'echo localhost; echo other-node\n',
    })
    env = {**_env(), "PATH": f"{fake}:{_env()['PATH']}", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost,x",
           "SLURMD_NODENAME": "localhost", "STATE_OUT": str(tmp_path / "state.pt")}
    r = subprocess.run(["bash", str(paths[-1]), "--steps", "2"], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"autopar: job 7: head node localhost; every node waits for the rendezvous at (\S+):(\d+)", r.stdout)
    assert m and not m.group(1).startswith("127."), r.stdout  # localhost resolves to loopback: the host's address
    ref, _ = reference_train(gpt, *token_data(), steps=2, lr=0.1)  # --steps 2 reached the training script
    for rank in (0, 1):
        assert [float(v) for rr, _, v in STEP.findall(r.stdout) if int(rr) == rank] == pytest.approx(ref, abs=1e-5)
