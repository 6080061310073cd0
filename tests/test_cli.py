"""The command line as a contract: outputs, --json, estimate == search, and every bad input -> one line, exit 2."""

import argparse
import json
import sys

import pytest
import yaml

from autopar.cli import main

SEARCH = ["search", "--model", "llama2-7b", "--cluster", "2x8xA100-80G", "--global-batch-size", "512",
          "--seq-len", "4096"]


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "plan.yaml"
    rc = main(SEARCH + ["-o", str(path), "--json"])
    assert rc == 0
    return path


def test_search_json_is_one_object_with_the_contract_keys(tmp_path, capsys):
    rc, out, err = run(SEARCH + ["-o", str(tmp_path / "p.yaml"), "--json"], capsys)
    assert rc == 0
    obj = json.loads(out)  # nothing else on stdout
    assert obj["plan"] == str(tmp_path / "p.yaml")
    assert set(obj["predicted"]) == {"step_time_s", "tokens_per_s", "tps", "tflops", "mfu", "max_memory_gib"}
    assert {"seconds", "candidates", "pruned"} <= set(obj["search"])
    assert set(obj["baselines"]) == {"ddp", "zero3", "megatron"}
    assert obj["baselines"]["ddp"] is None  # 7B replicated Adam states (108 GB) cannot fit in 80 GiB
    for b in obj["baselines"].values():
        if b is not None:
            assert b["step_time_s"] >= obj["predicted"]["step_time_s"] * (1 - 1e-12)
    assert 0 < obj["predicted"]["mfu"] < 1 and obj["predicted"]["max_memory_gib"] <= 80


def test_estimate_reproduces_the_searched_figures(searched, capsys):
    written = yaml.safe_load(searched.read_text())["predicted"]
    rc, out, _ = run(["estimate", str(searched), "--json"], capsys)
    assert rc == 0
    again = json.loads(out)["predicted"]
    for k in ("step_time_s", "tokens_per_s", "tps", "tflops", "mfu", "max_memory_gib"):
        assert again[k] == written[k]


def test_validate_accepts_what_search_wrote(searched, capsys):
    rc, out, _ = run(["validate", str(searched)], capsys)
    assert rc == 0 and "valid" in out


def test_human_output_has_table_figures_and_baselines(tmp_path, capsys):
    rc, out, _ = run(SEARCH + ["-o", str(tmp_path / "p.yaml"), "--explain"], capsys)
    assert rc == 0
    for needle in ("predicted: step", "tokens/s", "MFU", "baselines", "megatron", "zero3", "pruning rules",
                   "dominated", "wrote"):
        assert needle in out
    assert explained_rules(out), "--explain printed no pruning counts"


def test_precision_flag_round_trip(searched, tmp_path, capsys):
    """--precision reaches the plan file, the printed header and estimate; the default plan says bf16."""
    assert yaml.safe_load(searched.read_text())["precision"] == "bf16"
    path = tmp_path / "tf32.yaml"
    rc, out, _ = run(SEARCH + ["--precision", "tf32", "--no-baselines", "-o", str(path)], capsys)
    assert rc == 0 and out.splitlines()[0].endswith("global batch 512, tf32")
    doc = yaml.safe_load(path.read_text())
    assert doc["precision"] == "tf32" and doc["search"]["cost_params"]["param_bytes"] == 4
    rc, out, _ = run(["estimate", str(path)], capsys)
    assert rc == 0 and out.splitlines()[0].endswith(", tf32")
    rc, out, _ = run(["validate", str(path)], capsys)
    assert rc == 0 and "valid" in out


def explained_rules(out: str) -> dict[str, str]:
    """``--explain``'s pruning lines as {rule: description}; every line must carry a description."""
    lines = out.splitlines()
    start = lines.index("pruning rules (count: rule):") + 1
    rules = {}
    for line in lines[start:]:
        if not line.startswith("  ") or not line.strip()[0].isdigit():
            break
        count, rest = line.split(None, 1)
        rule, _, desc = rest.partition(": ")
        assert desc.strip(), f"blank description for {rule}"
        rules[rule] = desc
    return rules


@pytest.mark.parametrize("pymetis", [True, False])
def test_explain_on_a_mixed_cluster_names_planner_and_partitioner(pymetis, tmp_path, capsys, monkeypatch):
    if pymetis:
        pytest.importorskip("pymetis")
    else:
        monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis raises ImportError
    argv = ["search", "--model", "gpt-tiny", "--cluster", "1x3090+1x4090", "--global-batch-size", "8",
            "-o", str(tmp_path / "h.yaml"), "--no-baselines"]
    rc, out, _ = run(argv + ["--explain"], capsys)
    assert rc == 0 and "planner: heterogeneous" in out
    said = "metis" if pymetis else "greedy (pymetis not installed)"
    assert f"partitioner: {said}\n" in out
    assert explained_rules(out)
    assert yaml.safe_load((tmp_path / "h.yaml").read_text())["search"]["partitioner"] == said
    rc, out, _ = run(argv + ["--json"], capsys)
    assert json.loads(out)["search"]["partitioner"] == said


@pytest.mark.parametrize("what", ["models", "gpus", "clusters"])
def test_list(what, capsys):
    rc, out, _ = run(["list", what], capsys)
    assert rc == 0 and len(out.splitlines()) >= 3


def _bad(argv, capsys, field, tmp_path):
    out_file = tmp_path / "never.yaml"
    rc, out, err = run(argv + ["-o", str(out_file)] if argv[0] == "search" else argv, capsys)
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert field in err
    assert not out_file.exists()


@pytest.mark.parametrize("argv,field", [
    (["search", "--model", "llama9-7b", "--cluster", "8xA100-80G", "--global-batch-size", "8"], "model"),
    (["search", "--model", "llama2-7b", "--cluster", "8xB999", "--global-batch-size", "8"], "gpu"),
    (["search", "--model", "llama2-7b", "--cluster", "no-such-preset", "--global-batch-size", "8"], "cluster"),
    (["search", "--model", "llama2-70b", "--cluster", "1xA10", "--global-batch-size", "8"], "no plan fits"),
    (["search", "--model", "llama2-7b", "--cluster", "8xA100-80G", "--global-batch-size", "8",
      "--memory-budget", "2"], "no plan fits"),
    (["search", "--model", "llama-tiny", "--cluster", "2x8xA100-80G", "--global-batch-size", "1"],
     "global_batch_size"),
])
def test_bad_search_input_is_one_line_exit_2(argv, field, capsys, tmp_path):
    _bad(argv, capsys, field, tmp_path)


def test_no_fit_names_the_closest_setting(capsys, tmp_path):
    rc, _, err = run(["search", "--model", "llama2-70b", "--cluster", "1xA10", "--global-batch-size", "8",
                      "-o", str(tmp_path / "x.yaml")], capsys)
    assert rc == 2 and "closest" in err and "GiB per device" in err


def test_malformed_cluster_yaml(capsys, tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes: [ {gpu: A100, count: 8\n")
    _bad(["search", "--model", "llama2-7b", "--cluster", str(bad), "--global-batch-size", "8"], capsys, "c.yaml",
         tmp_path)


def test_argparse_rejects_non_positive_batch(capsys):
    rc, out, err = run(["search", "--model", "llama2-7b", "--cluster", "8xA100-80G", "--global-batch-size", "0"],
                       capsys)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1  # no usage block: one line
    assert err.startswith("autopar: error: search: argument --global-batch-size")


def test_plan_whose_tp_cannot_divide_the_heads_is_refused(searched, capsys, tmp_path):
    doc = yaml.safe_load(searched.read_text())
    doc["pipelines"][0]["stages"][0]["layers"][1]["tp"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    for cmd in ("validate", "estimate"):
        rc, out, err = run([cmd, str(bad)], capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "tp" in err


def test_search_a_factory_model_on_local_cpus(tmp_path, capsys, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "def mlp():\n"
        "    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))\n"
        "def example_input():\n"
        "    return torch.zeros(4, 32)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, out, err = run(["search", "--model", "mymodels:mlp", "--cluster", "2xcpu", "--global-batch-size", "8",
                        "-o", "p.yaml", "--json"], capsys)
    assert rc == 0, err
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    names = [ly.get("name") or ly.get("names") for st in doc["pipelines"][0]["stages"] for ly in st["layers"]]
    assert names and all(n for n in names)
    assert doc["model"]["source"] == "mymodels:mlp"
    rc, out, _ = run(["estimate", "p.yaml", "--json"], capsys)
    assert rc == 0 and json.loads(out)["predicted"]["step_time_s"] == doc["predicted"]["step_time_s"]


def test_launch_writes_torchrun_and_slurm_scripts(searched, capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    rc, out, err = run(["launch", str(searched), "--script", str(script), "--scheduler", "slurm",
                        "-o", str(tmp_path / "L"), "--", "--lr", "3e-4"], capsys)
    assert rc == 0, err
    files = {p.split("/")[-1] for p in out.split()}
    assert {"plan.yaml", "node0.sh", "node1.sh", "autopar.sbatch"} <= files
    node1 = (tmp_path / "L" / "node1.sh").read_text()
    assert "--node-rank" in node1 and "3e-4" in node1
    rc, _, err = run(["launch", str(searched), "--script", str(tmp_path / "missing.py")], capsys)
    assert rc == 2 and "script" in err


# -- the command line as a first-time user meets it ---------------------------------------------------------
def _subparsers():
    from autopar.cli import build_parser

    ap = build_parser()
    [sub] = [a for a in ap._actions if isinstance(a, argparse._SubParsersAction)]
    return ap, sub.choices


def test_version(capsys):
    from autopar.version import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"autopar {__version__}\n"


def test_every_option_of_every_command_has_help_and_shows_its_default():
    ap, subs = _subparsers()
    assert {"search", "estimate", "validate", "launch", "list", "profile", "calibrate", "show",
            "export"} <= set(subs)
    for name, parser in [("autopar", ap), *subs.items()]:
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            label = "/".join(action.option_strings) or action.dest
            assert action.help and action.help.strip(), f"{name} {label}: no help line"
            if action.default not in (None, False, argparse.SUPPRESS):  # a default worth showing is shown
                shown = " ".join(text.split())
                assert f"(default: {action.default})" in shown or "default" in action.help, f"{name} {label}"


@pytest.mark.parametrize("cmd", ["search", "launch", "list"])
def test_help_exits_0_with_defaults(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0
    assert {"search": "(default: 1f1b)", "launch": "(default: launch)", "list": "preset names --cluster takes"}[cmd] in out


def test_list_clusters_names_what_cluster_takes(capsys):
    from autopar.cluster.parse import load_cluster, preset_names

    rc, out, _ = run(["list", "clusters"], capsys)
    lines = out.splitlines()
    assert rc == 0 and len(lines) == len(preset_names()) + 1
    for name, line in zip(preset_names(), lines):
        assert line.split()[0] == name
        assert load_cluster(name).num_devices > 0  # the printed name is accepted by --cluster


def test_small_models_show_sensible_parameter_counts(tmp_path, capsys):
    from autopar.report import param_count

    assert [param_count(n) for n in (87, 1234, 12_345_678, 6.74e9, 405.9e9)] == ["87", "1.23K", "12.3M", "6.74B",
                                                                                  "406B"]
    rc, out, _ = run(["list", "models"], capsys)
    assert rc == 0 and "0.00B" not in out
    assert "gpt-tiny" in out and " 235K params" in out.split("gpt-tiny", 1)[1].splitlines()[0]
    rc, out, _ = run(["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size", "8",
                      "--no-baselines", "-o", str(tmp_path / "p.yaml")], capsys)
    assert rc == 0 and "(seq 32, 235K params, 6 units)" in out.splitlines()[0]


TINY = ["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size", "8", "--no-baselines"]


def test_search_without_o_never_replaces_an_existing_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(TINY, capsys)
    assert rc == 0 and out.splitlines()[-1] == "wrote plan.yaml", err
    first = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    (tmp_path / "plan.yaml").write_text("my own plan\n")
    rc, out, err = run(TINY, capsys)
    assert rc == 2 and out == ""
    assert err == ("autopar: error: search -o: plan.yaml already exists here and -o was not given; pass -o plan.yaml "
                   "to replace it, or -o another path\n")
    assert (tmp_path / "plan.yaml").read_text() == "my own plan\n"
    rc, out, err = run(TINY + ["-o", "plan.yaml"], capsys)  # named explicitly: replaced
    again = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert rc == 0 and again["pipelines"] == first["pipelines"] and again["predicted"] == first["predicted"]


def test_launch_options_reach_the_scripts_and_a_second_launch_replaces_them(searched, capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    out = tmp_path / "L"
    argv = ["launch", str(searched), "--script", str(script), "-o", str(out), "--scheduler", "slurm", "--time", "90",
            "--partition", "gpu", "--cpus-per-task", "16", "--gpus-per-node", "8", "--port", "29400",
            "--torchrun", "torchrun", "--log-dir", str(tmp_path / "logs")]
    rc, stdout, err = run(argv, capsys)
    assert rc == 0, err
    sbatch = (out / "autopar.sbatch").read_text()
    for line in ("#SBATCH --time=90", "#SBATCH --partition=gpu", "#SBATCH --cpus-per-task=16",
                 "#SBATCH --gpus-per-node=8", 'MASTER_PORT="29400"'):
        assert f"\n{line}\n" in sbatch
    node1 = (out / "node1.sh").read_text()
    assert "\nTORCHRUN=torchrun\n" in node1 and f"\nLOG_DIR={tmp_path / 'logs'}\n" in node1
    assert 'MASTER_PORT="${MASTER_PORT:-29400}"' in node1
    rc, _, err = run(argv[:6], capsys)  # again, torchrun scheduler: the sbatch file of the first call goes
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["autopar-launch.txt", "node0.sh", "node1.sh", "plan.yaml"]
