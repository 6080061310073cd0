"""Forward selection of the fitted fields: PRESS is leave-one-out for a linear model, and on runs whose times
one or two fields explain, selection keeps those fields and no others."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from autopar.calibrate.inputs import load_inputs
from autopar.calibrate.score import fit_identifiable, identifiable
from autopar.calibrate.select import press, select_rows
from autopar.calibrate.table import FITTABLE, choose
from autopar.cli import main
from cost_models import CostParams
from tests.calibrate.synthetic import write_measured


def test_press_is_the_leave_one_out_error_of_a_linear_fit():
    rng = np.random.default_rng(0)
    cols = rng.normal(size=(9, 2))
    r0 = rng.normal(size=9)
    value, step = press(r0, cols)
    assert np.allclose(step, np.linalg.lstsq(cols, -r0, rcond=None)[0])
    by_hand = 0.0
    for i in range(9):
        keep = [j for j in range(9) if j != i]
        du = np.linalg.lstsq(cols[keep], -r0[keep], rcond=None)[0]
        by_hand += float(r0[i] + cols[i] @ du) ** 2
    assert value == pytest.approx(by_hand, rel=1e-9)


def test_press_refuses_a_run_the_fit_determines_alone():
    cols = np.array([[1.0], [0.0], [0.0]])  # only run 0 moves with the field: h_00 = 1
    assert press(np.array([0.5, 0.1, -0.1]), cols)[0] == float("inf")


def _noisy(tmp_path, true: dict, name: str):
    path = write_measured(tmp_path / f"{name}.yaml", true=true, name=name)
    runs = load_inputs([str(path)]).runs
    wobble = [1.0 + 0.02 * ((-1) ** i) * (1 + i % 3) / 3 for i in range(len(runs))]  # +-2%: timing noise
    return [r.__class__(**{**r.__dict__, "measured_s": r.measured_s * w}) for r, w in zip(runs, wobble)]


def test_selection_keeps_the_field_that_explains_the_runs_and_no_other(tmp_path):
    runs = _noisy(tmp_path, {"eff_max": 0.25}, "one")
    rows, _ = identifiable(runs, list(FITTABLE), CostParams())
    assert len(rows) >= 3  # many fields are identifiable: each alone could absorb some of the noise
    sel = select_rows(runs, rows, CostParams())
    assert [r.name for r in sel.rows] == ["eff_max"]
    assert sel.values["eff_max"] == pytest.approx(0.25, rel=0.03)
    assert sel.press[1] < 0.05 * sel.press[0] and "less than" in sel.stopped


def test_selection_adds_a_second_field_the_runs_need(tmp_path):
    runs = _noisy(tmp_path, {"eff_max": 0.3, "layer_overhead_s": 2e-3}, "two")
    fitted, notes = fit_identifiable(runs, choose("eff_max,layer_overhead_s,overlap_sync,slot_overhead_s"),
                                     CostParams(), auto=True)
    assert set(fitted) == {"eff_max", "layer_overhead_s"}
    assert fitted["layer_overhead_s"] == pytest.approx(2e-3, rel=0.1)
    assert notes[-1].startswith("selected ")


def test_calibrate_fit_auto_writes_the_selected_fields(tmp_path, capsys):
    path = write_measured(tmp_path / "m.yaml", true={"eff_max": 0.3, "layer_overhead_s": 2e-3})
    out = tmp_path / "c.yaml"
    assert main(["calibrate", str(path), "--fit", "auto", "-o", str(out), "--json"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert set(doc["fitted"]) == {"eff_max", "layer_overhead_s"} == set(doc["selection"]["chosen"])
    assert doc["selection"]["press"][-1] < doc["selection"]["press"][0]
    assert doc["figures"]["cv"]["mape"] < 0.02  # every fold selected and fitted on its own runs
