"""Launch scripts: contents, bash syntax, argument passing (run with stand-in torchrun/srun), bad input."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from launch_testlib import cpu_plan, fake_tools, mixed_plan, two_node_plan

from autopar.errors import AutoparError
from autopar.launch import LaunchOptions, write_launch_scripts
from autopar.plan.io import load_plan, save_plan

BASH = shutil.which("bash")


@pytest.fixture
def train(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('train')\n")
    return path


def _text(paths, name):
    return next(p for p in paths if p.name == name).read_text()


def _bash_n(path: Path) -> None:
    r = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, f"{path.name}: {r.stderr}"


def test_two_node_torchrun_scripts(tmp_path, train):
    plan = two_node_plan()
    paths = write_launch_scripts(plan, train, tmp_path / "out", script_args=["--steps", "3"])
    assert [p.name for p in paths] == ["plan.yaml", "node0.sh", "node1.sh"]  # no run_local.sh for 2 nodes
    assert load_plan(paths[0]) == plan
    for i, p in enumerate(paths[1:]):
        text = p.read_text()
        assert os.access(p, os.X_OK)
        assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
        for flag in ("--nnodes 2", "--nproc-per-node 4", f"--node-rank {i}", "--rdzv-backend static",
                     '--master-addr "$MASTER_ADDR"', '--master-port "$MASTER_PORT"', "--max-restarts 0",
                     f'--log-dir "$LOG_DIR/node{i}"', "--tee 3"):
            assert f"  {flag} \\\n" in text
        for var in ("OMP_NUM_THREADS", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                    "NCCL_ASYNC_ERROR_HANDLING"):
            assert f"export {var}" in text
        assert 'export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"' in text
        assert f"SCRIPT={train.resolve()}" in text and "SCRIPT_ARGS=(--steps 3)" in text
        torchrun = Path(sys.executable).parent / "torchrun"  # the environment autopar runs in, by path
        assert f"TORCHRUN={torchrun}\n" in text and f"for the environment of {torchrun}" in text
        assert 'exec "$TORCHRUN" \\\n' in text
        assert "#   node 0 (4 x A100-80G): local ranks 0-3 = global ranks 0-3 (pipeline 0 stage 0)" in text
        assert "#   node 1 (4 x A100-80G): local ranks 0-3 = global ranks 4-7 (pipeline 0 stage 1)" in text
        assert f"# This script: node {i} " in text
        assert "c10d would ignore it and order nodes" in text
        _bash_n(p)


def test_single_node_cluster_gets_run_local(tmp_path, train):
    paths = write_launch_scripts(cpu_plan([4]), train, tmp_path / "out")
    assert [p.name for p in paths] == ["plan.yaml", "node0.sh", "run_local.sh"]
    text = _text(paths, "run_local.sh")
    assert "  --standalone \\\n  --nnodes 1 \\\n  --nproc-per-node 4 \\\n" in text
    assert '  --log-dir "$LOG_DIR/node0" \\\n  --tee 3 \\\n' in text
    assert "MASTER_ADDR" not in text  # standalone needs no rendezvous host
    for p in paths[1:]:
        _bash_n(p)


def test_two_node_slurm_sbatch(tmp_path, train):
    out = tmp_path / "launch dir"  # a space in the path must survive quoting
    paths = write_launch_scripts(two_node_plan(), train, out, scheduler="slurm")
    assert [p.name for p in paths] == ["plan.yaml", "node0.sh", "node1.sh", "autopar.sbatch"]
    text = _text(paths, "autopar.sbatch")
    directives = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=autopar", "#SBATCH --output=%x-%j.out", "#SBATCH --nodes=2",
                          "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --gpus-per-node=4"]
    assert 'HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk \'NR == 1\')" || true' in text
    assert f"export AUTOPAR_DIR='{out.resolve()}'" in text
    assert ("srun --kill-on-bad-exit=1 bash -c 'exec bash \"$AUTOPAR_DIR/node${SLURM_NODEID}.sh\" \"$@\"' "
            'autopar-node "$@"\n') in text
    assert "hetjob" not in text
    for p in paths[1:]:
        _bash_n(p)


def test_mixed_cluster_slurm_is_a_hetjob(tmp_path, train):
    paths = write_launch_scripts(mixed_plan(), train, tmp_path / "out", scheduler="slurm")
    text = _text(paths, "autopar.sbatch")
    head, _, rest = text.partition("#SBATCH hetjob\n")
    assert "#SBATCH --nodes=2" in head and "#SBATCH --gpus-per-node=4" in head
    assert "#SBATCH --nodes=1" in rest and "#SBATCH --gpus-per-node=2" in rest and "RTX3090" in rest
    assert '"$SLURM_JOB_NODELIST_HET_GROUP_0" | awk \'NR == 1\')"' in text
    assert "srun --het-group=0 " in text and "node$((SLURM_NODEID + 0)).sh" in text
    assert "srun --het-group=1 " in text and "node$((SLURM_NODEID + 2)).sh" in text
    assert "wait -n" in text and 'scancel "$SLURM_JOB_ID"' in text
    assert "--nproc-per-node 2" in _text(paths, "node2.sh") and "--node-rank 2" in _text(paths, "node2.sh")
    for p in paths[1:]:
        _bash_n(p)


def _fake_bin(tmp_path: Path) -> Path:
    """Stand-ins for the cluster tools absent here: they record what the real ones would have been given."""
    tools = {
        # One write per call (cat of a small file is one write(2), atomic on a pipe): het-group sruns
        # run concurrently, and whole blocks must not interleave.
        "torchrun": 'tmp=$(mktemp)\n{ echo "BEGIN node=$(printf %s "$AUTOPAR_TEST_NODE")"\nfor a in "$@"; do echo "ARG $a"; done\n'
                    'echo "ENV OMP=$OMP_NUM_THREADS CDMC=$CUDA_DEVICE_MAX_CONNECTIONS MASTER=$MASTER_ADDR:$MASTER_PORT"; } > "$tmp"\n'
                    'cat "$tmp"; rm -f "$tmp"\n',
        # srun: run the command once per node of the chosen het group, with SLURM_NODEID set.
        "srun": 'group=0\nwhile [[ $1 == --* ]]; do case $1 in --het-group=*) group=${1#--het-group=};; esac; '
                'shift; done\nIFS=, read -ra counts <<< "$FAKE_NODES"\n'
                'for ((k = 0; k < ${counts[$group]}; k++)); do SLURM_NODEID=$k "$@" || exit $?; done\n',
        "scontrol": 'echo "head-$3"; echo other\n',  # first host of the list it is given
        "scancel": 'echo "CANCELLED $1"\n',
    }
    return fake_tools(tmp_path / "bin", tools)


def _blocks(stdout: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    for line in stdout.splitlines():
        if line.startswith("BEGIN"):
            blocks.append([])
        elif line.startswith("ARG "):
            blocks[-1].append(line[4:])
        elif line.startswith("ENV "):
            blocks[-1].append(line)
    return blocks


def _fake_torchrun(tmp_path: Path) -> LaunchOptions:
    return LaunchOptions(torchrun=str(_fake_bin(tmp_path) / "torchrun"))


def test_node_script_passes_exact_arguments(tmp_path, train):
    paths = write_launch_scripts(two_node_plan(), train, tmp_path / "out", options=_fake_torchrun(tmp_path),
                                 script_args=["--name", "two words", "--x=$HOME"])
    env = {**os.environ, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29411"}
    env.pop("OMP_NUM_THREADS", None)
    r = subprocess.run([BASH, str(paths[2]), "--extra", "1"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "autopar: node 1 of 2 waits for the rendezvous at 10.0.0.1:29411 (hosted by node 0)" in r.stderr
    [args] = _blocks(r.stdout)
    logs = str((tmp_path / "out" / "logs" / "node1").resolve())
    assert args[:18] == ["--nnodes", "2", "--nproc-per-node", "4", "--node-rank", "1", "--rdzv-backend", "static",
                         "--master-addr", "10.0.0.1", "--master-port", "29411", "--max-restarts", "0",
                         "--log-dir", logs, "--tee", "3"]
    assert args[18:-1] == [str(train.resolve()), "--plan", str((tmp_path / "out" / "plan.yaml").resolve()),
                           "--name", "two words", "--x=$HOME", "--extra", "1"]
    omp = max(1, len(os.sched_getaffinity(0)) // 4)  # what nproc reports
    assert args[-1] == f"ENV OMP={omp} CDMC=1 MASTER=10.0.0.1:29411"


def test_other_nodes_require_the_head_address_and_port(tmp_path, train):
    paths = write_launch_scripts(two_node_plan(), train, tmp_path / "out", options=_fake_torchrun(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    r = subprocess.run([BASH, str(paths[2])], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "set MASTER_ADDR to the address of node 0 (node0.sh prints it)" in r.stderr
    r = subprocess.run([BASH, str(paths[2])], env={**env, "MASTER_ADDR": "10.0.0.1"}, capture_output=True, text=True)
    assert r.returncode != 0 and "set MASTER_PORT to the port node0.sh printed" in r.stderr


def test_head_node_finds_its_address_and_a_free_port(tmp_path, train):
    paths = write_launch_scripts(two_node_plan(), train, tmp_path / "out", options=_fake_torchrun(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    r = subprocess.run([BASH, str(paths[1])], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    [args] = _blocks(r.stdout)
    addr, port = args[args.index("--master-addr") + 1], int(args[args.index("--master-port") + 1])
    own = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    assert addr == (own[0] if own else socket.gethostname()) and 1024 <= port <= 65535
    assert f"autopar: node 0 of 2 hosts the rendezvous at {addr}:{port}" in r.stderr
    assert f"start every other node k with: MASTER_ADDR={addr} MASTER_PORT={port} bash node<k>.sh" in r.stderr


def test_fixed_address_port_and_log_dir(tmp_path, train):
    opts = _fake_torchrun(tmp_path)
    opts.master_addr, opts.port, opts.log_dir = "node001", 29999, str(tmp_path / "my logs")
    paths = write_launch_scripts(two_node_plan(), train, tmp_path / "out", options=opts)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    for node in (0, 1):
        r = subprocess.run([BASH, str(paths[1 + node])], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        [args] = _blocks(r.stdout)
        assert args[args.index("--master-addr") + 1: args.index("--master-addr") + 4] == [
            "node001", "--master-port", "29999"]
        assert args[args.index("--log-dir") + 1] == str(tmp_path / "my logs" / f"node{node}")


def test_torchrun_missing_on_the_node_is_one_clear_line(tmp_path, train):
    opts = LaunchOptions(torchrun="torchrun-that-is-not-installed")
    paths = write_launch_scripts(cpu_plan([2]), train, tmp_path / "out", options=opts)
    r = subprocess.run([BASH, str(paths[-1])], capture_output=True, text=True)
    assert r.returncode == 2
    assert "autopar: error: torchrun: torchrun-that-is-not-installed not found on" in r.stderr


@pytest.mark.parametrize("plan_fn, nodes, groups", [(two_node_plan, [4, 4], "2"), (mixed_plan, [4, 4, 2], "2,1")])
@pytest.mark.parametrize("port", [None, 29501])
def test_sbatch_starts_every_node_with_its_node_rank(tmp_path, train, plan_fn, nodes, groups, port):
    opts = _fake_torchrun(tmp_path)
    opts.port = port
    paths = write_launch_scripts(plan_fn(), train, tmp_path / "out", scheduler="slurm", options=opts)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE_NODES": groups,
           "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-9]", "SLURM_JOB_NODELIST_HET_GROUP_0": "a[1-2]",
           "MASTER_ADDR": "stale-from-the-login-shell", "MASTER_PORT": "1"}  # sbatch exports the user's shell
    r = subprocess.run([BASH, str(paths[-1])], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    blocks = _blocks(r.stdout)
    ranks = sorted((int(b[b.index("--node-rank") + 1]), int(b[b.index("--nproc-per-node") + 1])) for b in blocks)
    assert ranks == list(enumerate(nodes))  # every plan node once, with its own GPU count
    head = "head-a[1-2]" if len(nodes) == 3 else "head-n[1-9]"  # hetjob: component 0's first host
    masters = {b[-1].rsplit("MASTER=", 1)[1] for b in blocks}
    assert len(masters) == 1  # every node waits on the same address:port
    addr, got_port = masters.pop().rsplit(":", 1)
    assert addr == head  # an unresolvable head name is passed on as it is
    assert got_port == str(port) if port else 1024 <= int(got_port) <= 65535
    assert f"autopar: job 42: head node {head}; every node waits for the rendezvous at {head}:{got_port}" in r.stdout


def test_c10d_rendezvous_only_for_homogeneous_clusters(tmp_path, train):
    paths = write_launch_scripts(two_node_plan(), train, tmp_path / "a", rendezvous="c10d")
    text = _text(paths, "node1.sh")
    assert "--rdzv-backend c10d" in text and '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in text
    assert "--node-rank" not in text.split('exec "$TORCHRUN"')[1]
    _bash_n(paths[1])
    with pytest.raises(AutoparError, match=r"^rendezvous: c10d orders nodes by hostname"):
        write_launch_scripts(mixed_plan(), train, tmp_path / "b", rendezvous="c10d")


def test_bad_input(tmp_path, train):
    out = tmp_path / "never"
    with pytest.raises(AutoparError, match=r"^scheduler: unknown scheduler 'pbs'; use one of torchrun, slurm"):
        write_launch_scripts(two_node_plan(), train, out, scheduler="pbs")
    with pytest.raises(AutoparError, match=r"^script: training script .*missing.py does not exist"):
        write_launch_scripts(two_node_plan(), tmp_path / "missing.py", out)
    with pytest.raises(AutoparError, match=r"^rendezvous: unknown rendezvous 'etcd'"):
        write_launch_scripts(two_node_plan(), train, out, rendezvous="etcd")
    bad = two_node_plan()
    bad.global_batch_size = 99
    with pytest.raises(AutoparError, match=r"^pipelines\[\*\]\.batch_share: shares \[16\] sum to 16"):
        write_launch_scripts(bad, train, out)
    with pytest.raises(AutoparError, match=r"^plan: file .* does not exist"):
        write_launch_scripts(tmp_path / "nope.yaml", train, out)
    assert not out.exists()  # nothing written for bad input


def test_plan_path_is_accepted(tmp_path, train):
    plan_file = save_plan(mixed_plan(), tmp_path / "p.yaml")
    paths = write_launch_scripts(plan_file, train, tmp_path / "out")
    assert [p.name for p in paths] == ["plan.yaml", "node0.sh", "node1.sh", "node2.sh"]
    assert load_plan(paths[0]) == mixed_plan()


# -- the launch directory: its manifest, stale scripts, directories launch did not write --------------------
def test_a_second_launch_replaces_its_files_and_removes_stale_scripts(tmp_path, train):
    out = tmp_path / "out"
    first = write_launch_scripts(mixed_plan(), train, out, scheduler="slurm")
    assert {p.name for p in first} == {"plan.yaml", "node0.sh", "node1.sh", "node2.sh", "autopar.sbatch"}
    manifest = (out / "autopar-launch.txt").read_text().splitlines()
    assert manifest[0].startswith("#") and manifest[1:] == ["plan.yaml", "node0.sh", "node1.sh", "node2.sh",
                                                           "autopar.sbatch"]
    (out / "logs").mkdir()  # what a run leaves beside the scripts is not launch's to remove
    (out / "logs" / "rank0.txt").write_text("x")
    (out / "notes.txt").write_text("mine")
    second = write_launch_scripts(cpu_plan([2]), train, out)
    assert sorted(p.name for p in out.iterdir()) == ["autopar-launch.txt", "logs", "node0.sh", "notes.txt",
                                                     "plan.yaml", "run_local.sh"]
    assert (out / "autopar-launch.txt").read_text().splitlines()[1:] == ["plan.yaml", "node0.sh", "run_local.sh"]
    assert load_plan(second[0]) == cpu_plan([2]) and "--nproc-per-node 2" in (out / "node0.sh").read_text()
    assert (out / "logs" / "rank0.txt").read_text() == "x" and (out / "notes.txt").read_text() == "mine"


def test_a_directory_launch_did_not_write_is_refused_untouched(tmp_path, train):
    out = tmp_path / "out"
    out.mkdir()
    (out / "node0.sh").write_text("echo my own script\n")
    with pytest.raises(AutoparError, match=r"^out_dir: .*out is not empty and has no autopar-launch.txt, so autopar "
                                           r"launch did not write it; choose a new or empty directory"):
        write_launch_scripts(two_node_plan(), train, out)
    assert [p.name for p in out.iterdir()] == ["node0.sh"] and "my own" in (out / "node0.sh").read_text()
    (out / "node0.sh").unlink()
    assert len(write_launch_scripts(two_node_plan(), train, out)) == 3  # an empty directory is fine


@pytest.mark.parametrize("entry", ["../train.py", "/etc/passwd", "notes.txt", "node0.sh/../../x"])
def test_a_manifest_naming_other_files_is_refused_and_nothing_removed(tmp_path, train, entry):
    out = tmp_path / "out"
    write_launch_scripts(two_node_plan(), train, out)
    (out / "notes.txt").write_text("mine")
    with open(out / "autopar-launch.txt", "a") as f:
        f.write(entry + "\n")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(AutoparError, match=r"^out_dir: .*autopar-launch.txt names .*not a file autopar launch writes"):
        write_launch_scripts(cpu_plan([2]), train, out)
    assert sorted(p.name for p in out.iterdir()) == before and train.exists()


def test_slurm_settings_become_sbatch_lines(tmp_path, train):
    opts = LaunchOptions(time="1-12:00:00", partition="gpu,gpu-long", cpus_per_task=32, gpus_per_node="a100:4")
    paths = write_launch_scripts(two_node_plan(), train, tmp_path / "out", scheduler="slurm", options=opts)
    text = _text(paths, "autopar.sbatch")
    directives = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=autopar", "#SBATCH --output=%x-%j.out", "#SBATCH --nodes=2",
                          "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --gpus-per-node=a100:4",
                          "#SBATCH --time=1-12:00:00", "#SBATCH --partition=gpu,gpu-long", "#SBATCH --cpus-per-task=32"]
    assert "\nexport SRUN_CPUS_PER_TASK=32\n" in text  # srun no longer inherits it (SLURM 22.05+)
    het = _text(write_launch_scripts(mixed_plan(), train, tmp_path / "het", scheduler="slurm",
                                     options=LaunchOptions(time="90", partition="p")), "autopar.sbatch")
    assert het.count("#SBATCH --time=90") == 2 and het.count("#SBATCH --partition=p") == 2  # one per component
    with pytest.raises(AutoparError, match=r"^--gpus-per-node: the plan's nodes have 2, 4 GPUs"):
        write_launch_scripts(mixed_plan(), train, tmp_path / "x", scheduler="slurm",
                             options=LaunchOptions(gpus_per_node="4"))
    for p in paths[1:]:
        _bash_n(p)
