"""Scores and cross-validation: hand-checked figures; every run is predicted by a fit that never saw it."""

from __future__ import annotations

import pytest

from autopar.calibrate.fit import predict
from autopar.calibrate.inputs import load_inputs
from autopar.calibrate.score import LOO_MAX, cross_validate, fit_identifiable, folds, scores
from autopar.calibrate.table import choose
from cost_models import CostParams
from tests.calibrate.synthetic import write_measured


def test_scores_by_hand():
    s = scores(["a", "a", "a", "b", "b"], [1.0, 2.0, 3.0, 2.0, 1.0], [1.0, 2.0, 4.0, 1.0, 2.0])
    assert s["mape"] == pytest.approx((0 + 0 + 0.25 + 1 + 0.5) / 5)
    assert s["spearman"] == pytest.approx(1.0) and s["spearman_groups"] == 1  # b has 2 runs: no rank figure
    assert s["regret"] == pytest.approx((1.0 + 2.0) / 2) and s["regret_groups"] == 2


def test_folds_are_leave_one_out_up_to_eight_runs_then_k_fold():
    assert folds(LOO_MAX, 5) == [[i] for i in range(LOO_MAX)]
    ten = folds(10, 5)
    assert len(ten) == 5 and sorted(i for f in ten for i in f) == list(range(10))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return load_inputs([str(write_measured(tmp_path_factory.mktemp("syn") / "m.yaml",
                                           true={"eff_max": 0.25, "layer_overhead_s": 2e-4}))]).runs


def test_cross_validation_never_scores_a_fitted_run(runs):
    rows = choose("eff_max,layer_overhead_s")
    some = runs[:6]
    cv = cross_validate(some, rows, CostParams())
    assert [f["held_out"] for f in cv.folds] == [[r.case_id] for r in some]
    # Held-out prediction i is what a fit on the other runs alone predicts ...
    fitted, _ = fit_identifiable(some[1:], rows, CostParams())
    assert set(fitted) == {"eff_max", "layer_overhead_s"}
    assert cv.predicted_s[0] == pytest.approx(float(predict(some[:1], fitted)[0]), rel=1e-12)
    # ... so a held-out run's own measurement cannot move it.
    wild = [some[0].__class__(**{**some[0].__dict__, "measured_s": some[0].measured_s * 10})] + some[1:]
    assert cross_validate(wild, rows, CostParams()).predicted_s[0] == pytest.approx(cv.predicted_s[0], rel=1e-12)


def test_a_fold_that_cannot_identify_a_field_leaves_it_unfitted_and_says_so(runs):
    zero3 = [r for r in runs if r.plan.pipelines[0].stages[0].layers[1].strategy.zero == 3]
    plain = [r for r in runs if r not in zero3][:3]
    cv = cross_validate(plain + zero3[:1], choose("eff_max,overlap_zero3"), CostParams())
    assert any("overlap_zero3" in n and n.startswith(f"fold {len(plain) + 1}:") for n in cv.notes)
    assert set(cv.folds[-1]["fitted"]) == {"eff_max"} and set(cv.folds[0]["fitted"]) == {"eff_max", "overlap_zero3"}
