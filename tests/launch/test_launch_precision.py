"""Launch scripts set what a plan's precision asks of fp32 matmuls (TF32 or not), whatever the environment holds."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace

import pytest
from launch_testlib import A100, fake_tools, two_node_plan

from autopar.cluster.cluster import Cluster, Node
from autopar.launch import LaunchOptions, write_launch_scripts

BASH = shutil.which("bash")
GPU = replace(A100, tflops_fp32=19.5, tflops_tf32=156.0)
# What an NGC PyTorch image sets, and what a user may have set by hand.
NGC = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
NO_TF32 = {"NVIDIA_TF32_OVERRIDE": "0"}


def _plan(precision: str):
    cluster = Cluster(nodes=[Node(GPU, 4), Node(GPU, 4)], name="2x4xA100-80G").at_precision(precision)
    return replace(two_node_plan(), cluster=cluster)


def _seen(tmp_path, precision: str, env: dict) -> str:
    """What the training processes of node 1 would see, run under ``env``."""
    (tmp_path / "train.py").write_text("print('train')\n")
    tools = fake_tools(tmp_path / "bin", {"torchrun": 'echo "SEEN ${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE-unset} '
                                                      '${NVIDIA_TF32_OVERRIDE-unset}"\n'})
    paths = write_launch_scripts(_plan(precision), tmp_path / "train.py", tmp_path / "out",
                                 options=LaunchOptions(torchrun=str(tools / "torchrun")))
    clean = {k: v for k, v in os.environ.items() if k not in (*NGC, *NO_TF32)}
    r = subprocess.run([BASH, str(paths[2])], env={**clean, **env, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29411"},
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return next(line for line in r.stdout.splitlines() if line.startswith("SEEN "))


@pytest.mark.parametrize("env", [{}, NGC, NO_TF32])
def test_an_fp32_plan_runs_without_tf32_even_in_an_ngc_image(tmp_path, env):
    assert _seen(tmp_path, "fp32", env) == "SEEN 0 0"


@pytest.mark.parametrize("env", [{}, NGC, NO_TF32])
def test_a_tf32_plan_runs_tf32_even_where_cublas_was_told_not_to(tmp_path, env):
    assert _seen(tmp_path, "tf32", env) == "SEEN 1 unset"


@pytest.mark.parametrize("env, seen", [({}, "SEEN unset unset"), (NGC, "SEEN 1 unset"), (NO_TF32, "SEEN unset 0")])
def test_a_half_precision_plan_leaves_the_switches_as_they_are(tmp_path, env, seen):
    assert _seen(tmp_path, "bf16", env) == seen
