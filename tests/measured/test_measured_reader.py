"""load_runs on a hand-written file and on the real AMP measurements: plans built, validated, skips named."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.estimate import estimate_plan
from autopar.measured import load_runs
from autopar.plan.validate import plan_problems

from .measured_testlib import write

AMP = Path(__file__).resolve().parents[3] / "shared" / "measured" / "amp_homogeneous.yaml"


def test_small_file_builds_plans_models_and_clusters(tmp_path):
    rs = load_runs(write(tmp_path))
    assert rs.name == "tiny" and rs.total == 5
    assert [r.case_id for r in rs.runs] == ["pp2", "tp2-even"]
    assert [r.case_id for r in rs.failed] == ["oom"] and rs.failed[0].measured_s is None
    assert {s.case_id: s.reason for s in rs.skipped} == {"interleaved": "inexpressible", "no-mbs": "unpublished"}
    assert "micro_batch_size" in next(s.detail for s in rs.skipped if s.case_id == "no-mbs")
    assert not rs.notes  # "precision: fp16" names a precision: modelled, no note
    assert {r.plan.precision for r in rs.runs + rs.failed} == {"fp16"}

    pp2, tp2 = rs.runs
    assert pp2.model.num_layers == 6 and pp2.model.seq_len == 512  # embed, 4 blocks, head
    pipe = pp2.plan.pipelines[0]
    assert [st.devices for st in pipe.stages] == [[0, 1], [2, 3]]
    assert [len(st.layers) for st in pipe.stages] == [3, 3]
    assert pipe.micro_batch_size == 4 and pipe.num_microbatches == 4 and pipe.batch_share == 16  # 2 per DP rank x 2
    ckpt = {ly.name: ly.strategy.ckpt for st in pipe.stages for ly in st.layers}
    assert ckpt["embed"] == ckpt["head"] == "none" and ckpt["layers.0"] == "full"  # blocks only
    assert pp2.plan.cluster.nodes[0].gpu.name == "A100-80G" and pp2.plan.world_size == 4
    assert any("intra_bw_gbps null: catalogue default" in n for n in pp2.notes)
    assert pp2.measured_s == 0.5 and pp2.group == "4x256a4 s512 gbs16 on 4xA100-80G"

    strategies = {ly.strategy for st in tp2.plan.pipelines[0].stages for ly in st.layers}
    assert {(s.tp, s.zero, s.sp) for s in strategies} == {(2, 1, True)}
    assert any("layers_per_stage null: even split [6]" in n for n in tp2.notes)
    for run in rs.runs + rs.failed:
        assert plan_problems(run.plan, run.model) == []
        assert estimate_plan(run.plan, run.model).step_time_s > 0


def test_partial_node_and_full_nodes(tmp_path):
    def edit(doc):
        doc["cluster"]["nodes"][0]["count"] = 8
        doc["cases"] = doc["cases"][:1]

    run = load_runs(write(tmp_path, edit)).runs[0]
    assert [nd.count for nd in run.plan.cluster.nodes] == [4]  # 4 GPUs of an 8-GPU node

    def edit2(doc):
        doc["cluster"]["nodes"][0]["count"] = 2
        doc["cluster"]["inter_bw_gbps"] = 12.5
        doc["cases"] = doc["cases"][:1]

    run = load_runs(write(tmp_path, edit2)).runs[0]
    assert [nd.count for nd in run.plan.cluster.nodes] == [2, 2] and run.plan.cluster.inter_bw_gbps == 12.5


@pytest.mark.skipif(not AMP.is_file(), reason="shared/measured is not beside the repository")
def test_shared_amp_file():
    rs = load_runs(AMP)
    assert (len(rs.runs), len(rs.failed), rs.skip_counts()) == (47, 4, {"inexpressible": 1})
    assert [s.case_id for s in rs.skipped] == ["amp-homo-47"]
    for run in rs.runs + rs.failed:
        assert plan_problems(run.plan, run.model) == []
        assert run.plan.world_size == 16 and run.plan.global_batch_size == 32
        assert [nd.count for nd in run.plan.cluster.nodes] == [4, 4, 4, 4]
        assert run.plan.cluster.inter_bw_gbps == 6.25 and run.plan.cluster.nodes[0].intra_bw_gbps == 6.25
    first = rs.runs[0]
    assert first.case_id == "amp-homo-00" and first.measured_s == 1.32 and first.source_predicted_s == 1.2443
    assert first.plan.pipelines[0].micro_batch_size == 16  # 1 per DP rank x 16 ranks
