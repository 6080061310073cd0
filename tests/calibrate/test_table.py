"""The fittable-field table: every row a scalar CostParams field with sane bounds; --fit parsing."""

from __future__ import annotations

import math

import pytest

from autopar.calibrate.table import BY_NAME, DEFAULT_FIT, FITTABLE, choose, scalar_fields, start_u, values
from autopar.errors import AutoparError
from cost_models import CostParams


@pytest.mark.parametrize("row", FITTABLE, ids=lambda r: r.name)
def test_every_row_is_a_scalar_cost_parameter_with_bounds(row):
    assert row.name in scalar_fields()
    assert row.low < row.high and (row.low > 0 or not row.log)
    assert row.identified_by
    lo, hi = row.bounds_u
    for v in (row.low, (row.low + row.high) / 2, row.high):
        assert math.isclose(row.from_u(row.to_u(v)), v, rel_tol=1e-12)
    assert lo <= row.to_u(-1.0 if not row.log else 1e-30) <= hi  # clipped into the bounds


def test_default_fit_and_choice():
    assert [r.name for r in choose(None)] == list(DEFAULT_FIT)
    assert [r.name for r in choose("overlap_sync, eff_max")] == ["overlap_sync", "eff_max"]
    rows = choose("eff_max,overlap_zero3")
    u = start_u(rows, CostParams())
    assert values(rows, u) == pytest.approx({"eff_max": 0.6, "overlap_zero3": BY_NAME["overlap_zero3"].start})


@pytest.mark.parametrize("spec, problem", [("turbo", "not a fittable"), ("eff_max,eff_max", "twice"),
                                            ("param_bytes", "not a fittable")])
def test_bad_fit_names_are_refused(spec, problem):
    with pytest.raises(AutoparError, match=problem) as e:
        choose(spec)
    assert e.value.field == "--fit"
