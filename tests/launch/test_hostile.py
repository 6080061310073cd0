"""Launch scripts from hostile plans, paths and arguments: run under a fake ``torchrun`` (and ``srun``),
nothing but torchrun runs, and it gets the arguments unchanged.

Every payload tries to run ``touch PWNED`` (in the scripts' working directory); the test fails if any marker appears. The plans here are
built in memory (the loader refuses hostile names in plan files: tests/bad_input/test_commands.py), so the
scripts' own quoting and comment rendering is what stands between the payload and the shell.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from launch_testlib import UNITS, _layers, _model, fake_tools

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.errors import AutoparError
from autopar.launch import LaunchOptions, write_launch_scripts
from autopar.plan.schema import Pipeline, Plan, Stage

BASH = shutil.which("bash")


def _payloads() -> list[str]:
    m = "PWNED"  # relative: the scripts run with cwd = tmp_path, and a path may not hold "/"
    return [f"\ntouch {m}\n", f"\rtouch {m} #", f"$(touch {m})", f"`touch {m}`", f"'; touch {m}; '",
            f'"; touch {m}; "', f"\\\ntouch {m}", f"x\u2028touch {m}", f"x\x0btouch {m}", f"x\x85touch {m}"]


def _plan(gpu_name: str, cluster_name: str, nodes: int) -> Plan:
    gpu = GPUType(gpu_name, memory_gib=8.0, tflops=0.5, hbm_gbps=20.0, vendor="cpu")
    cluster = Cluster(nodes=[Node(gpu, 2, name=f"n{i}", zone=gpu_name) for i in range(nodes)], name=cluster_name)
    n = 2 * nodes
    return Plan(_model(), cluster, 2 * n, [Pipeline(2 * n, n, 2, [Stage(list(range(n)), _layers(UNITS))])])


def _fake_bin(root: Path, name: str = "fakebin") -> Path:
    """torchrun records its argv (NUL-separated, one file per call); srun/scontrol stand in for SLURM."""
    tools = {
        "torchrun": 'printf "%s\\0" "$@" > "$RECORD_DIR/torchrun.$$"\n',
        "srun": 'while [[ $1 == --* ]]; do shift; done\nfor ((k = 0; k < ${FAKE_NODES:-1}; k++)); do '
                'SLURM_NODEID=$k "$@" || exit $?; done\n',
        "scontrol": 'echo head\n',
    }
    return fake_tools(root / name, tools)


def _run(script: Path, root: Path, record: Path, nodes: int, extra: list[str], bin_dir: Path) -> list[list[str]]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD_DIR": str(record), "MASTER_ADDR": "10.0.0.1",
           "FAKE_NODES": str(nodes), "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7", "HOME": str(root)}
    r = subprocess.run([BASH, str(script), *extra], env=env, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    calls = sorted(record.iterdir())
    return [p.read_bytes().decode().split("\0")[:-1] for p in calls]


@pytest.mark.parametrize("scheduler, nodes", [("torchrun", 1), ("torchrun", 2), ("slurm", 2)])
@pytest.mark.parametrize("k", range(10))
def test_hostile_plan_paths_and_args_run_only_torchrun(tmp_path, scheduler, nodes, k):
    marker = tmp_path / "PWNED"
    payload = _payloads()[k]
    printable = "".join(c for c in payload if c.isprintable())  # paths may not hold control characters
    src = tmp_path / f"src {printable}"
    src.mkdir()
    train = src / f"train {printable}.py"
    train.write_text("print('train')\n")
    out = tmp_path / f"out {printable}"
    args = ["--note", payload, payload, "--x=$HOME"]
    bin_dir = _fake_bin(tmp_path, f"bin {printable}")  # the torchrun path and the log dir are hostile too
    opts = LaunchOptions(torchrun=str(bin_dir / "torchrun"), log_dir=tmp_path / f"logs {printable}")
    paths = write_launch_scripts(_plan(f"cpu{payload}", f"c{payload}", nodes), train, out, scheduler=scheduler,
                                 script_args=args, options=opts)
    for p in paths[1:]:
        assert all(c.isprintable() for line in p.read_text().splitlines() if line.startswith("#") for c in line)
    record = tmp_path / "record"
    record.mkdir()
    script = paths[-1] if scheduler == "slurm" else out / ("run_local.sh" if nodes == 1 else "node0.sh")
    calls = _run(script, tmp_path, record, nodes if scheduler == "slurm" else 1, ["--tail", payload], bin_dir)
    assert not marker.exists(), f"{script.name} ran the payload {payload!r}"
    assert len(calls) == (nodes if scheduler == "slurm" else 1)
    for argv in calls:
        cut = argv.index(str(train.resolve()))
        assert argv[argv.index("--log-dir") + 1].startswith(str(tmp_path / f"logs {printable}" / "node"))
        assert argv[cut:] == [str(train.resolve()), "--plan", str((out / "plan.yaml").resolve()), *args,
                              "--tail", payload]  # sbatch passes its arguments on too


@pytest.mark.parametrize("field, kwargs", [
    ("out_dir", {"out_dir": "o\nx"}),
    ("script", {"script": "t\nx.py"}),
    ("job_name", {"job_name": "j\n#SBATCH --x"}),
    ("job_name", {"job_name": "a b"}),
])
def test_paths_and_job_names_with_control_characters_are_refused(tmp_path, field, kwargs):
    train = tmp_path / "train.py"
    train.write_text("")
    call = {"plan": _plan("cpu", "c", 1), "script": train, "out_dir": tmp_path / "out", "scheduler": "slurm"}
    call.update({k: (tmp_path / v if k != "job_name" else v) for k, v in kwargs.items()})
    if field == "script":
        Path(call["script"]).write_text("")
    with pytest.raises(AutoparError, match=rf"^{field}: "):
        write_launch_scripts(**call)
    assert not (tmp_path / "out").exists() and not any(p.name.startswith("o") for p in tmp_path.iterdir())


def test_scripts_honour_the_umask(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("")
    old = os.umask(0o027)
    try:
        paths = write_launch_scripts(_plan("cpu", "c", 1), train, tmp_path / "out")
    finally:
        os.umask(old)
    assert oct(paths[0].stat().st_mode & 0o777) == oct(0o640)  # the plan copy
    assert all(oct(p.stat().st_mode & 0o777) == oct(0o750) for p in paths[1:])  # scripts, executable
