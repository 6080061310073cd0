"""Plan files: exact round trips (hypothesis), the compact layer/device notation, and every read error."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from plan_testlib import asym_plan, base_plan, valid_plans

from autopar.cluster.catalogue import gpu_from_entry
from autopar.cluster.parse import load_cluster
from autopar.errors import AutoparError
from autopar.plan.io import dump_plan_yaml, load_plan, plan_from_dict, plan_to_dict, save_plan
from autopar.plan.schema import StageLayer, Strategy
from autopar.plan.validate import plan_problems

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- round trips -------------------------------------------------------------------------------
@FAST
@given(valid_plans())
def test_random_valid_plans_round_trip_through_yaml_text_and_files(plan):
    assert plan_problems(plan) == []  # the generator really makes valid plans
    assert plan_from_dict(plan_to_dict(plan)) == plan
    assert plan_from_dict(yaml.safe_load(dump_plan_yaml(plan))) == plan
    with tempfile.TemporaryDirectory() as d:
        path = save_plan(plan, Path(d) / "sub" / "plan.yaml")
        assert load_plan(path) == plan


@FAST
@given(valid_plans())
def test_plan_dict_is_json_ready(plan):
    d = plan_to_dict(plan)
    text = json.dumps(d, allow_nan=True)
    assert plan_from_dict(json.loads(text)) == plan


def test_fixed_plans_round_trip_and_read_like_the_design_sketch(tmp_path):
    for plan in (base_plan(), asym_plan()):
        assert load_plan(save_plan(plan, tmp_path / "p.yaml")) == plan
    text = dump_plan_yaml(base_plan())
    assert text.splitlines()[2] == "autopar_plan: 1"
    assert "model: {name: tiny, source: tiny, seq_len: 128, layers: 8}" in text
    assert "- devices: 0-3" in text and "- devices: 4-7" in text
    assert "- {name: embed, tp: 1, zero: 3, ckpt: none}" in text
    assert "- {names: layers.0-layers.2, tp: 2, zero: 2, ckpt: full, sp: true}" in text
    assert "- {names: layers.3-layers.5, tp: 4, zero: 1, ckpt: selective}" in text  # sp omitted when false
    assert "repeat: 2" in text  # the two equal nodes are one entry
    assert "memory_budget_gib" not in text and "memory_margin" not in text


def test_numpy_figures_are_written_as_plain_numbers(tmp_path):
    plan = base_plan()
    plan.predicted = {"step_time_s": np.float64(1.25), "mfu": np.float32(0.5), "n": np.int64(7),
                      "memory_gib": {"per_stage": np.array([10.5, 20.25])}, "shape": (1, 2)}
    text = dump_plan_yaml(plan)
    assert "numpy" not in text and "!!" not in text
    back = load_plan(save_plan(plan, tmp_path / "p.yaml")).predicted
    assert back == {"step_time_s": 1.25, "mfu": 0.5, "n": 7, "memory_gib": {"per_stage": [10.5, 20.25]},
                    "shape": [1, 2]}
    assert type(back["step_time_s"]) is float and type(back["n"]) is int


def test_unwritable_values_are_refused_with_their_field():
    plan = base_plan()
    plan.search = {"seconds": 1.0, "obj": object()}
    with pytest.raises(AutoparError, match=r"^search\.obj: holds a object"):
        plan_to_dict(plan)


# -- compact notation --------------------------------------------------------------------------
def _entries(names_and_strategies):
    plan = base_plan()
    plan.pipelines[0].stages[0].layers = [StageLayer(n, s) for n, s in names_and_strategies]
    return plan_to_dict(plan)["pipelines"][0]["stages"][0]["layers"], plan


A, B = Strategy(tp=2, zero=1), Strategy(tp=1, zero=3, ckpt="full")


@pytest.mark.parametrize("units, written", [
    ([("layers.0", A), ("layers.1", A), ("layers.2", A)], ["names:layers.0-layers.2"]),
    ([("layers.0", A), ("layers.1", A), ("layers.2", B)], ["names:layers.0-layers.1", "name:layers.2"]),
    ([("layers.0", A), ("layers.2", A)], ["name:layers.0", "name:layers.2"]),  # a gap breaks the run
    ([("layers.01", A), ("layers.02", A)], ["name:layers.01", "name:layers.02"]),  # leading zeros: no range
    ([("0", A), ("1", A), ("2", A), ("3", A)], ["names:0-3"]),  # nn.Sequential children
    ([("blocks.1.9", A), ("blocks.1.10", A)], ["names:blocks.1.9-blocks.1.10"]),
    ([("block-1", A), ("block-2", A)], ["names:block-1-block-2"]),
    ([("layer9", A), ("layer10", A)], ["names:layer9-layer10"]),
    ([("embed", A), ("layers.0", A), ("head", A)], ["name:embed", "name:layers.0", "name:head"]),
    ([("a.0", A), ("b.1", A)], ["name:a.0", "name:b.1"]),
])
def test_runs_of_numbered_units_with_one_strategy_are_compressed(units, written):
    entries, plan = _entries(units)
    assert [f"{'names' if 'names' in e else 'name'}:{e.get('names', e.get('name'))}" for e in entries] == written
    d = plan_to_dict(plan)
    assert plan_from_dict(d) == plan


def test_reading_accepts_lists_and_explicit_sp_false():
    d = plan_to_dict(base_plan())
    stage = d["pipelines"][0]["stages"][1]
    stage["devices"] = [4, 5, 6, 7]
    stage["layers"] = [{"names": ["layers.3", "layers.4", "layers.5"], "tp": 4, "zero": 1, "ckpt": "selective",
                        "sp": False}, {"name": "head", "tp": 1, "zero": 0, "ckpt": "none"}]
    d["pipelines"][0]["stages"][0]["devices"] = "0-1, 2,3"
    assert plan_from_dict(d) == base_plan()


def test_to_dict_cluster_form_is_read_too():
    plan = base_plan()
    d = plan_to_dict(plan)
    d["cluster"] = plan.cluster.to_dict()  # the Cluster's own layout, GPUs inline
    back = plan_from_dict(d)
    assert back.cluster.num_devices == 8 and back.cluster.nodes[0].gpu == plan.cluster.nodes[0].gpu


WRITTEN_BEFORE = """\
# a plan file as autopar wrote it before the cluster block was read by the cluster-file reader
autopar_plan: 1
model: {name: tiny, source: '', seq_len: 128, layers: 8}
global_batch_size: 32
schedule: gpipe
memory_budget_gib: 20.0
pipelines:
- batch_share: 24
  micro_batch_size: 2
  num_microbatches: 12
  stages:
  - devices: 0-1
    layers:
    - {name: embed, tp: 1, zero: 0, ckpt: none}
    - {names: layers.0-layers.3, tp: 2, zero: 0, ckpt: none}
  - devices: 2-3
    layers:
    - {names: layers.4-layers.5, tp: 1, zero: 3, ckpt: none}
    - {name: head, tp: 1, zero: 3, ckpt: none}
- batch_share: 8
  micro_batch_size: 2
  num_microbatches: 4
  stages:
  - devices: 4-5
    layers:
    - {name: embed, tp: 1, zero: 2, ckpt: full}
    - {names: layers.0-layers.5, tp: 1, zero: 2, ckpt: full}
    - {name: head, tp: 1, zero: 2, ckpt: full}
cluster:
  name: 4xA100+2x3090
  gpus:
    A100-80G: {memory_gib: 80.0, tflops: 312.0, hbm_gbps: 2039.0, nvlink_gbps: 300.0, pcie_gbps: 25.0, vendor: nvidia}
    RTX3090: {memory_gib: 24.0, tflops: 71.0, hbm_gbps: 936.0, nvlink_gbps: 0.0, pcie_gbps: 16.0, vendor: nvidia}
  nodes:
  - {gpu: A100-80G, count: 4, intra_lat_us: 3.0}
  - {gpu: RTX3090, count: 2, intra_lat_us: 3.0}
  inter_bw_gbps: 25.0
  inter_lat_us: 10.0
predicted: {}
search: {}
"""


def test_a_plan_file_written_before_still_loads(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(WRITTEN_BEFORE)
    assert load_plan(path) == asym_plan()


def test_the_cluster_block_is_read_by_the_cluster_file_reader(tmp_path):
    """One GPU reader, one set of defaults: a GPU mapping without its optional fields is the same GPU in
    the catalogue's reader, a cluster file's gpus: and a plan's cluster block (inline or listed)."""
    entry = {"memory_gib": 24, "tflops": 100, "hbm_gbps": 900}
    gpu = gpu_from_entry("MyGPU", entry, "X")[0]
    assert (gpu.nvlink_gbps, gpu.pcie_gbps, gpu.vendor) == (0.0, 32.0, "nvidia")
    cfile = tmp_path / "c.yaml"
    cfile.write_text(yaml.safe_dump({"gpus": {"MyGPU": entry}, "nodes": [{"gpu": "MyGPU", "count": 4}]}))
    assert load_cluster(str(cfile)).nodes[0].gpu == gpu
    d = plan_to_dict(base_plan())
    d["cluster"] = {"name": "mine", "gpus": {"MyGPU": entry}, "nodes": [{"gpu": "MyGPU", "count": 4, "repeat": 2}]}
    plan = plan_from_dict(d)
    assert [nd.gpu for nd in plan.cluster.nodes] == [gpu, gpu] and plan.cluster.name == "mine"
    assert plan.cluster.nodes[0].intra_bw_gbps == 0.0  # left out in a plan: the GPU's own fabric
    d["cluster"]["nodes"] = [{"gpu": {"name": "MyGPU", **entry}, "count": 4, "repeat": 2}]
    assert plan_from_dict(d).cluster == plan.cluster


# -- read errors -------------------------------------------------------------------------------
def _set(path, value):
    """Mutation: set (or delete, value=...) the item at a path of keys/indices."""
    def mutate(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        if value is ...:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return mutate


L1 = ["pipelines", 0, "stages", 1, "layers"]
BAD = {
    "newer version": (_set(["autopar_plan"], 2), "autopar_plan", "newer than this autopar reads"),
    "version not a number": (_set(["autopar_plan"], "one"), "autopar_plan", "expected an integer"),
    "not a plan": (_set(["autopar_plan"], ...), "autopar_plan", "not an autopar plan"),
    "missing mbs": (_set(["pipelines", 0, "micro_batch_size"], ...), "pipelines[0].micro_batch_size", "is missing"),
    "zero microbatches": (_set(["pipelines", 0, "num_microbatches"], 0), "pipelines[0].num_microbatches",
                          "at least 1"),
    "tp as text": (_set(L1 + [0, "tp"], "two"), "pipelines[0].stages[1].layers[0].tp", "expected an integer"),
    "tp as bool": (_set(L1 + [0, "tp"], True), "pipelines[0].stages[1].layers[0].tp", "a boolean"),
    "tp zero": (_set(L1 + [1, "tp"], 0), "pipelines[0].stages[1].layers[1].tp", "at least 1"),
    "bad ckpt": (_set(L1 + [1, "ckpt"], "sometimes"), "pipelines[0].stages[1].layers[1].ckpt", "unknown mode"),
    "zero 4": (_set(L1 + [1, "zero"], 4), "pipelines[0].stages[1].layers[1].zero", "must be 0, 1, 2 or 3"),
    "sp without tp": (_set(L1 + [1, "sp"], True), "pipelines[0].stages[1].layers[1].sp", "needs tp > 1"),
    "sp as text": (_set(L1 + [0, "sp"], "yes please"), "pipelines[0].stages[1].layers[0].sp", "true or false"),
    "range backwards": (_set(L1 + [0, "names"], "layers.5-layers.3"), "pipelines[0].stages[1].layers[0].names",
                        "runs backwards"),
    "range prefixes differ": (_set(L1 + [0, "names"], "layers.3-blocks.5"),
                              "pipelines[0].stages[1].layers[0].names", "one prefix"),
    "range leading zero": (_set(L1 + [0, "names"], "layers.03-layers.05"),
                           "pipelines[0].stages[1].layers[0].names", "leading zeros"),
    "name and names": (_set(L1 + [1, "names"], "head-head"), "pipelines[0].stages[1].layers[1]",
                       "exactly one of 'name'"),
    "unknown layer key": (_set(L1 + [1, "zer0"], 2), "pipelines[0].stages[1].layers[1].zer0", "not a layer field; did you mean zero?"),
    "devices text": (_set(["pipelines", 0, "stages", 0, "devices"], "0-x"), "pipelines[0].stages[0].devices",
                     "not a device range"),
    "negative device": (_set(["pipelines", 0, "stages", 0, "devices"], [0, -1]),
                        "pipelines[0].stages[0].devices[1]", "must be at least 0"),
    "no stages list": (_set(["pipelines", 0, "stages"], {"devices": "0-3"}), "pipelines[0].stages", "a list"),
    "unknown schedule": (_set(["schedule"], "zb-v"), "schedule", "unknown schedule"),
    "budget negative": (_set(["memory_budget_gib"], -3), "memory_budget_gib", "must be > 0"),
    "margin negative": (_set(["memory_margin"], -0.1), "memory_margin", "must be >= 0"),
    "margin whole": (_set(["memory_margin"], 1), "memory_margin", "must be below 1"),
    "margin percent": (_set(["memory_margin"], "10%"), "memory_margin", "expected a number"),
    "no pipelines": (_set(["pipelines"], []), "pipelines", "is empty"),
    "model seq_len text": (_set(["model", "seq_len"], "4k"), "model.seq_len", "expected an integer"),
    "cluster gpu unknown": (_set(["cluster", "nodes", 0, "gpu"], "H200"), "cluster.nodes[0].gpu", "does not list"),
    "cluster count": (_set(["cluster", "nodes", 0, "count"], "eight"), "cluster.nodes[0].count",
                      "expected an integer"),
    "gpu field unknown": (_set(["cluster", "gpus", "A100-80G", "fp8"], 1), "cluster.gpus.A100-80G.fp8",
                          "not a GPU field"),
    "predicted not a mapping": (_set(["predicted"], [1, 2]), "predicted", "expected a mapping"),
    "cluster spec": (_set(["cluster", "spec"], "8xA100"), "cluster.spec", "not a cluster field"),
    "cluster node key": (_set(["cluster", "nodes", 0, "gpus"], 4), "cluster.nodes[0].gpus", "not a node field"),
    "cluster inter bw": (_set(["cluster", "inter_bw_gbps"], 0), "cluster.inter_bw_gbps", "must be > 0"),
    "cluster matrix": (_set(["cluster", "bw_matrix_gbps"], [[0, 1]]), "cluster.bw_matrix_gbps", "2x2"),
    "cluster gpu memory": (_set(["cluster", "gpus", "A100-80G", "memory_gib"], 0), "cluster.gpus.A100-80G.memory_gib",
                           "must be > 0"),
    "cluster inline gpu unnamed": (_set(["cluster", "nodes", 0, "gpu"], {"memory_gib": 8, "tflops": 1, "hbm_gbps": 9}),
                                   "cluster.nodes[0].gpu.name", "is missing"),
    "cluster meta": (_set(["cluster", "meta"], "x"), "cluster.meta", "expected a mapping"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_plan_data_names_the_field(case):
    mutate, field, text = BAD[case]
    d = copy.deepcopy(plan_to_dict(base_plan()))
    mutate(d)
    with pytest.raises(AutoparError) as err:
        plan_from_dict(d)
    assert err.value.field == field, str(err.value)
    assert text in str(err.value)
    assert "\n" not in str(err.value) and err.value.fix


def test_file_errors_name_plan(tmp_path):
    with pytest.raises(AutoparError, match=r"^plan: file .*nope.yaml does not exist"):
        load_plan(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("autopar_plan: 1\npipelines: [\n  - {a: 1\n")
    with pytest.raises(AutoparError, match=r"^plan: .*bad.yaml is not valid YAML at line \d+") as err:
        load_plan(bad)
    assert "\n" not in str(err.value)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(AutoparError, match=r"^plan: .*top level is a list"):
        load_plan(listing)
    with pytest.raises(AutoparError, match=r"^plan: "):
        load_plan(tmp_path)  # a directory


def test_save_to_unwritable_place_names_plan(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(AutoparError, match=r"^plan: cannot write"):
        save_plan(base_plan(), blocker / "plan.yaml")
