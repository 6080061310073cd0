"""The example end to end: search a plan for 4 CPU processes, launch it with the generated torchrun
script, train a few steps (real torchrun, real gloo ranks)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dist
@pytest.mark.slow
def test_generated_torchrun_script_trains_the_example_on_4_processes(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--nproc", "4", "--steps", "3",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    losses = [float(x) for x in re.findall(r"step +\d+ +loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 3
    assert losses[-1] < losses[0]
    assert (out / "run_local.sh").exists() and (out / "plan.yaml").exists()
    assert "--nproc-per-node" in (out / "run_local.sh").read_text() or "nproc" in (out / "run_local.sh").read_text()
