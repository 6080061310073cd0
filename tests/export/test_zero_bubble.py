"""zb-h1 plans exported: no target runs ZB-H1 itself, so each gets the closest 1F1B plan, the change listed."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.export import prepare
from tests.export.conftest import uniform


@pytest.mark.parametrize("target", ["torchtitan", "megatron", "deepspeed"])
def test_zb_h1_becomes_1f1b_with_the_change_named(plans, tmp_path, target):
    path = uniform(plans["small"], tmp_path / "zb.yaml", 2, 1, 0, "none", False, 4, schedule="zb-h1")
    ex = prepare(path, target)
    assert "schedule: zb-h1 -> 1f1b" in ex.changes and ex.plan.schedule == "1f1b"
    with pytest.raises(AutoparError, match="schedule: zb-h1 -> 1f1b"):
        prepare(path, target, exact=True)
