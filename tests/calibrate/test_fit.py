"""The fit: synthetic runs made from known parameters give those parameters back; fields the runs cannot
identify (no effect, or collinear) are refused by name, with the runs that would identify them."""

from __future__ import annotations

import time

import pytest

from autopar.calibrate.fit import fit, jacobian, predict, refusals
from autopar.calibrate.inputs import load_inputs
from autopar.calibrate.table import choose
from cost_models import CostParams
from tests.calibrate.synthetic import SHAPES, TRUE, write_measured


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return load_inputs([str(write_measured(tmp_path_factory.mktemp("syn") / "m.yaml"))]).runs


def test_round_trip_recovers_the_parameters(runs):
    rows = choose("eff_max,layer_overhead_s,overlap_sync")
    assert refusals(jacobian(runs, rows, CostParams()), rows) == []
    t0 = time.perf_counter()
    done = fit(runs, rows, CostParams())
    assert time.perf_counter() - t0 < 30
    for name, want in TRUE.items():
        assert done.values[name] == pytest.approx(want, rel=0.02), name
    assert done.predicted_s == pytest.approx([r.measured_s for r in runs], rel=1e-3)


def test_predict_is_estimate_plan_under_each_runs_params_with_the_fitted_fields(runs):
    from dataclasses import replace

    from autopar.estimate import estimate_plan

    assert list(predict(runs[:3], {})) == [estimate_plan(r.plan, r.model).step_time_s for r in runs[:3]]
    p = [replace(r.base, eff_max=0.45) for r in runs[:3]]
    assert list(predict(runs[:3], {"eff_max": 0.45})) == [estimate_plan(r.plan, r.model, q).step_time_s
                                                          for r, q in zip(runs[:3], p)]


def test_a_field_no_run_depends_on_is_refused(tmp_path):
    plain = [s for s in SHAPES if s[5] != 3]  # no ZeRO-3 run
    runs = load_inputs([str(write_measured(tmp_path / "m.yaml", shapes=plain))]).runs
    rows = choose("eff_max,overlap_zero3")
    bad = refusals(jacobian(runs, rows, CostParams()), rows)
    assert [e.field for e in bad] == ["overlap_zero3"]
    assert "changes no run's predicted step time" in str(bad[0]) and "runs with zero: 3" in str(bad[0])


def test_collinear_fields_are_refused_naming_the_pair(runs):
    rows = choose("eff_max,layer_overhead_s")
    bad = refusals(jacobian(runs[:1], rows, CostParams()), rows)  # one run: two fields, one equation
    assert [e.field for e in bad] == ["eff_max,layer_overhead_s"]
    assert "cannot tell them apart" in str(bad[0])


def test_memory_rows_fit_published_peaks_and_leave_times_alone(tmp_path):
    """Published peaks made with a known allocator factor and reserve: the memory rows find them again
    from the peaks alone (the times do not move), and a file without peaks cannot fit them."""
    from dataclasses import replace

    from autopar.calibrate.fit import evaluate
    from autopar.estimate import estimate_plan

    true = {"act_mem_factor": 1.6, "reserve_gib": 3.0}
    path = write_measured(tmp_path / "m.yaml")
    runs = load_inputs([str(path)]).runs
    assert all(r.measured_memory_gib is None for r in runs)
    rows = choose("act_mem_factor,reserve_gib")
    bad = refusals(jacobian(runs, rows, CostParams()), rows)
    assert [e.field for e in bad] == ["act_mem_factor", "reserve_gib"] and "peak memory" in str(bad[0])
    peaks = [estimate_plan(r.plan, r.model, replace(r.base, **true)).max_memory_gib for r in runs]
    runs = [replace(r, measured_memory_gib=g) for r, g in zip(runs, peaks)]
    assert refusals(jacobian(runs, rows, CostParams()), rows) == []
    done = fit(runs, rows, CostParams())
    for name, want in true.items():
        assert done.values[name] == pytest.approx(want, rel=0.02), name
    assert list(evaluate(runs, done.values)[1]) == pytest.approx(peaks, rel=1e-3)
    assert done.predicted_s == list(predict(runs, {}))  # memory fields do not change a step time


def test_zero3_collective_efficiency_is_recovered(tmp_path):
    """Runs made with ZeRO-3 gathers at a quarter of the modelled bandwidth (the PTD-P paper's DeepSpeed
    ZeRO-3 fitted at about that) give that efficiency back next to eff_max."""
    true = {"eff_max": 0.3, "zero3_comm_eff": 0.25}
    shapes = SHAPES + [(1, 1, 8, 1, 4, 3, "none"), (1, 2, 4, 2, 4, 3, "none")]
    runs = load_inputs([str(write_measured(tmp_path / "m.yaml", true, shapes))]).runs
    rows = choose("eff_max,zero3_comm_eff")
    assert refusals(jacobian(runs, rows, CostParams()), rows) == []
    done = fit(runs, rows, CostParams())
    assert done.values["eff_max"] == pytest.approx(0.3, rel=0.02)
    assert done.values["zero3_comm_eff"] == pytest.approx(0.25, rel=0.02)
    assert done.predicted_s == pytest.approx([r.measured_s for r in runs], rel=1e-3)


def test_collective_call_cost_is_recovered_next_to_the_layer_overhead(tmp_path):
    """Runs made with 1 ms a collective call (AMP's Megatron 1.1.5 runs fit about that, held out) give it back
    next to eff_max and the per-layer-call overhead: TP runs at small micro-batches make many calls, runs
    without TP one gradient sync per unit a step, so the two per-call costs are told apart."""
    true = {"eff_max": 0.3, "layer_overhead_s": 4e-4, "collective_call_s": 1e-3}
    runs = load_inputs([str(write_measured(tmp_path / "m.yaml", true))]).runs
    rows = choose("eff_max,layer_overhead_s,collective_call_s")
    assert refusals(jacobian(runs, rows, CostParams()), rows) == []
    done = fit(runs, rows, CostParams())
    for name, want in true.items():
        assert done.values[name] == pytest.approx(want, rel=0.02), name
    assert done.predicted_s == pytest.approx([r.measured_s for r in runs], rel=1e-3)
