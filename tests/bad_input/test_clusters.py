"""Cluster files: link matrices (asymmetric, misshapen, absurd cells), zones, nodes, GPUs and network
figures out of range, unknown keys. Each search is refused before it starts, in one line."""

from __future__ import annotations

import pytest

from tests.bad_input.harness import NODE, check_refused, cluster_file, search_on, write

TWO = [NODE, {**NODE, "name": "b"}]
THREE = [NODE, {**NODE, "name": "b"}, {**NODE, "name": "c"}]
GPU = {"memory_gib": 24, "tflops": 70, "hbm_gbps": 900}


def _gpu(**over):
    return {"gpus": {"G": {**GPU, **over}}, "nodes": [{"gpu": "G", "count": 4}]}


def _zoned(zones, nodes=None):
    return {"nodes": nodes or [{**NODE, "zone": "east"}, {**NODE, "zone": "west", "name": "w"}], "zones": zones}


DOCS = {
    "bw-matrix-asymmetric": {"nodes": TWO, "bw_matrix_gbps": [[0, 100], [25, 0]]},
    "lat-matrix-asymmetric": {"nodes": TWO, "lat_matrix_us": [[0, 5], [50, 0]]},
    "bw-matrix-asymmetric-3": {"nodes": THREE, "bw_matrix_gbps": [[0, 10, 10], [10, 0, 10], [20, 10, 0]]},
    "bw-matrix-short": {"nodes": TWO, "bw_matrix_gbps": [[0, 1]]},
    "bw-matrix-ragged": {"nodes": TWO, "bw_matrix_gbps": [[0, 1], [1]]},
    "bw-matrix-a-number": {"nodes": TWO, "bw_matrix_gbps": 100},
    "bw-matrix-negative": {"nodes": TWO, "bw_matrix_gbps": [[0, -1], [-1, 0]]},
    "bw-matrix-zero": {"nodes": TWO, "bw_matrix_gbps": [[0, 0], [0, 0]]},
    "bw-matrix-inf": {"nodes": TWO, "bw_matrix_gbps": [[0, float("inf")], [float("inf"), 0]]},
    "bw-matrix-nan": {"nodes": TWO, "bw_matrix_gbps": [[0, float("nan")], [1, 0]]},
    "bw-matrix-word": {"nodes": TWO, "bw_matrix_gbps": [[0, "fast"], ["fast", 0]]},
    "bw-matrix-diagonal-negative": {"nodes": TWO, "bw_matrix_gbps": [[-5, 1], [1, 0]]},
    "lat-matrix-negative": {"nodes": TWO, "lat_matrix_us": [[0, -3], [-3, 0]]},
    "matrix-and-zones": {**_zoned({"default": {"bw_gbps": 1}}), "bw_matrix_gbps": [[0, 1], [1, 0]]},
    "zones-stray-zone": _zoned({"links": [{"zones": ["east", "mars"], "bw_gbps": 1}]}),
    "zones-no-link": _zoned({"links": []}),
    "zones-three-zones": _zoned({"links": [{"zones": ["east", "west", "north"], "bw_gbps": 1}]}),
    "zones-one-zone": _zoned({"links": [{"zones": "east", "bw_gbps": 1}]}),
    "zones-bw-zero": _zoned({"links": [{"zones": ["east", "west"], "bw_gbps": 0}]}),
    "zones-lat-negative": _zoned({"links": [{"zones": ["east", "west"], "bw_gbps": 1, "lat_us": -1}]}),
    "zones-link-unknown-key": _zoned({"links": [{"zones": ["east", "west"], "bw_gbps": 1, "mtu": 9000}]}),
    "zones-default-bw-missing": _zoned({"default": {"lat_us": 5}}),
    "zones-unknown-key": _zoned({"lanes": []}),
    "zones-a-list": _zoned([1]),
    "zone-name-shell": {"nodes": [{**NODE, "zone": "$(id)"}]},
    "nodes-empty": {"nodes": []},
    "nodes-a-mapping": {"nodes": {"gpu": "A100"}},
    "node-count-negative": {"nodes": [{**NODE, "count": -4}]},
    "node-count-word": {"nodes": [{**NODE, "count": "four"}]},
    "node-count-float": {"nodes": [{**NODE, "count": 4.5}]},
    "node-count-bool": {"nodes": [{**NODE, "count": True}]},
    "node-repeat-zero": {"nodes": [{**NODE, "repeat": 0}]},
    "node-gpu-missing": {"nodes": [{"count": 4}]},
    "node-gpu-unknown": {"nodes": [{"gpu": "H900", "count": 4}]},
    "node-unknown-key": {"nodes": [{**NODE, "cores": 64}]},
    "node-intra-bw-zero": {"nodes": [{**NODE, "intra_bw_gbps": 0}]},
    "node-intra-lat-negative": {"nodes": [{**NODE, "intra_lat_us": -1}]},
    "node-name-newline": {"nodes": [{**NODE, "name": "a\nb"}]},
    "gpu-memory-zero": _gpu(memory_gib=0),
    "gpu-memory-negative": _gpu(memory_gib=-24),
    "gpu-tflops-inf": _gpu(tflops=float("inf")),
    "gpu-tflops-word": _gpu(tflops="lots"),
    "gpu-hbm-nan": _gpu(hbm_gbps=float("nan")),
    "gpu-hbm-missing": {"gpus": {"G": {"memory_gib": 24, "tflops": 70}}, "nodes": [{"gpu": "G", "count": 4}]},
    "gpu-nvlink-negative": _gpu(nvlink_gbps=-1),
    "gpu-pcie-zero": _gpu(pcie_gbps=0),
    "gpu-class-unknown": _gpu(**{"class": "quantum"}),
    "gpu-unknown-field": _gpu(watts=700),
    "gpus-a-list": {"gpus": [GPU], "nodes": [NODE]},
    "inter-bw-zero": {"nodes": TWO, "inter_bw_gbps": 0},
    "inter-bw-negative": {"nodes": TWO, "inter_bw_gbps": -25},
    "inter-bw-inf": {"nodes": TWO, "inter_bw_gbps": float("inf")},
    "inter-lat-negative": {"nodes": TWO, "inter_lat_us": -5},
    "inter-lat-word": {"nodes": TWO, "inter_lat_us": "slow"},
    "unknown-top-key": {"nodes": [NODE], "switches": 2},
    "spec-unknown-gpu": {"spec": "2x8xH900"},
    "spec-a-number": {"spec": 16},
    "a-string": "2x8xA100",
    "a-number": 7,
}
RAW = {"not-yaml": "nodes: [ {gpu: A\n", "empty": "", "tab-indented": "nodes:\n\t- gpu: A100\n"}


@pytest.mark.parametrize("case", sorted(DOCS))
def test_bad_cluster_file_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: search_on(cluster_file(d, DOCS[case])), docs, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", sorted(RAW))
def test_unreadable_cluster_file_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: search_on(write(d, "c.yaml", RAW[case])), docs, tmp_path, capsys, monkeypatch)


def test_asymmetric_matrix_names_the_cell(docs, tmp_path, capsys, monkeypatch):
    line = check_refused(lambda d, s: search_on(cluster_file(d, DOCS["bw-matrix-asymmetric-3"])), docs, tmp_path,
                         capsys, monkeypatch)
    assert "bw_matrix_gbps[2][0]: is 20 but" in line and "symmetric" in line
