"""ZeRO-3 ``reshard: false`` and ZeRO-1/2 ``zero_overlap`` in the exports: mapped exactly where the tool
has the option (torchtitan/accelerate FSDP without resharding after forward, Megatron's overlap flags),
listed as a change where it has not (and ZeRO-2, which FSDP tools do not run, goes to FSDP without
resharding, listed)."""

from __future__ import annotations

import json

import pytest
import yaml

from autopar.export import prepare, render
from autopar.export.megatron import args as megatron_args
from autopar.export.torchtitan import args as torchtitan_args


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("target", ["torchtitan", "accelerate"])
def test_no_reshard_is_exact_for_fsdp_tools(plans, target):
    ex = prepare(plans["no-reshard"], target)
    assert ex.changes == [] and ex.shape.zero == 3 and not ex.shape.reshard
    if target == "torchtitan":
        assert _option(torchtitan_args(ex), "--parallelism.fsdp_reshard_after_forward") == "never"
        assert _option(torchtitan_args(prepare(plans["exact-dp"], target)),
                       "--parallelism.fsdp_reshard_after_forward") == "always"
    else:
        fsdp = yaml.safe_load(render(ex))["fsdp_config"]
        assert fsdp["fsdp_reshard_after_forward"] == fsdp["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"


@pytest.mark.parametrize("target", ["megatron", "deepspeed"])
def test_no_reshard_is_a_listed_change_where_the_tool_has_none(plans, target):
    ex = prepare(plans["no-reshard"], target)
    assert "zero: 3 nr x26 -> 3 x26" in ex.changes, ex.changes
    assert ex.estimate.step_time_s > ex.original_estimate.step_time_s  # the backward all-gather comes back


@pytest.mark.parametrize("target", ["torchtitan", "accelerate"])
def test_zero2_becomes_fsdp_without_resharding_listed(plans, target):
    ex = prepare(plans["zero2-dp"], target)
    assert ex.shape.zero == 3 and not ex.shape.reshard
    assert "zero: 2 x26 -> 3 nr x26" in ex.changes, ex.changes


def test_overlap_is_exact_for_megatron(plans):
    ex = prepare(plans["overlap-pp2"], "megatron")
    assert ex.changes == [] and ex.shape.overlap
    argv = megatron_args(ex)
    assert {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"} <= set(argv)
    plain = megatron_args(prepare(plans["exact-pp2"], "megatron"))
    assert "--overlap-grad-reduce" not in plain and "--overlap-param-gather" not in plain


def test_overlap_is_a_listed_change_for_deepspeed(plans):
    ex = prepare(plans["overlap-pp2"], "deepspeed")
    assert any(c.startswith("zero: 1 ov") and c.endswith("-> 1 x26") for c in ex.changes), ex.changes
    assert json.loads(render(ex))["zero_optimization"] == {"stage": 1}
