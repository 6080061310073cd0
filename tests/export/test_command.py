"""``autopar export`` on the command line: the file (or stdout), the changes printed and carried in the file,
and launch scripts that real bash reads and runs into exactly the arguments the tools were checked with."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import yaml

from autopar.cli import main
from autopar.export import megatron, prepare, torchtitan


def test_stdout_gets_the_file_and_stderr_the_changes(plans, capsys):
    assert main(["export", plans["readme"], "--to", "deepspeed"]) == 0
    got = capsys.readouterr()
    doc = json.loads(got.out)  # stdout: the config alone
    assert doc["zero_optimization"]["stage"] == 3
    assert any(line.startswith("  zero: ") for line in doc["autopar_export"])
    assert "autopar export: NOT the plan as searched" in got.err and "for the original" in got.err


def test_output_file_carries_the_changes_and_scripts_are_executable(plans, tmp_path, capsys):
    out = tmp_path / "run.sh"
    assert main(["export", plans["hetero"], "--to", "megatron", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    text = out.read_text()
    ex = prepare(plans["hetero"], "megatron")
    for change in ex.changes:
        assert f"#   {change}" in text and change in printed
    assert printed.rstrip().endswith(f"wrote {out}")
    assert os.stat(out).st_mode & stat.S_IXUSR
    cfg = tmp_path / "accelerate.yaml"
    assert main(["export", plans["exact-dp"], "--to", "accelerate", "-o", str(cfg)]) == 0
    assert yaml.safe_load(cfg.read_text())["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert "# exact: the plan as searched" in cfg.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("target", ["torchtitan", "megatron"])
def test_bash_runs_the_script_into_the_checked_arguments(plans, target, tmp_path):
    """The script under real bash execs torchrun with exactly ``args(ex)`` (a torchrun on PATH records argv)."""
    odd = tmp_path / "plan $(touch PWNED)\nx.yaml"  # a file name that must not break out of a comment
    odd.write_text(open(plans["uneven-pp2"]).read())
    script = tmp_path / "run.sh"
    assert main(["export", str(odd), "--to", target, "-o", str(script)]) == 0
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    head = text.split("set -euo pipefail")[0].splitlines()
    assert all(line.startswith(("#!", "# ")) for line in head), head
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (bin_dir / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TT_MODULE": "m", "TT_CONFIG": "c"}
    run = subprocess.run(["bash", str(script), "--extra"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    argv = json.loads(run.stdout)
    ex = prepare(str(odd), target)
    want = (torchtitan if target == "torchtitan" else megatron).args(ex)
    assert argv[-len(want) - 1:] == [*want, "--extra"]
    assert not (tmp_path / "PWNED").exists()


def test_a_model_without_a_torchtitan_config_must_be_named(plans, tmp_path):
    script = tmp_path / "run.sh"
    assert main(["export", plans["small"], "--to", "torchtitan", "-o", str(script)]) == 0
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k not in ("TT_MODULE", "TT_CONFIG")})
    assert run.returncode != 0 and "set TT_MODULE and TT_CONFIG" in run.stderr


def test_profile_gives_the_figures_estimate_gives_with_it(tiny_profile, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size", "8", "--no-baselines",
                 "-o", str(plan), "--json"]) == 0
    capsys.readouterr()
    assert main(["estimate", str(plan), "--json", "--profile", str(tiny_profile)]) == 0
    measured = json.loads(capsys.readouterr().out)["predicted"]["step_time_s"]
    ex = prepare(str(plan), "deepspeed", str(tiny_profile))
    assert ex.original_estimate.step_time_s == pytest.approx(measured, rel=1e-12)
    assert any(line.startswith(f"cost figures from profile {tiny_profile}") for line in ex.header_lines())
