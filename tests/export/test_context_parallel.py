"""Context parallel in exports: torchtitan's ``context_parallel_degree`` and Megatron's
``--context-parallel-size`` carry the plan's cp; DeepSpeed and accelerate, which have none, get the
closest plan without it, the change listed."""

from __future__ import annotations

import pytest

from autopar.cluster.parse import load_cluster
from autopar.errors import AutoparError
from autopar.export import prepare, render
from autopar.export.megatron import args as megatron_args
from autopar.export.torchtitan import args as torchtitan_args
from autopar.modelspec.zoo import from_zoo
from autopar.plan.io import save_plan
from autopar.search import SearchOptions, search


@pytest.fixture(scope="module")
def cp_plan(tmp_path_factory) -> str:
    """llama3-8b at 64K tokens on 2x8xH100, searched at cp 8 (one searched degree keeps it quick)."""
    res = search(from_zoo("llama3-8b", 65536), load_cluster("2x8xH100"), 16, SearchOptions(cp_degrees=(8,)),
                 with_baselines=False)
    assert {ly.strategy.cp for st in res.plan.stages for ly in st.layers} == {8}
    path = tmp_path_factory.mktemp("cp") / "plan.yaml"
    save_plan(res.plan, path)
    return str(path)


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_torchtitan_and_megatron_carry_cp(cp_plan):
    tt = prepare(cp_plan, "torchtitan")
    assert tt.shape.cp == 8 and not any(c.startswith("cp:") for c in tt.changes)
    a = torchtitan_args(tt)
    assert _after(a, "--parallelism.context_parallel_degree") == "8"
    degrees = [int(_after(a, f"--parallelism.{k}")) for k in ("data_parallel_replicate_degree",
                                                               "data_parallel_shard_degree",
                                                               "tensor_parallel_degree", "pipeline_parallel_degree")]
    assert degrees[0] * degrees[1] * degrees[2] * degrees[3] * 8 == tt.world  # torchtitan's world: dp x cp x tp x pp
    assert "context_parallel_degree" in render(tt)
    mg = prepare(cp_plan, "megatron")
    m = megatron_args(mg)
    assert mg.shape.cp == 8 and _after(m, "--context-parallel-size") == "8" and "--sequence-parallel" not in m


def test_tools_without_cp_get_the_closest_plan_without_it(cp_plan):
    ex = prepare(cp_plan, "deepspeed")
    assert {ly.strategy.cp for st in ex.plan.stages for ly in st.layers} == {1}
    assert "cp: 8 x34 -> 1 x34" in ex.changes, ex.changes
    # accelerate (FSDP only: no TP, PP or CP) cannot hold 64K-token sequences on 80 GB: one-line refusal
    with pytest.raises(AutoparError, match="no plan accelerate can express is valid and fits"):
        prepare(cp_plan, "accelerate")
