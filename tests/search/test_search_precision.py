"""The search at a precision: every plan it makes (baselines included) is at that precision and
estimates to the number the search optimised."""

from __future__ import annotations

import pytest

from autopar.cluster.parse import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.io import plan_from_dict, plan_to_dict
from autopar.plan.precision import activation_bytes, at_precision
from autopar.search import SearchOptions, search


@pytest.mark.parametrize("cluster, precision", [("8xA100", "tf32"), ("4xA100+4xV100", "fp32"), ("8xH100", "fp8")])
def test_search_plans_and_baselines_are_at_the_precision(cluster, precision):
    model = load_model("gpt3-1.3b", 512, dtype_bytes=activation_bytes(precision))
    opts = SearchOptions()
    c, opts.params = at_precision(load_cluster(cluster), opts.params, precision)
    res = search(model, c, 16, opts)
    assert res.plan.precision == precision
    assert all(b[0].precision == precision for b in res.baselines.values() if b)
    back = plan_from_dict(plan_to_dict(res.plan))  # as estimate / validate read it
    assert back.precision == precision
    assert estimate_plan(back, model).step_time_s == pytest.approx(res.estimate.step_time_s, rel=1e-12)
    bf16 = search(load_model("gpt3-1.3b", 512), load_cluster(cluster), 16, SearchOptions(), with_baselines=False)
    assert (res.estimate.step_time_s < bf16.estimate.step_time_s) == (precision == "fp8")
