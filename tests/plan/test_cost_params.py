"""The stored ``cost_params`` reader: byte counts that cannot hold together are refused, naming the field."""

from __future__ import annotations

import json

import pytest

from autopar.errors import AutoparError
from autopar.plan.cost_params import read_cost_params
from cost_models import CostParams


def _stored() -> dict:
    return json.loads(json.dumps(CostParams().to_dict()))  # as a plan file holds it (lists)


def test_state_bytes_below_parameter_and_gradient_bytes_is_refused():
    with pytest.raises(AutoparError, match=r"search.cost_params.state_bytes.*below param_bytes 2 \+ grad_bytes 4"):
        read_cost_params({**_stored(), "state_bytes": 5}, "search.cost_params", "search again")


def test_state_bytes_equal_to_parameter_and_gradient_bytes_is_read():  # no optimizer state: plain SGD
    assert read_cost_params({**_stored(), "state_bytes": 6}, "search.cost_params", "x")["state_bytes"] == 6


def test_a_partial_mapping_is_checked_only_when_it_states_all_three():
    assert read_cost_params({"state_bytes": 3}, "calibration.cost_params", "x", partial=True) == {"state_bytes": 3}
    with pytest.raises(AutoparError, match="state_bytes"):
        read_cost_params({"state_bytes": 3, "param_bytes": 2, "grad_bytes": 2}, "profile.cost_params", "x",
                         partial=True)


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_linear_input_share_outside_0_1_is_refused(share):
    with pytest.raises(AutoparError, match="search.cost_params.linear_input_share"):
        read_cost_params({**_stored(), "linear_input_share": share}, "search.cost_params", "search again")


def test_a_plan_written_before_linear_input_share_reads_at_its_default():
    stored = {k: v for k, v in _stored().items() if k != "linear_input_share"}
    assert "linear_input_share" not in read_cost_params(stored, "search.cost_params", "x")
    assert CostParams(**read_cost_params(stored, "search.cost_params", "x")).linear_input_share == 1.0


@pytest.mark.parametrize("field", ["tp_boundary_gather", "tp_async_backward"])
def test_tp_schedule_fields_are_fractions(field):
    with pytest.raises(AutoparError, match=f"search.cost_params.{field}"):
        read_cost_params({**_stored(), field: 1.5}, "search.cost_params", "search again")
    assert read_cost_params({**_stored(), field: 0}, "search.cost_params", "x")[field] == 0
