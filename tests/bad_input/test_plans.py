"""Tampered and damaged plan files: every stored cost parameter, the predicted figures, the embedded
cluster, the strategies and batch shape. ``validate`` recomputes memory and time from the model and
the catalogue's (or the recorded profile's) cost parameters, so each edit is refused, one line."""

from __future__ import annotations

import pytest

from tests.bad_input.harness import check_refused, deleter, edited, setter, write

CP = "search.cost_params"
# (field, stored value): out of range, the wrong type, or in range but not what autopar searched with
COST_EDITS = [
    ("reserve_gib", -100), ("reserve_gib", -0.5), ("reserve_gib", 0.0), ("reserve_gib", 0.25), ("reserve_gib", 80.0),
    ("reserve_gib", "1"), ("reserve_gib", True), ("reserve_gib", float("inf")), ("reserve_gib", float("nan")),
    ("param_bytes", 0), ("param_bytes", -2), ("param_bytes", 1), ("param_bytes", "2"), ("param_bytes", 0.5),
    ("grad_comm_bytes", 0), ("grad_comm_bytes", 2), ("grad_comm_bytes", -4),
    ("state_bytes", 0), ("state_bytes", 1), ("state_bytes", 1e30),
    ("opt_bytes_touched", 0), ("opt_bytes_touched", 1),
    ("eff_max", 0), ("eff_max", -0.6), ("eff_max", 1.5), ("eff_max", 0.9), ("eff_max", "fast"),
    ("layer_overhead_s", -1), ("layer_overhead_s", 0.0),
    ("overlap_sync", -0.1), ("overlap_sync", 1.5), ("overlap_sync", 0.5),
    ("act_traffic", -1), ("act_traffic", 0.0), ("act_traffic", "3"),
    ("overlap_zero3", 2), ("overlap_zero3", 0.0),
    ("async_tp_overlap", -0.1), ("async_tp_overlap", 1.5), ("async_tp_overlap", "x"),
    ("step_overhead_per_unit_s", -1), ("step_overhead_per_unit_s", 0.5),
    ("eff_by_kind", [["block", 1, 0, 0.9, 0.0]]), ("eff_by_kind", [["block", 0, 0, 0.5, 0.0]]),
    ("eff_by_kind", [["block", 1, 5, 0.5, 0.0]]), ("eff_by_kind", [["block", 1, 0, 0.5]]), ("eff_by_kind", "x"),
    ("eff_by_kind", [["block", 1, 0, 7.0, 0.0]]),
    ("comm_fit", [["allreduce", 2, 0.0, 0.0]]), ("comm_fit", [["broadcast", 2, 0.0, 0.0]]),
    ("comm_fit", [["allreduce", 1, 0.0, 0.0]]), ("comm_fit", [["allreduce", 2, -1.0, 0.0]]),
    ("state_table", [[16, 0], [4, 16], [4, 16], [0, 16]]), ("state_table", [[1, 1]]),
    ("state_table", [[-1, 0]] * 4), ("state_table", [[0, 0, 0]] * 4),
    ("warp_factor", 9),
]
FIELDS = ["eff_max", "layer_overhead_s", "param_bytes", "grad_comm_bytes", "state_bytes", "opt_bytes_touched",
          "overlap_sync", "overlap_zero3", "reserve_gib", "eff_by_kind", "comm_fit", "state_table",
          "step_overhead_per_unit_s", "act_traffic"]  # fields added later (cost_params._LATER) may be absent
PREDICTED = ["step_time_s", "tokens_per_s", "tps", "tflops", "mfu", "max_memory_gib"]
LAYERS = "pipelines.0.stages.0.layers"


def _scaled(key: str, factor: float):
    def edit(doc):
        doc["predicted"][key] = doc["predicted"][key] * factor
    return edit


def _both(*edits):
    def edit(doc):
        for e in edits:
            e(doc)
    return edit


def _zero_two_byte_counts(doc):  # the issue's example: 560 GiB/device made to look like 44.5
    doc["search"]["cost_params"].update(state_bytes=1, param_bytes=1)


def _shrink_two_byte_counts(doc):  # the same cut, with counts that hold together (no optimizer state)
    doc["search"]["cost_params"].update(state_bytes=5, param_bytes=1)


def _other_zero(doc):  # whatever stage the search picked for layers.1, another one
    layer = doc["pipelines"][0]["stages"][0]["layers"][1]
    layer["zero"] = 0 if layer["zero"] else 3


def _option_flipped(doc):  # a sharding option the search did not pick: the stored figures no longer hold
    for layer in doc["pipelines"][0]["stages"][0]["layers"]:
        if layer["zero"] == 3:
            layer["reshard"] = not layer.get("reshard", True)
            return
        if layer["zero"] in (1, 2):
            layer["zero_overlap"] = not layer.get("zero_overlap", False)
            return
    raise AssertionError("no ZeRO unit in the plan")


PLAN_EDITS = {
    **{f"cost-{k}={v!r}"[:60]: setter(f"{CP}.{k}", v) for k, v in COST_EDITS},
    **{f"cost-{k}-deleted": deleter(f"{CP}.{k}") for k in FIELDS},
    "cost-params-a-list": setter(CP, [1, 2]),
    "cost-params-a-string": setter(CP, "defaults"),
    "cost-two-byte-counts-zeroed": _zero_two_byte_counts,
    **{f"predicted-{k}-halved": _scaled(k, 0.5) for k in PREDICTED},
    **{f"predicted-{k}-off-by-1e-5": _scaled(k, 1 + 1e-5) for k in PREDICTED},
    "predicted-step-a-word": setter("predicted.step_time_s", "fast"),
    "predicted-step-a-bool": setter("predicted.step_time_s", True),
    "predicted-per-stage-lowered": setter("predicted.memory_gib.per_stage", [[1.0]]),
    "predicted-per-stage-a-word": setter("predicted.memory_gib.per_stage", "low"),
    "predicted-per-stage-extra": setter("predicted.memory_gib.per_stage", [[7.676], [1.0]]),
    "predicted-a-list": setter("predicted", [1]),
    "cluster-gpu-tflops": setter("cluster.gpus.A100-80G.tflops", 900.0),
    "cluster-gpu-hbm": setter("cluster.gpus.A100-80G.hbm_gbps", 9000.0),
    "cluster-gpu-memory-tiny": setter("cluster.gpus.A100-80G.memory_gib", 1.0),
    "cluster-gpu-memory-raised": setter("cluster.gpus.A100-80G.memory_gib", 800.0),
    "cluster-gpu-memory-raised-a-little": setter("cluster.gpus.A100-80G.memory_gib", 81.0),
    "cluster-gpu-nvlink-unused": setter("cluster.gpus.A100-80G.pcie_gbps", 64.0),
    "cluster-renamed-to-another-preset": setter("cluster.name", "2x4xH100"),
    "cluster-node-name": setter("cluster.nodes.1.name", "spare"),
    "cluster-gpu-memory-negative": setter("cluster.gpus.A100-80G.memory_gib", -80.0),
    "cluster-gpu-tflops-zero": setter("cluster.gpus.A100-80G.tflops", 0),
    "cluster-gpu-tflops-inf": setter("cluster.gpus.A100-80G.tflops", float("inf")),
    "cluster-intra-bw": _both(setter("cluster.nodes.0.intra_bw_gbps", 1.0), setter("cluster.nodes.1.intra_bw_gbps", 1.0)),
    "cluster-intra-lat": _both(setter("cluster.nodes.0.intra_lat_us", 5e3), setter("cluster.nodes.1.intra_lat_us", 5e3)),
    "cluster-inter-bw": setter("cluster.inter_bw_gbps", 2000.0),
    "cluster-inter-bw-zero": setter("cluster.inter_bw_gbps", 0),
    "cluster-inter-lat": setter("cluster.inter_lat_us", 5000.0),
    "cluster-matrix-asymmetric": setter("cluster.bw_matrix_gbps", [[0, 200.0], [100.0, 0]]),
    "cluster-node-count": setter("cluster.nodes.0.count", 8),
    "strategy-zero-lowered": setter(f"{LAYERS}.1.zero", 1),
    "strategy-zero-changed": _other_zero,
    "strategy-zero-5": setter(f"{LAYERS}.1.zero", 5),
    "strategy-ckpt-full": setter(f"{LAYERS}.1.ckpt", "full"),
    "strategy-ckpt-unknown": setter(f"{LAYERS}.1.ckpt", "some"),
    "strategy-tp-lowered": setter(f"{LAYERS}.0.tp", 2),
    "strategy-tp-3": setter(f"{LAYERS}.0.tp", 3),
    "strategy-head-zero": setter(f"{LAYERS}.2.zero", 0),
    "strategy-reshard-with-zero-1": _both(setter(f"{LAYERS}.1.zero", 1), setter(f"{LAYERS}.1.reshard", False)),
    "strategy-overlap-with-zero-3": _both(setter(f"{LAYERS}.1.zero", 3), setter(f"{LAYERS}.1.zero_overlap", True)),
    "strategy-overlap-a-word": setter(f"{LAYERS}.1.zero_overlap", "yes"),
    "strategy-sharding-option-flipped": _option_flipped,
    "strategy-cp-0": setter(f"{LAYERS}.1.cp", 0),
    "strategy-cp-mixed": setter(f"{LAYERS}.1.cp", 2),  # one cp per pipeline: the pair of units named
    "strategy-async-tp-without-sp": setter(f"{LAYERS}.0.async_tp", True),  # the pair (tp, sp) named
    "strategy-async-tp-a-word": setter(f"{LAYERS}.1.async_tp", "yes"),
    "strategy-layer-dropped": lambda doc: doc["pipelines"][0]["stages"][0]["layers"].pop(1),
    "batch-micro-halved": _both(setter("pipelines.0.micro_batch_size", 8), setter("pipelines.0.num_microbatches", 2)),
    "batch-global-doubled": _both(setter("global_batch_size", 32), setter("pipelines.0.batch_share", 32),
                                  setter("pipelines.0.micro_batch_size", 32)),
    "batch-share-mismatch": setter("pipelines.0.batch_share", 8),
    "schedule-unknown": setter("schedule", "zb-v"),
    "schedule-interleaved-one-chunk": setter("schedule", "interleaved"),  # needs virtual_stages >= 2
    "schedule-zb-h1-one-stage": setter("schedule", "zb-h1"),  # zero bubble needs 2+ stages
    "virtual-stages-with-1f1b": setter("pipelines.0.virtual_stages", 2),  # the pair named
    "virtual-stages-zero": setter("pipelines.0.virtual_stages", 0),
    "precision-unknown": setter("precision", "fp64"),
    "precision-fp8-on-a100": setter("precision", "fp8"),
    "precision-changed": setter("precision", "fp32"),  # the stored cost parameters are bf16's: tampered
    "model-seq-len": setter("model.seq_len", 256),
    "model-other": setter("model", {"name": "gpt3-2.7b", "source": "gpt3-2.7b", "seq_len": 512, "layers": 26}),
    "version-2": setter("autopar_plan", 2),
    "budget-negative": setter("memory_budget_gib", -1),
}
# a few edits through estimate and launch too (the same checks)
OTHER_COMMANDS = ["cluster-gpu-memory-raised", "cost-reserve_gib=-100", "cost-two-byte-counts-zeroed", "cost-reserve_gib=0.25",
                  "predicted-max_memory_gib-halved", "cluster-gpu-tflops", "strategy-ckpt-full", "cost-eff_max=0.9"]


@pytest.mark.parametrize("case", sorted(PLAN_EDITS))
def test_tampered_plan_is_refused_by_validate(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: ["validate", edited(d, s.plan, PLAN_EDITS[case])], docs, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", OTHER_COMMANDS)
@pytest.mark.parametrize("cmd", ["estimate", "launch"])
def test_tampered_plan_is_refused_by_estimate_and_launch(cmd, case, docs, tmp_path, capsys, monkeypatch):
    def build(d, s):
        path = edited(d, s.plan, PLAN_EDITS[case])
        return ["estimate", path] if cmd == "estimate" else ["launch", path, "--script", write(d, "t.py", ""), "-o",
                                                             "OUT"]
    check_refused(build, docs, tmp_path, capsys, monkeypatch)


def test_the_issues_examples_name_tampering(docs, tmp_path, capsys, monkeypatch):
    line = check_refused(lambda d, s: ["validate", edited(d, s.plan, _zero_two_byte_counts)], docs, tmp_path,
                         capsys, monkeypatch)
    assert "search.cost_params.state_bytes: state_bytes 1 is below param_bytes 1 + grad_bytes 4" in line


def test_byte_counts_cut_consistently_are_named_tampering(docs, tmp_path, capsys, monkeypatch):
    line = check_refused(lambda d, s: ["validate", edited(d, s.plan, _shrink_two_byte_counts)], docs, tmp_path,
                         capsys, monkeypatch)
    assert "plan.search.cost_params: differ from this autopar's defaults" in line and "tampered" in line


def test_an_option_at_the_wrong_zero_level_names_the_pair(docs, tmp_path, capsys, monkeypatch):
    line = check_refused(lambda d, s: ["validate", edited(d, s.plan, PLAN_EDITS["strategy-reshard-with-zero-1"])],
                         docs, tmp_path, capsys, monkeypatch)
    assert "layers[1].reshard: reshard: False with zero 1" in line and "zero: 3" in line
