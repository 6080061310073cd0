"""Model sources (factories, HF configs, zoo names) and command-line flags: each refusal is one line."""

from __future__ import annotations

import json
import sys

import pytest

from autopar.cli import main
from tests.bad_input.harness import SEARCH, check_refused, edited, write

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
         "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 512}
CONFIGS = {
    "model-type-unknown": {**LLAMA, "model_type": "mamba"},
    "model-type-missing": {k: v for k, v in LLAMA.items() if k != "model_type"},
    "layers-missing": {k: v for k, v in LLAMA.items() if k != "num_hidden_layers"},
    "layers-zero": {**LLAMA, "num_hidden_layers": 0},
    "layers-negative": {**LLAMA, "num_hidden_layers": -2},
    "layers-a-word": {**LLAMA, "num_hidden_layers": "two"},
    "layers-a-float": {**LLAMA, "num_hidden_layers": 2.5},
    "hidden-zero": {**LLAMA, "hidden_size": 0},
    "heads-zero": {**LLAMA, "num_attention_heads": 0},
    "vocab-negative": {**LLAMA, "vocab_size": -1},
}
RAW_CONFIGS = {"a-list": "[1, 2]", "a-string": '"llama"', "not-json": "{model_type: llama", "empty": ""}
FACTORIES = {
    "fails-on-meta": "import torch\ndef make():\n    if torch.empty(1).device.type == 'meta':\n"
                     "        raise RuntimeError('needs real tensors')\n    return torch.nn.Linear(4, 4)\n",
    "returns-none": "def make():\n    return None\n",
    "returns-a-string": "def make():\n    return 'model'\n",
    "needs-arguments": "def make(width):\n    pass\n",
    "not-callable": "make = 42\n",
    "prints-then-raises": "def make():\n    print('loading weights from /nowhere')\n    raise OSError('no weights')\n",
    "syntax-error": "def make(:\n",
    "raises-keyboard-like": "def make():\n    raise ValueError('x' * 5000)\n",
}
SOURCES = {
    "zoo-name-newline": "gpt3-1.3b\ntouch PWNED",
    "zoo-name-shell": "$(touch PWNED)",
    "factory-empty-attr": "os:",
    "factory-empty-module": ":make",
    "factory-dotted-missing": "os.path:nothing.here",
    "config-directory-without-file": "DIR",
}
FLAGS = {
    "seq-len-zero": SEARCH[:7] + ["--seq-len", "0"],
    "batch-negative": SEARCH[:5] + ["--global-batch-size", "-3"],
    "batch-float": SEARCH[:5] + ["--global-batch-size", "2.5"],
    "memory-budget-inf": SEARCH + ["--memory-budget", "inf", "-o", "OUT"],
    "memory-budget-negative": SEARCH + ["--memory-budget", "-8", "-o", "OUT"],
    "memory-budget-word": SEARCH + ["--memory-budget", "lots", "-o", "OUT"],
    "memory-margin-one": SEARCH + ["--memory-margin", "1", "-o", "OUT"],
    "memory-margin-negative": SEARCH + ["--memory-margin", "-0.1", "-o", "OUT"],
    "memory-margin-percent": SEARCH + ["--memory-margin", "10%", "-o", "OUT"],
    "estimate-memory-margin-one": ["estimate", "a.yaml", "--memory-margin", "1"],
    "time-budget-negative": SEARCH + ["--time-budget", "-1", "-o", "OUT"],
    "time-budget-inf": SEARCH + ["--time-budget", "inf", "-o", "OUT"],
    "max-tp-zero": SEARCH + ["--max-tp", "0", "-o", "OUT"],
    "max-tp-word": SEARCH + ["--max-tp", "all", "-o", "OUT"],
    "search-missing-cluster": ["search", "--model", "gpt3-1.3b", "--global-batch-size", "8"],
    "search-missing-batch": ["search", "--model", "gpt3-1.3b", "--cluster", "8xA100"],
    "estimate-no-plan": ["estimate"],
    "validate-two-plans": ["validate", "a.yaml", "b.yaml"],
    "validate-unknown-flag": ["validate", "a.yaml", "--deep"],
    "launch-scheduler-no-value": ["launch", "a.yaml", "--script", "t.py", "--scheduler"],
    "profile-seq-len-zero": ["profile", "--seq-len", "0", "-o", "OUT"],
    "profile-nproc-word": ["profile", "--nproc", "two", "-o", "OUT"],
    "list-nothing": ["list"],
    "help-typo": ["serach"],
    "cluster-inline-zero": SEARCH[:3] + ["--cluster", "0xA100", *SEARCH[5:], "-o", "OUT"],
    "cluster-inline-garbage": SEARCH[:3] + ["--cluster", "8x", *SEARCH[5:], "-o", "OUT"],
    "cluster-inline-plus-empty": SEARCH[:3] + ["--cluster", "8xA100+", *SEARCH[5:], "-o", "OUT"],
}


def _factory(d, kind: str) -> str:
    name = f"srcfactory_{kind.replace('-', '_')}_{abs(hash(str(d))) % 10**8}"
    write(d, f"{name}.py", FACTORIES[kind])
    return f"{name}:make"


def _search(model: str) -> list[str]:
    return ["search", "--model", model, *SEARCH[3:], "-o", "OUT"]


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_bad_hf_config_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: _search(write(d, "config.json", json.dumps(CONFIGS[case]))), docs, tmp_path, capsys,
                  monkeypatch)


@pytest.mark.parametrize("case", sorted(RAW_CONFIGS))
def test_unreadable_hf_config_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: _search(write(d, "config.json", RAW_CONFIGS[case])), docs, tmp_path, capsys,
                  monkeypatch)


@pytest.mark.parametrize("case", sorted(FACTORIES))
def test_bad_factory_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: _search(_factory(d, case)), docs, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", sorted(SOURCES))
def test_bad_model_source_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    def build(d, s):
        src = SOURCES[case]
        if src == "DIR":
            (d / "in" / "m").mkdir()
            src = str(d / "in" / "m")
        return _search(src)
    check_refused(build, docs, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", sorted(FLAGS))
def test_bad_flags_are_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(lambda d, s: FLAGS[case], docs, tmp_path, capsys, monkeypatch)


LAUNCH = {
    "script-a-directory": lambda d, s: ["launch", edited(d, s.plan, lambda doc: None), "--script", str(d / "in"),
                                        "-o", "OUT"],
    "plan-a-directory": lambda d, s: ["launch", str(d / "in"), "--script", write(d, "t.py", ""), "-o", "OUT"],
    "forced-tampered-cost": lambda d, s: ["launch", edited(d, s.plan, lambda doc: doc["search"]["cost_params"].update(
        reserve_gib=-1)), "--script", write(d, "t.py", ""), "-o", "OUT", "--force"],
    "forced-cost-differs": lambda d, s: ["launch", edited(d, s.plan, lambda doc: doc["search"]["cost_params"].update(
        state_bytes=2)), "--script", write(d, "t.py", ""), "-o", "OUT", "--force"],
}


@pytest.mark.parametrize("case", sorted(LAUNCH))
def test_bad_launch_input_is_refused(case, docs, tmp_path, capsys, monkeypatch):
    check_refused(LAUNCH[case], docs, tmp_path, capsys, monkeypatch)


def test_a_factory_that_fails_on_meta_is_called_once(tmp_path, capsys, monkeypatch):
    (tmp_path / "countfactory_once.py").write_text(
        "calls = []\ndef make():\n    calls.append(1)\n    raise RuntimeError('not on meta')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(_search("countfactory_once:make")[:-2] + ["-o", str(tmp_path / "p.yaml")]) == 2
    assert "meta device" in capsys.readouterr().err
    assert sys.modules["countfactory_once"].calls == [1]
