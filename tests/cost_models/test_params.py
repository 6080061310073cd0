"""CostParams: a calibration's fitted fields over a run's own parameters."""

from __future__ import annotations

import pytest

from cost_models import CostParams
from cost_models.params import RELATIVE_FIELDS


def test_a_fitted_field_replaces_the_value():
    assert CostParams(eff_max=0.5).with_fitted({"eff_max": 0.7}).eff_max == 0.7


@pytest.mark.parametrize("stated", [3.0, 11.42, 0.0])
def test_fitted_traffic_scales_a_framework_s_stated_traffic(stated):
    """act_traffic is fitted as the default's (fused kernels') traffic: an eager framework's counted figure keeps
    its ratio to it, a profile's 0 (measured units hold their traffic) stays 0, the default becomes the fit."""
    assert "act_traffic" in RELATIVE_FIELDS
    got = CostParams(act_traffic=stated).with_fitted({"act_traffic": 4.5, "eff_max": 0.55})
    assert got.act_traffic == pytest.approx(stated * 4.5 / CostParams().act_traffic)
    assert got.eff_max == 0.55
