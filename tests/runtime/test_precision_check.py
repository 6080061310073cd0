"""wrap runs the model in its own dtype: a plan of another precision is refused, one line, before any collective."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.checks import check_precision, check_tf32, tf32_matmuls, tf32_switch
from autopar.units import units
from tests.runtime.cases import mlp

ALL_PEAKS = {"tflops_fp32": 1.0, "tflops_tf32": 1.0, "tflops_fp8": 1.0}


def _plan(precision: str):
    plan = make_plan([(4, 1, [([0], [(str(i), {}) for i in range(5)])])])
    gpu = GPUType("g", memory_gib=16.0, tflops=1.0, hbm_gbps=50.0, **ALL_PEAKS)
    return replace(plan, cluster=Cluster([Node(gpu, 1)]).at_precision(precision))


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.float32), ("bf16", torch.bfloat16),
                                              ("fp32", torch.float32), ("tf32", torch.float32),
                                              ("fp16", torch.float16)])
def test_a_matching_or_default_precision_runs(precision, dtype):
    check_precision(_plan(precision), units(mlp().to(dtype)))


@pytest.mark.parametrize("precision, dtype, start", [
    ("fp32", torch.bfloat16, "plan.precision: is fp32 but the model's parameters are torch.bfloat16"),
    ("fp16", torch.float32, "plan.precision: is fp16 but the model's parameters are torch.float32"),
    ("fp8", torch.bfloat16, "plan.precision: is fp8 but the model has no Float8Linear layers"),
])
def test_another_precision_is_refused(precision, dtype, start):
    with pytest.raises(AutoparError) as info:
        check_precision(_plan(precision), units(mlp().to(dtype)))
    assert str(info.value).startswith(start) and "\n" not in str(info.value)


def test_fp8_runs_with_float8_linear_layers():
    class Float8Linear(nn.Linear):  # stands for torchao's class (matched by name: the runtime imports no torchao)
        pass

    model = nn.Sequential(Float8Linear(6, 13), nn.Tanh(), Float8Linear(13, 7), nn.GELU(), nn.Linear(7, 3))
    check_precision(_plan("fp8"), units(model.to(torch.bfloat16)))


@pytest.mark.parametrize("allow_tf32, env, on", [
    (True, {}, True),
    (True, {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}, True),  # NGC's images: PyTorch's switch reads it as on
    (True, {"NVIDIA_TF32_OVERRIDE": "0"}, False),  # cuBLAS keeps TF32 off whatever PyTorch asks
    (True, {"NVIDIA_TF32_OVERRIDE": "1"}, True),  # only 0 means anything to cuBLAS
    (False, {}, False),
])
def test_tf32_is_pytorch_s_switch_unless_cublas_is_told_otherwise(allow_tf32, env, on):
    assert tf32_switch(allow_tf32, env) is on


def test_no_tf32_on_the_cpu():
    assert tf32_matmuls(torch.device("cpu")) is None


@pytest.mark.parametrize("precision, tf32", [("fp32", False), ("tf32", True), ("bf16", True), ("bf16", False),
                                             ("fp32", None), ("tf32", None)])
def test_a_plan_runs_where_fp32_matmuls_run_at_its_rate(precision, tf32):
    check_tf32(precision, tf32)


@pytest.mark.parametrize("precision, tf32, start, fix", [
    ("fp32", True, "plan.precision: is fp32 but this process runs fp32 matmuls as TF32", "--precision tf32"),
    ("tf32", False, "plan.precision: is tf32 but this process runs fp32 matmuls in plain FP32", "--precision fp32"),
])
def test_a_plan_priced_at_the_other_matmul_rate_is_refused(precision, tf32, start, fix):
    with pytest.raises(AutoparError) as info:
        check_tf32(precision, tf32)
    message = str(info.value)
    assert message.startswith(start) and fix in message and "\n" not in message
