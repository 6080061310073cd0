"""The bad-input contract of the command line: every refusal exits 2 with exactly one stderr line
``autopar: error: ...``, nothing on stdout and no file written. One parametrised case per input:
flags, model sources, cluster files, plan files, outputs and launch inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from autopar.cli import main
from tests.bad_input.harness import check_refused, edited, setter

SEARCH = ["search", "--model", "gpt3-1.3b", "--cluster", "2x4xA100-80G", "--global-batch-size", "16",
          "--seq-len", "512", "--no-baselines"]


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("bad") / "plan.yaml"
    assert main(SEARCH + ["-o", str(path), "--json"]) == 0
    return yaml.safe_load(path.read_text())


def _hostile_gpu(doc):
    spec = doc["cluster"]["gpus"].pop("A100-80G")
    doc["cluster"]["gpus"]["A100\ntouch PWNED #"] = spec
    for nd in doc["cluster"]["nodes"]:
        nd["gpu"] = "A100\ntouch PWNED #"


def _over_budget(doc):
    doc["global_batch_size"] = 1024
    doc["pipelines"][0].update(batch_share=1024, micro_batch_size=1024)


def _file(d: Path, name: str, text: str) -> str:
    path = d / "in" / name
    path.write_text(text)
    return str(path)


FACTORIES = {
    "exits": "import sys\ndef make():\n    sys.exit(3)\n",
    "exits_at_import": "import sys\nsys.exit(4)\ndef make():\n    pass\n",
    "raises": "def make():\n    raise RuntimeError('no GPU here')\n",
    "not_a_module": "def make():\n    return 42\n",
    "parses_argv_at_import": "import argparse\nargparse.ArgumentParser().parse_args(['--nope'])\ndef make():\n    pass\n",
}
# builds on the meta device (the planner's trace), fails when `autopar profile` builds it for real
REAL_BUILD_FAILS = {
    "real_build_fails": "import torch\nfrom torch import nn\ndef make():\n    if torch.empty(1).device.type != 'meta':\n"
                        "        raise SystemExit('no real weights here')\n    return nn.Linear(4, 4)\n"
                        "def example_input():\n    return torch.zeros(2, 4)\n",
}


def _factory(d: Path, kind: str) -> str:
    name = f"badfactory_{kind}_{abs(hash(str(d))) % 10**8}"  # fresh module name: no import cache between cases
    (d / "in" / f"{name}.py").write_text({**FACTORIES, **REAL_BUILD_FAILS}[kind])
    return f"{name}:make"


def _factory_case(kind: str):
    return lambda d, p: ["search", "--model", _factory(d, kind), *SEARCH[3:], "-o", "OUT"]


def _cluster(d: Path, doc) -> str:
    return _file(d, "c.yaml", yaml.safe_dump(doc))


LAUNCH_OPTIONS = {  # flags of `autopar launch` -> a bad value (NOTEXEC: a torchrun file without the x bit)
    "port-zero": ["--port", "0"],
    "port-too-big": ["--port", "65536"],
    "port-word": ["--port", "http"],
    "master-addr-shell": ["--master-addr", "$(touch PWNED)"],
    "torchrun-missing": ["--torchrun", "/nonexistent/bin/torchrun"],
    "torchrun-not-executable": ["--torchrun", "NOTEXEC"],
    "torchrun-name-shell": ["--torchrun", "torchrun;touch PWNED"],
    "log-dir-newline": ["--log-dir", "logs\nx"],
    "time-words": ["--scheduler", "slurm", "--time", "two hours"],
    "time-bad-minutes": ["--scheduler", "slurm", "--time", "1:75:00"],
    "partition-shell": ["--scheduler", "slurm", "--partition", "gpu;touch PWNED"],
    "cpus-per-task-zero": ["--scheduler", "slurm", "--cpus-per-task", "0"],
    "gpus-per-node-mismatch": ["--scheduler", "slurm", "--gpus-per-node", "8"],
    "gpus-per-node-word": ["--scheduler", "slurm", "--gpus-per-node", "all"],
    "time-without-slurm": ["--time", "90"],
    "partition-without-slurm": ["--partition", "gpu"],
}


def _launch_case(flags: list[str]):
    def build(d: Path, p) -> list[str]:
        given = [_file(d, "torchrun", "#!/bin/sh\n") if f == "NOTEXEC" else f for f in flags]  # not executable
        return ["launch", edited(d, p, lambda doc: None), "--script", _file(d, "t.py", ""), "-o", "OUT", *given]
    return build


def _manifest(d: Path, line: str) -> str:
    """A launch directory whose manifest names ``line`` (a file autopar launch never writes)."""
    out = _dir(d / "in" / "L")
    (out / "autopar-launch.txt").write_text(f"plan.yaml\n{line}\n")
    return str(out)


NODE = {"gpu": "A100", "count": 4}
# id -> argv builder (d: the test's folder, p: the searched plan as a document); "OUT" is replaced by d/out/x
CASES = {
    # flags
    "no-command": lambda d, p: [],
    "unknown-command": lambda d, p: ["frobnicate"],
    "search-missing-model": lambda d, p: ["search", "--cluster", "8xA100", "--global-batch-size", "8"],
    "batch-zero": lambda d, p: SEARCH[:5] + ["--global-batch-size", "0"],
    "batch-word": lambda d, p: SEARCH[:5] + ["--global-batch-size", "many"],
    "seq-len-negative": lambda d, p: SEARCH + ["--seq-len", "-1"],
    "memory-budget-zero": lambda d, p: SEARCH + ["--memory-budget", "0", "-o", "OUT"],
    "time-budget-nan": lambda d, p: SEARCH + ["--time-budget", "nan", "-o", "OUT"],
    "schedule-unknown": lambda d, p: SEARCH + ["--schedule", "zb-v"],
    "precision-unknown": lambda d, p: SEARCH + ["--precision", "fp64", "-o", "OUT"],
    "precision-fp8-on-a100": lambda d, p: SEARCH + ["--precision", "fp8", "-o", "OUT"],
    "precision-custom-gpu-without-fp32": lambda d, p: [*SEARCH[:3], "--cluster", _cluster(d, {
        "gpus": {"X1": {"memory_gib": 80, "tflops": 300, "hbm_gbps": 2000}}, "nodes": [{"gpu": "X1", "count": 8}]}),
        *SEARCH[5:], "--precision", "fp32", "-o", "OUT"],
    "estimate-precision-unknown": lambda d, p: ["estimate", edited(d, p, lambda doc: None), "--precision", "int8"],
    "estimate-precision-fp8-on-a100": lambda d, p: ["estimate", edited(d, p, lambda doc: None), "--precision", "fp8"],
    "unknown-flag": lambda d, p: ["estimate", "x.yaml", "--bogus"],
    "list-unknown": lambda d, p: ["list", "tpus"],
    "profile-nproc-zero": lambda d, p: ["profile", "--nproc", "0", "-o", "OUT"],
    "profile-device-unknown": lambda d, p: ["profile", "--device", "tpu", "-o", "OUT"],
    "launch-no-script": lambda d, p: ["launch", "x.yaml"],
    "launch-scheduler-unknown": lambda d, p: ["launch", "x.yaml", "--script", "t.py", "--scheduler", "pbs"],
    # model sources
    "model-unknown": lambda d, p: ["search", "--model", "gpt-5", *SEARCH[3:], "-o", "OUT"],
    "model-empty": lambda d, p: ["search", "--model", " ", *SEARCH[3:], "-o", "OUT"],
    "model-module-missing": lambda d, p: ["search", "--model", "nosuchpkg.models:make", *SEARCH[3:], "-o", "OUT"],
    "model-attr-missing": lambda d, p: ["search", "--model", f"{_factory(d, 'raises').split(':')[0]}:nothing",
                                        *SEARCH[3:], "-o", "OUT"],
    "trace-zoo-model": lambda d, p: SEARCH + ["--trace", "-o", "OUT"],
    "trace-encoder-config": lambda d, p: ["search", "--model", _file(d, "bert.json", json.dumps({
        "model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
        "intermediate_size": 64, "vocab_size": 64})), "--trace", *SEARCH[3:], "-o", "OUT"],
    "estimate-trace-zoo-plan": lambda d, p: ["estimate", edited(d, p, lambda doc: None), "--trace"],
    "plan-traced-zoo-source": lambda d, p: ["estimate", edited(d, p, setter("model.source", "traced:gpt3-1.3b"))],
    **{f"factory-{k}": _factory_case(k) for k in FACTORIES},
    "profile-factory-exits-on-real-build": lambda d, p: ["profile", "--model", _factory(d, "real_build_fails"),
                                                         "--quick", "--json", "-o", "OUT"],
    "hf-config-malformed": lambda d, p: ["search", "--model", _file(d, "config.json", "{not json"), *SEARCH[3:]],
    "hf-config-empty-object": lambda d, p: ["search", "--model", _file(d, "config.json", "{}"), *SEARCH[3:]],
    # cluster files and specs
    "cluster-unknown-gpu": lambda d, p: [*SEARCH[:3], "--cluster", "8xNOPE", *SEARCH[5:], "-o", "OUT"],
    "cluster-file-missing": lambda d, p: [*SEARCH[:3], "--cluster", str(d / "none.yaml"), *SEARCH[5:]],
    "cluster-path-newline": lambda d, p: [*SEARCH[:3], "--cluster", "c\nx.yaml", *SEARCH[5:]],
    "cluster-yaml-malformed": lambda d, p: [*SEARCH[:3], "--cluster", _file(d, "c.yaml", "nodes: [ {gpu: A\n"),
                                            *SEARCH[5:]],
    "cluster-is-a-list": lambda d, p: [*SEARCH[:3], "--cluster", _cluster(d, [NODE]), *SEARCH[5:]],
    "cluster-count-zero": lambda d, p: [*SEARCH[:3], "--cluster", _cluster(d, {"nodes": [{**NODE, "count": 0}]}),
                                        *SEARCH[5:]],
    "cluster-gpu-name-newline": lambda d, p: [*SEARCH[:3], "--cluster", _cluster(d, {
        "gpus": {"X\ntouch PWNED": {"memory_gib": 24, "tflops": 70, "hbm_gbps": 900}},
        "nodes": [{"gpu": "X\ntouch PWNED", "count": 4}]}), *SEARCH[5:]],
    "cluster-inline-gpu-name-shell": lambda d, p: [*SEARCH[:3], "--cluster", _cluster(d, {"nodes": [{"count": 4, "gpu": {
        "name": "$(touch PWNED)", "memory_gib": 24, "tflops": 70, "hbm_gbps": 900}}]}), *SEARCH[5:]],
    "cluster-node-name-shell": lambda d, p: [*SEARCH[:3], "--cluster", _cluster(d, {"nodes": [{**NODE, "name": "a;b"}]}),
                                             *SEARCH[5:]],
    "cluster-zone-newline": lambda d, p: [*SEARCH[:3], "--cluster", _cluster(d, {"nodes": [{**NODE, "zone": "e\nw"}]}),
                                          *SEARCH[5:]],
    # plan files
    "plan-missing": lambda d, p: ["validate", str(d / "none.yaml")],
    "plan-not-yaml": lambda d, p: ["validate", _file(d, "p.yaml", "autopar_plan: [1\n")],
    "plan-empty": lambda d, p: ["estimate", _file(d, "p.yaml", "")],
    "plan-a-list": lambda d, p: ["validate", _file(d, "p.yaml", "- 1\n- 2\n")],
    "validate-tp-over-stage": lambda d, p: ["validate", edited(d, p, setter("pipelines.0.stages.0.layers.0.tp", 16))],
    "estimate-tp-over-stage": lambda d, p: ["estimate", edited(d, p, setter("pipelines.0.stages.0.layers.0.tp", 16))],
    "validate-devices-out-of-range": lambda d, p: ["validate", edited(d, p, setter("pipelines.0.stages.0.devices",
                                                                                "0-11"))],
    "validate-cluster-lost-a-node": lambda d, p: ["validate", edited(d, p, lambda doc: doc["cluster"]["nodes"].pop())],
    "validate-hostile-gpu-name": lambda d, p: ["validate", edited(d, p, _hostile_gpu)],
    "validate-hostile-cluster-name": lambda d, p: ["validate", edited(d, p, setter("cluster.name", "c\ntouch PWNED"))],
    "validate-hostile-node-name": lambda d, p: ["validate", edited(d, p, setter("cluster.nodes.0.name", "`touch x`"))],
    "validate-over-budget": lambda d, p: ["validate", edited(d, p, _over_budget)],
    "estimate-unknown-profile": lambda d, p: ["estimate", edited(d, p, lambda doc: None), "--profile",
                                              str(d / "none.yaml")],
    # launch inputs
    "launch-hostile-gpu-name": lambda d, p: ["launch", edited(d, p, _hostile_gpu), "--script", _file(d, "t.py", ""),
                                             "-o", "OUT"],
    "launch-over-budget": lambda d, p: ["launch", edited(d, p, _over_budget), "--script", _file(d, "t.py", ""),
                                        "-o", "OUT"],
    "launch-tp-over-stage-forced": lambda d, p: ["launch", edited(d, p, setter("pipelines.0.stages.0.layers.0.tp", 16)),
                                                 "--script", _file(d, "t.py", ""), "-o", "OUT", "--force"],
    "launch-script-missing": lambda d, p: ["launch", edited(d, p, lambda doc: None), "--script", str(d / "no.py"),
                                           "-o", "OUT"],
    "launch-out-dir-newline": lambda d, p: ["launch", edited(d, p, lambda doc: None), "--script",
                                            _file(d, "t.py", ""), "-o", str(d / "out" / "l\nx")],
    "launch-out-dir-is-a-file": lambda d, p: ["launch", edited(d, p, lambda doc: None), "--script",
                                              _file(d, "t.py", ""), "-o", _file(d, "f", "")],
    "launch-out-plan-is-a-directory": lambda d, p: ["launch", edited(d, p, lambda doc: None), "--script",
                                                    _file(d, "t.py", ""), "-o", str(_dir(d / "in" / "L" / "plan.yaml")
                                                                                    .parent)],
    # launch options (tests/launch/test_launch_scripts.py runs what they write)
    **{f"launch-{k}": _launch_case(v) for k, v in LAUNCH_OPTIONS.items()},
    "launch-out-dir-not-written-by-launch": lambda d, p: ["launch", edited(d, p, lambda doc: None), "--script",
                                                          _file(d, "t.py", ""), "-o", str(d / "in")],
    "launch-out-manifest-names-another-file": lambda d, p: ["launch", edited(d, p, lambda doc: None), "--script",
                                                            _file(d, "t.py", ""), "-o", _manifest(d, "../t.py")],
    # exports
    "export-target-unknown": lambda d, p: ["export", edited(d, p, lambda doc: None), "--to", "jax"],
    "export-no-target": lambda d, p: ["export", edited(d, p, lambda doc: None)],
    "export-out-is-a-directory": lambda d, p: ["export", edited(d, p, lambda doc: None), "--to", "deepspeed", "-o",
                                               str(_dir(d / "in" / "xdir"))],
    "export-out-under-a-file": lambda d, p: ["export", edited(d, p, lambda doc: None), "--to", "megatron", "-o",
                                             str(Path(_file(d, "f", "")) / "x.sh")],
    "export-inexpressible-exact": lambda d, p: ["export", edited(d, p, _zero1_embed), "--to", "accelerate", "--exact",
                                                "-o", "OUT"],
    "export-precision-unsupported": lambda d, p: ["export", _searched(d, "--precision", "fp16"), "--to", "torchtitan",
                                                  "-o", "OUT"],
    "export-plan-missing": lambda d, p: ["export", str(d / "none.yaml"), "--to", "megatron"],
    # outputs
    "search-default-plan-exists": lambda d, p: [*SEARCH, *([] if _file(d, "plan.yaml", "mine\n") else [])],
    "search-out-is-a-directory": lambda d, p: SEARCH + ["-o", str(_dir(d / "in" / "adir"))],
    "search-out-is-a-device": lambda d, p: SEARCH + ["-o", os.devnull],
    "search-out-symlink-to-directory": lambda d, p: SEARCH + ["-o", _link(d / "in" / "ln", _dir(d / "in" / "t"))],
    "search-out-under-a-file": lambda d, p: SEARCH + ["-o", str(Path(_file(d, "f", "")) / "p.yaml")],
}


def _zero1_embed(doc):
    """ZeRO-1 on the first unit (no FSDP sharding strategy is ZeRO-1); figures dropped (recomputed anyway)."""
    doc["pipelines"][0]["stages"][0]["layers"][0]["zero"] = 1
    doc.pop("predicted")


def _searched(d: Path, *extra: str) -> str:
    path = d / "in" / "searched.yaml"
    assert main(SEARCH + [*extra, "-o", str(path), "--json"]) == 0
    return str(path)


def _dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _link(path: Path, target: Path) -> str:
    path.symlink_to(target)
    return str(path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2_nothing_written(case, plan_doc, tmp_path, capsys, monkeypatch):
    line = check_refused(CASES[case], plan_doc, tmp_path, capsys, monkeypatch)
    if case == "export-inexpressible-exact":  # names what is inexpressible and the closest alternative
        assert "cannot express the plan exactly (" in line and "zero" in line and "closest: pp1 tp1" in line, line
    if case == "export-precision-unsupported":
        assert "torchtitan has no fp16 training" in line, line
