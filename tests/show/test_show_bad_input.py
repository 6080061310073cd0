"""``autopar show`` and ``search --report`` refuse bad input with the bad-input contract
(tests/bad_input/harness.py: exit 2, one stderr line, nothing written)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.bad_input.harness import SEARCH, check_refused, edited, setter, write


def _dir(path: Path) -> str:
    path.mkdir(parents=True)
    return str(path)


CASES = {
    "unknown-extension": lambda d, p: ["show", edited(d, p, lambda doc: None), "-o", "OUT.pdf"],
    "no-extension": lambda d, p: ["show", edited(d, p, lambda doc: None), "-o", "OUT"],
    "out-is-a-directory": lambda d, p: ["show", edited(d, p, lambda doc: None), "-o", _dir(d / "in" / "a.png")],
    "out-under-a-file": lambda d, p: ["show", edited(d, p, lambda doc: None), "-o", write(d, "f", "") + "/p.png"],
    "not-a-plan": lambda d, p: ["show", write(d, "p.yaml", "- 1\n- 2\n"), "-o", "OUT.png"],
    "plan-missing": lambda d, p: ["show", str(d / "none.yaml"), "-o", "OUT.png"],
    "tp-over-stage": lambda d, p: ["show", edited(d, p, setter("pipelines.0.stages.0.layers.0.tp", 16)), "-o", "OUT.png"],
    "tampered-figures": lambda d, p: ["show", edited(d, p, setter("predicted.step_time_s", 0.001)), "-o", "OUT.svg"],
    "report-not-html": lambda d, p: SEARCH + ["-o", "OUT", "--report", "OUT.png"],
    "report-is-a-directory": lambda d, p: SEARCH + ["-o", "OUT", "--report", _dir(d / "in" / "r.html")],
    "report-under-a-file": lambda d, p: SEARCH + ["-o", "OUT", "--report", write(d, "f", "") + "/r.html"],
}


@pytest.fixture(scope="module")
def plan_doc(homogeneous) -> dict:
    return yaml.safe_load(Path(homogeneous.path).read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_show_bad_input_is_one_line_exit_2(case, plan_doc, tmp_path, capsys, monkeypatch):
    check_refused(CASES[case], plan_doc, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("argv", [["show", "PLAN", "-o", "OUT.png"], SEARCH + ["-o", "OUT", "--report", "OUT.html"]])
def test_without_matplotlib_one_line_names_the_extra(argv, plan_doc, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it gives: ImportError

    def build(d, p):
        return [a.replace("PLAN", edited(d, p, lambda doc: None)) for a in argv]
    line = check_refused(build, plan_doc, tmp_path, capsys, monkeypatch)
    assert "needs matplotlib" in line and "pip install 'autopar[show]'" in line
