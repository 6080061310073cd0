"""The plan's ``precision`` field: written, read back, absent = bf16, and refused when unknown or unsupported."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan_testlib import base_plan

from autopar.errors import AutoparError
from autopar.plan.io import dump_plan_yaml, plan_from_dict, plan_to_dict
from autopar.plan.precision import activation_bytes, at_precision, check_precision, precision_params
from cost_models import CostParams


def test_an_old_plan_without_the_field_is_bf16():
    d = plan_to_dict(base_plan())
    del d["precision"]
    plan = plan_from_dict(d)
    assert plan.precision == "bf16" and plan.cluster.nodes[0].gpu.flops == 312e12


def test_precision_round_trips_through_the_file():
    plan = base_plan()
    gpu = plan.cluster.nodes[0].gpu

    nodes = [replace(nd, gpu=replace(gpu, tflops_fp32=19.5, tflops_tf32=156.0)) for nd in plan.cluster.nodes]
    plan = replace(plan, cluster=replace(plan.cluster, nodes=nodes).at_precision("tf32"))
    text = dump_plan_yaml(plan)
    assert "\nprecision: tf32\n" in text and "tflops_tf32: 156.0" in text
    back = plan_from_dict(plan_to_dict(plan))
    assert back.precision == "tf32" and back.cluster.nodes[0].gpu.flops == 156e12
    assert plan_to_dict(back) == plan_to_dict(plan)


@pytest.mark.parametrize("value, start", [
    ("fp64", "precision: unknown precision 'fp64'; use one of bf16, fp16, fp32, tf32, fp8"),
    (16, "precision: "),
    ("fp8", "gpu A100-80G.tflops_fp8: is not known (0), so precision fp8 cannot be planned on A100-80G"),
])
def test_bad_precision_is_one_line(value, start):
    d = plan_to_dict(base_plan())
    d["precision"] = value
    with pytest.raises(AutoparError) as info:
        plan_from_dict(d)
    assert str(info.value).startswith(start) and "\n" not in str(info.value)


def test_the_inputs_at_a_precision():
    cluster = base_plan().cluster
    assert at_precision(cluster, CostParams(), "bf16") == (cluster, CostParams())
    assert precision_params("fp32") == CostParams(param_bytes=4, grad_comm_bytes=4, state_bytes=16)
    assert (activation_bytes("fp16"), activation_bytes("fp32"), activation_bytes("fp8")) == (2, 4, 2)
    assert activation_bytes("bf16") is None  # the default keeps the model's own dtype, as before precisions
    assert check_precision("fp16") == "fp16"
    with pytest.raises(AutoparError, match="^search.precision: unknown precision"):
        check_precision("int4", "search.precision")


def test_a_profile_goes_with_the_default_precision_only():
    cluster, params = base_plan().cluster, CostParams(param_bytes=4)
    assert at_precision(cluster, params, "bf16", profiled=True) == (cluster, params)  # the profile's bytes stay
    with pytest.raises(AutoparError, match="^precision: fp32 cannot be combined with a profile"):
        at_precision(cluster, params, "fp32", profiled=True)
