"""Progress on long searches: bars on stderr for every phase, the baselines included, only when asked;
and the seconds a search reports say what they count."""

from __future__ import annotations

import json

from autopar.cli import main
from autopar.cluster import load_cluster
from autopar.modelspec.load import load_model
from autopar.search import SearchOptions, search


def test_bars_cover_the_plan_and_the_baselines(capsys):
    res = search(load_model("gpt3-1.3b", 512), load_cluster("8xA100-80G"), 16, SearchOptions(progress=True))
    err = capsys.readouterr().err
    assert "configs" in err and "baselines" in err
    assert res.baselines and res.baseline_seconds > 0


def test_heterogeneous_bars_cover_its_shapes_and_baselines(capsys):
    search(load_model("gpt3-1.3b", 512), load_cluster("4x3090+4xA100-80G"), 16, SearchOptions(progress=True))
    err = capsys.readouterr().err
    assert "shapes" in err and "baselines" in err and "configs" in err  # baselines: homogeneous searches


def test_no_bars_unless_asked(capsys):
    res = search(load_model("gpt3-1.3b", 512), load_cluster("8xA100-80G"), 16, SearchOptions(), with_baselines=False)
    assert capsys.readouterr().err == ""
    assert res.baseline_seconds == 0.0


def test_json_seconds_are_the_plans_and_the_baselines_apart(tmp_path, capsys):
    argv = ["search", "--model", "gpt3-1.3b", "--cluster", "8xA100-80G", "--global-batch-size", "16", "--seq-len", "512",
            "-o", str(tmp_path / "p.yaml"), "--json"]
    assert main(argv) == 0
    got = capsys.readouterr()
    assert got.err == ""  # not a terminal, and --json: no bars
    s = json.loads(got.out)["search"]
    assert s["seconds"] > 0 and s["baseline_seconds"] > 0
