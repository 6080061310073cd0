"""Mixed and asymmetric plans against a single-process reference (3 SGD steps, losses and parameters)."""

from __future__ import annotations

import pytest

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, MLP_UNITS, MODELS, same
from tests.runtime.reference import assert_matches_reference

pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def _check(model: str, pipelines, schedule: str = "1f1b") -> None:
    build, _, (x, y), loss_fn = MODELS[model]
    assert_matches_reference(build, make_plan(pipelines, schedule=schedule), x, y, loss_fn=loss_fn)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_asymmetric_three_ranks_two_pipelines(model, schedule):
    """Pipeline A: 2 stages on ranks 0 | 1 (6 samples); pipeline B: 1 stage on rank 2 (2 samples)."""
    units = MODELS[model][1]
    _check(model, [(2, 3, [([0], same(units[:2])), ([1], same(units[2:]))]),
                   (2, 1, [([2], same(units))])], schedule)


def test_asymmetric_tp_stage_feeds_single_rank_stage():
    """Stage 0 is TP over ranks 0, 1; stage 1 is rank 2 alone (PipelineStage cannot express this)."""
    _check("gpt", [(4, 2, [([0, 1], same([E, L0], tp=2)), ([2], same([L1, H]))])])


def test_asymmetric_dp_stage_feeds_single_rank_stage_mlp():
    """Stage 0 is data-parallel (ZeRO-1) over ranks 0, 1; stage 1 is rank 2 alone."""
    _check("mlp", [(4, 2, [([0, 1], same(MLP_UNITS[:3], zero=1)), ([2], same(MLP_UNITS[3:]))])])


def test_per_layer_tp_changes_inside_one_stage():
    """4 ranks, one stage: tp 1 (dp 4) -> tp 2 -> tp 4 with sp -> tp 2 with loss_parallel."""
    layers = [(E, {}), (L0, {"tp": 2}), (L1, {"tp": 4, "sp": True}), (H, {"tp": 2, "zero": 1})]
    _check("gpt", [(4, 2, [([0, 1, 2, 3], layers)])])


def test_per_layer_zero_and_ckpt_changes_inside_one_stage_mlp():
    """4 ranks, one stage, dp 4: each unit its own ZeRO stage and checkpointing (uneven shards)."""
    zs = [{"zero": 0}, {"zero": 1, "ckpt": "full"}, {"zero": 2}, {"zero": 3, "ckpt": "full"}, {"zero": 3}]
    _check("mlp", [(4, 2, [([0, 1, 2, 3], list(zip(MLP_UNITS, zs)))])])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_of_tp_sp_stage_and_zero3_stage(schedule):
    """4 ranks: stage 0 TP 2 + sp on ranks 0, 1; stage 1 ZeRO-3 with full ckpt / ZeRO-1 on ranks 2, 3."""
    _check("gpt", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                           ([2, 3], [(L1, {"zero": 3, "ckpt": "full"}), (H, {"zero": 1})])])], schedule)


def test_pipeline_of_zero3_stage_and_zero2_ckpt_stage_mlp():
    _check("mlp", [(2, 4, [([0, 1], same(MLP_UNITS[:2], zero=3)), ([2, 3], same(MLP_UNITS[2:], zero=2,
                                                                                   ckpt="full"))])])


def test_fsdp_with_tp_on_2d_mesh():
    """ZeRO-3 over dp 2 x TP 2 + sp (FSDP2 on a 2-D mesh), selective checkpointing."""
    _check("gpt", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3, ckpt="selective"))])])


def test_asymmetric_pipelines_shard_units_differently():
    """Pipeline A holds every unit with TP 2 on ranks 0, 1; pipeline B with TP 1 on rank 2: the
    gradients of differently sharded copies are summed in full and cut back (general sync)."""
    _check("gpt", [(2, 2, [([0, 1], same(GPT_UNITS, tp=2))]), (2, 2, [([2], same(GPT_UNITS))])])


def test_asymmetric_pipelines_zero3_and_replicated_mlp():
    """Pipeline A: ZeRO-3 over ranks 0, 1 (uneven shards); pipeline B: plain on rank 2, other share."""
    _check("mlp", [(2, 3, [([0, 1], same(MLP_UNITS, zero=3))]), (2, 1, [([2], same(MLP_UNITS))])])


def test_four_ranks_three_pipelines_mixed():
    """A: TP-2 stage -> single-rank stage (ranks 0, 1 | 2); B: rank 3 alone with ZeRO-0; shares 4 + 4."""
    _check("gpt", [(2, 2, [([0, 1], [(E, {"tp": 2}), (L0, {"tp": 2, "sp": True, "ckpt": "full"})]),
                           ([2], same([L1, H]))]),
                   (4, 1, [([3], same(GPT_UNITS))])])


def test_llama_pipeline_with_tp_and_asymmetric_partner():
    """Llama (GQA, RoPE, SwiGLU): A = TP 2 + sp stage -> single-rank stage; B = a single rank."""
    _check("llama", [(2, 2, [([0, 1], same([E, L0], tp=2, sp=True)), ([2], same([L1, H]))]),
                     (2, 2, [([3], same(GPT_UNITS, ckpt="selective"))])])
