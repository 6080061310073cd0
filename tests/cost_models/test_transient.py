"""The gradient cast's transient (``transient.cast_bytes``): DeepSpeed's BF16_Optimizer copies one parameter's
gradient to fp32 at a time, so the largest parameter a rank holds sets it; the working set is the larger of that
and the activations' (hand-computed values on the fakes)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from autopar.estimate import estimate_plan
from autopar.estimate.plan_cost import plan_cost_params
from autopar.measured import load_runs
from cost_models import CostParams
from cost_models.gemm_shapes import Gemm
from cost_models.transient import cast_bytes, largest_param, transient_bound, transient_bytes
from tests.cost_models.fakes import OneNodeStage, Strat, Unit

CAST = CostParams(grad_cast_bytes=4, tied_copy_one_stage=0.0)  # DeepSpeed: a tied copy only on another stage
H, V = 64, 1000


@dataclass(frozen=True)
class Block(Unit):
    gemms: tuple = (Gemm(H, 3 * H, False), Gemm(H, H, True), Gemm(H, 4 * H, False), Gemm(4 * H, H, True))


@dataclass(frozen=True)
class Head(Unit):
    kind: str = "head"
    params: int = H  # its norm: the weight is the embedding's, tied
    tp_params: int = 0
    tied_params: int = V * H
    gemms: tuple = (Gemm(H, V, False),)


def test_largest_parameter_of_each_kind():
    assert largest_param(Block()) == 4 * H * H  # the MLP's up projection, the largest matmul weight
    assert largest_param(Unit(tp_params=V * H)) == V * H  # an embedding: no matmul, its table as one tensor
    assert largest_param(Head()) == 0  # the tied weight is the embedding's: nothing of its own to cast
    assert largest_param(Head(), held=V * H) == V * H  # its own copy on another stage


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_cast_is_four_bytes_per_element_of_the_shard(tp):
    st = OneNodeStage(n=4, micro_batch_size=4, params=CAST)
    assert cast_bytes(Block(), st, tp) == 4 * 4 * H * H / tp
    assert cast_bytes(Unit(tp_params=V * H), st, tp) == 4 * V * H / tp
    assert cast_bytes(Head(), st, tp) == 0.0  # the embedding on this stage holds the weight: cast there
    assert cast_bytes(Head(), replace(st, tie_apart=True), tp) == 4 * V * H / tp
    assert cast_bytes(Block(), replace(st, params=CostParams()), tp) == 0.0  # nothing casts by default


def test_transient_is_the_larger_of_the_working_set_and_the_cast():
    st, cast_st = OneNodeStage(n=4, micro_batch_size=4), OneNodeStage(n=4, micro_batch_size=4, params=CAST)
    small, big = Block(), Unit(tp_params=10_000_000)
    work = transient_bytes(small, st, Strat())  # the fakes' 3e6 'none' bytes per sample, one sample a rank
    assert work == pytest.approx(3e6)
    assert transient_bytes(small, cast_st, Strat()) == work  # 64 KiB of cast under 3 MB of activations
    assert transient_bytes(big, cast_st, Strat()) == 4e7  # 40 MB of cast over them
    assert transient_bound(big, cast_st, [Strat(), Strat(tp=4)]) == 4e7  # the search reserves the most


def test_bloom_bf16_runs_hold_the_embedding_cast():
    """The BLOOM sweep states the cast for its bf16 runs only: their peak grows where the embedding shard's
    fp32 copy is above the largest working set of its stage, the fp16 runs' not at all."""
    rs = load_runs("benchmarks/data/bloom_a100_topology_sweep.yaml")
    bf16, grew = 0, 0
    for run in rs.runs:
        base = plan_cost_params(run.plan)
        with_cast = estimate_plan(run.plan, run.model).max_memory_gib
        without = estimate_plan(run.plan, run.model, replace(base, grad_cast_bytes=0.0)).max_memory_gib
        if "bf16" in run.case_id:
            bf16 += 1
            grew += with_cast > without
            assert with_cast >= without
        else:
            assert with_cast == without
    assert bf16 >= 20 and grew >= bf16 // 2
