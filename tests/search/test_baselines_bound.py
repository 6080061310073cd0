"""The baselines skip the schedule simulation of a member their family's best already beats
(``estimate_plan_if_faster``): they pick the very plans, with the very figures, as estimating every member."""

import pytest

from autopar.cluster.parse import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.zoo import from_zoo
from autopar.plan.io import plan_to_dict
from autopar.search import SearchOptions
from autopar.search import baselines as bl

CASES = [("llama2-7b", 4096, "2x8xA100-80G", 64, {}), ("gpt3-1.3b", 2048, "2x8xV100", 128, {"schedule": "gpipe"})]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_bound_changes_no_baseline(case, monkeypatch):
    name, seq, cluster, B, opts = CASES[case]
    model, cl = from_zoo(name, seq), load_cluster(cluster)
    fast = bl.baselines(model, cl, B, SearchOptions(**opts))
    estimated = []

    def every(plan, model, params, cache, than):
        estimated.append(plan)
        return estimate_plan(plan, model, params, cache)

    monkeypatch.setattr(bl, "estimate_plan_if_faster", every)
    full = bl.baselines(model, cl, B, SearchOptions(**opts))
    assert fast.keys() == full.keys() and any(full.values()) and estimated
    for k in full:
        assert (fast[k] is None) == (full[k] is None), k
        if full[k] is not None:
            assert plan_to_dict(fast[k][0]) == plan_to_dict(full[k][0])
            assert fast[k][1].step_time_s == full[k][1].step_time_s and fast[k][1].mfu == full[k][1].mfu
