"""HSDP (dp_replicate) and every-k-th-block checkpointing (ckpt_every) in measured cases, and the fms-fsdp files."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.measured.load import load_runs
from autopar.plan.validate import plan_problems

from .measured_testlib import write

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
FSDP = {"id": "fsdp", "pp": 1, "tp": 1, "dp": 4, "micro_batch_size": 2, "num_microbatches": 2, "zero": 3,
        "ckpt": "none", "layers_per_stage": [6], "measured_s": 0.5, "status": "ok"}


def _with(**fields):
    def edit(doc):
        doc["cases"] = [FSDP, {**FSDP, "id": "case", **fields}]
    return edit


def _runs(tmp_path, **fields):
    rs = load_runs(write(tmp_path, _with(**fields)), strict=True)
    return {r.case_id: r for r in rs.runs}


def test_hsdp_is_replicas_of_consecutive_ranks_each_sharding_its_own_parameters(tmp_path):
    runs = _runs(tmp_path, dp_replicate=2)
    plan = runs["case"].plan
    assert [st.devices for p in plan.pipelines for st in p.stages] == [[0, 1], [2, 3]]
    assert [p.batch_share for p in plan.pipelines] == [8, 8]
    assert [p.micro_batch_size for p in plan.pipelines] == [4, 4]  # 2 per rank, 2 ranks per replica
    assert all(sl.strategy.zero == 3 for p in plan.pipelines for sl in p.stages[0].layers)
    assert plan_problems(plan, runs["case"].model) == []
    hsdp, fsdp = (estimate_plan(runs[k].plan, runs[k].model) for k in ("case", "fsdp"))
    # parameters sharded over 2 ranks instead of 4: more memory per rank; the estimate prices both
    assert hsdp.max_memory_gib > fsdp.max_memory_gib
    assert hsdp.step_time_s > 0 and hsdp.step_time_s != fsdp.step_time_s


@pytest.mark.parametrize("fields, match", [
    ({"dp_replicate": 3}, r"case case.dp_replicate: is 3, which does not divide dp = 4"),
    ({"dp_replicate": 2, "pp": 2, "dp": 2, "num_microbatches": 4, "layers_per_stage": [3, 3]},
     r"case case.dp_replicate: is 2 with pp = 2"),
    ({"ckpt_every": 2}, r"case case.ckpt_every: is 2 with ckpt none"),
    ({"ckpt_every": 0}, r"case case.ckpt_every"),
])
def test_bad_hsdp_or_ckpt_every_names_the_field(tmp_path, fields, match):
    with pytest.raises(AutoparError, match=match):
        load_runs(write(tmp_path, _with(**fields)))


def test_ckpt_every_checkpoints_every_kth_block_only(tmp_path):
    runs = _runs(tmp_path, ckpt="full", ckpt_every=2)
    modes = [(sl.name, sl.strategy.ckpt) for sl in runs["case"].plan.pipelines[0].stages[0].layers]
    blocks = [m for name, m in modes if name not in (modes[0][0], modes[-1][0])]
    assert blocks == ["none", "full", "none", "full"]  # the 2nd and 4th of 4 blocks, as checkpoint_wrapper's count
    assert modes[0][1] == modes[-1][1] == "none"
    half = estimate_plan(runs["case"].plan, runs["case"].model).step_time_s
    every = _runs(tmp_path, ckpt="full")["case"]
    full = estimate_plan(every.plan, every.model).step_time_s
    none = estimate_plan(runs["fsdp"].plan, runs["fsdp"].model).step_time_s
    assert none < half < full


def test_fms_fsdp_files_read_every_case():
    for gpu, gpus, nodes in (("a100", 128, 16), ("h100", 96, 12)):
        rs = load_runs(DATA / f"fms_fsdp_{gpu}_llama2_202403.yaml", strict=True)
        assert not rs.skipped and not rs.failed and len(rs.runs) == 5
        runs = {r.case_id: r for r in rs.runs}
        for hsdp in ("7b", "7b-compile"):
            assert len(runs[f"fms-{gpu}-{hsdp}"].plan.pipelines) == nodes  # HSDP: one replica per node
        assert all(len(r.plan.pipelines) == 1 for k, r in runs.items() if "-7b" not in k)
        # eager blocks move the counted traffic (benchmarks/eager_traffic.py); compiled ones the fused floor
        assert runs[f"fms-{gpu}-7b"].plan.search["cost_params"]["act_traffic"] == 14.25
        assert runs[f"fms-{gpu}-7b-compile"].plan.search["cost_params"]["act_traffic"] == 3.0
        assert all(r.plan.world_size == gpus for r in rs.runs)
        ckpt = [sl.strategy.ckpt for sl in runs[f"fms-{gpu}-13b"].plan.pipelines[0].stages[0].layers[1:-1]]
        assert ckpt.count("full") == ckpt.count("none") == 20  # every 2nd of 40 blocks
        for r in rs.runs:  # grad_comm_bytes 2: the bfSixteen policy's bf16 reduce_dtype
            assert r.plan.search["cost_params"]["grad_comm_bytes"] == 2


def test_fms_fsdp_step_times_reproduce_the_published_throughput():
    import yaml

    for gpu in ("a100", "h100"):
        doc = yaml.safe_load((DATA / f"fms_fsdp_{gpu}_llama2_202403.yaml").read_text())
        for c in doc["cases"]:
            assert c["measured_s"] == pytest.approx(2 * 4096 / c["published"]["tps_per_gpu"], rel=1e-4)
            # the README's HFU counts recomputation: full AC 4/3 of MFU, every 2nd block about 1 + 1/6, none 1
            ratio = c["published"]["hfu"] / c["published"]["mfu"]
            expect = {"none": 1.0, "full": 4 / 3 if c.get("ckpt_every", 1) == 1 else 1 + 1 / 6}[c["ckpt"]]
            assert ratio == pytest.approx(expect, abs=0.05)
