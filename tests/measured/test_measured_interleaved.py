"""Interleaved measured cases (virtual_stages > 1): read as interleaved plans, or skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.measured.load import load_runs

from .measured_testlib import write

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


def _ok(doc):
    doc["cases"][3]["status"] = "ok"


def test_an_interleaved_case_becomes_megatrons_chunks(tmp_path):
    rs = load_runs(write(tmp_path, _ok))
    run = next(r for r in rs.runs if r.case_id == "interleaved")
    pipe = run.plan.pipelines[0]
    assert run.plan.schedule == "interleaved" and pipe.virtual_stages == 2 and pipe.num_stages == 2
    assert [len(st.layers) for st in pipe.stages] == [2, 1, 1, 2]  # embed + 1 block, 1, 1, 1 block + head
    assert [st.devices for st in pipe.stages] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert estimate_plan(run.plan, run.model).step_time_s > 0


def test_blocks_that_do_not_split_into_equal_chunks_are_refused(tmp_path):
    def edit(doc):
        _ok(doc)
        doc["cases"][3]["virtual_stages"] = 3  # 4 blocks over 2 x 3 chunks
        doc["cases"][3]["num_microbatches"] = 8

    with pytest.raises(AutoparError, match=r"case interleaved.virtual_stages: 4 blocks do not split"):
        load_runs(write(tmp_path, edit))


def test_a_stage_split_that_contradicts_the_chunks_is_refused(tmp_path):
    def edit(doc):
        _ok(doc)
        doc["cases"][3]["layers_per_stage"] = [4, 2]

    with pytest.raises(AutoparError, match=r"case interleaved.layers_per_stage: \[4, 2\] differs from the 2 chunks"):
        load_runs(write(tmp_path, edit))


def test_micro_batches_the_interleaved_table_cannot_run_are_refused_by_the_plan_rules(tmp_path):
    def edit(doc):
        _ok(doc)
        doc["cases"][3].update(num_microbatches=1, micro_batch_size=8)

    skip = next(s for s in load_runs(write(tmp_path, edit)).skipped if s.case_id == "interleaved")
    assert skip.reason == "refused" and "multiple of the stage count" in skip.detail


def test_megatron_ptdp_interleaved_cases_are_scored():
    rs = load_runs(DATA / "megatron_a100_ptdp_table1.yaml")
    inter = {r.case_id: r.plan.pipelines[0].virtual_stages for r in rs.runs if r.plan.schedule == "interleaved"}
    assert inter == {"megatron-a100-ptdp-76b": 3, "megatron-a100-ptdp-145b": 2, "megatron-a100-ptdp-310b": 2,
                     "megatron-a100-ptdp-530b": 3}
    assert not rs.skipped


def test_torchtitan_interleaved_405b_is_unpublished_and_cp_cases_are_scored():
    """The 8B context-parallel runs (FSDP x CP 2/4/8, tp 1) become plans with cp on every unit over
    tp x cp x dp devices; the 405B ones run CP with sequence parallel, which autopar refuses: skipped."""
    rs = load_runs(DATA / "torchtitan_h100_llama3_202412.yaml")
    why = {s.case_id: (s.reason, s.detail) for s in rs.skipped}
    reason, detail = why["titan-405b-512gpu-t5-interleaved"]
    assert reason == "unpublished" and "virtual_stages" in detail
    assert why["titan-405b-512gpu-t6-cp2"][0] == "inexpressible" and "sequence parallel" in why["titan-405b-512gpu-t6-cp2"][1]
    runs = {r.case_id: r for r in rs.runs}
    for cp in (2, 4, 8):
        plan = runs[f"titan-8b-8gpu-t2-cp{cp}"].plan
        assert plan.world_size == 8 and {ly.strategy.cp for st in plan.stages for ly in st.layers} == {cp}
        assert plan.pipelines[0].micro_batch_size == 8 // cp  # one sample per FSDP rank
