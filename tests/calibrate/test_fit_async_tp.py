"""``async_tp_overlap`` is fittable: synthetic vanilla / async TP pairs made with a known overlap give it
back next to eff_max; runs without async TP cannot identify it and it is refused by name."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from autopar.calibrate.fit import fit, jacobian, refusals
from autopar.calibrate.inputs import load_inputs
from autopar.calibrate.table import choose
from autopar.estimate import estimate_plan, plan_cost_params
from autopar.measured import load_runs
from cost_models import CostParams
from tests.calibrate.synthetic import measured_doc

TRUE = {"eff_max": 0.3, "async_tp_overlap": 0.1}
# (pp, tp, dp, micro_batch_size per DP rank, micro-batches, zero, ckpt), each with sp, vanilla and async
PAIRS = [(1, 2, 4, 2, 4, 0, "none"), (1, 4, 2, 4, 4, 0, "none"), (1, 4, 2, 2, 8, 0, "full"), (2, 2, 2, 2, 8, 0, "none")]


def _write(path, async_flags: list[bool]):
    shapes = [s for s in PAIRS for _ in (0, 1)]
    doc = measured_doc(shapes, "async-pairs")
    for c, flag in zip(doc["cases"], async_flags):
        c["sequence_parallel"], c["async_tp"] = True, flag
    path.write_text(yaml.safe_dump(doc))
    times = {r.case_id: estimate_plan(r.plan, r.model, replace(plan_cost_params(r.plan), **TRUE)).step_time_s
             for r in load_runs(path).runs}
    for c in doc["cases"]:
        c["measured_s"] = times[c["id"]]
    path.write_text(yaml.safe_dump(doc))
    return load_inputs([str(path)]).runs


def test_overlap_is_recovered_from_vanilla_async_pairs(tmp_path):
    runs = _write(tmp_path / "m.yaml", [False, True] * len(PAIRS))
    assert [any(ly.strategy.async_tp for st in r.plan.stages for ly in st.layers) for r in runs] == [False, True] * 4
    rows = choose("eff_max,async_tp_overlap")
    assert refusals(jacobian(runs, rows, CostParams()), rows) == []
    done = fit(runs, rows, CostParams())
    assert done.values["eff_max"] == pytest.approx(0.3, rel=0.02)
    assert done.values["async_tp_overlap"] == pytest.approx(0.1, rel=0.02)


def test_runs_without_async_tp_cannot_fit_it(tmp_path):
    runs = _write(tmp_path / "m.yaml", [False] * (2 * len(PAIRS)))
    rows = choose("eff_max,async_tp_overlap")
    bad = refusals(jacobian(runs, rows, CostParams()), rows)
    assert [e.field for e in bad] == ["async_tp_overlap"] and "async_tp: true" in str(bad[0])
