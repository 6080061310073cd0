"""Interleaved plans are not drawn yet: no picture of them is made (a report keeps its tables), and
``autopar show`` refuses one in one line rather than drawing chunks as if they were stages."""

from __future__ import annotations

import pytest

from autopar.search import SearchOptions, search
from autopar.show.command import write_report
from autopar.show.render import plan_pictures, undrawable
from tests.search.test_interleave import _cluster
from tests.search.tiny import gpt_like


@pytest.fixture(scope="module")
def interleaved():
    model = gpt_like(blocks=16)
    res = search(model, _cluster(4), 32, SearchOptions(pp_degrees=[4]))
    assert res.plan.schedule == "interleaved"
    return model, res


def test_interleaved_plans_get_no_pictures_and_a_report_without_them(interleaved, tmp_path):
    model, res = interleaved
    params = SearchOptions().params
    assert undrawable(res.plan).startswith("interleaved pipelines (virtual_stages > 1) are not drawn yet")
    assert plan_pictures(res.plan, model, res.estimate, params) == []
    page = (tmp_path / "r.html")
    write_report(str(page), res, model, params, "summary", "seconds")
    html = page.read_text()
    assert html.count("<svg") == (1 if res.baselines else 0) and "summary" in html  # the baselines chart only


def test_a_plain_plan_is_drawable(interleaved):
    model, _ = interleaved
    res = search(model, _cluster(4), 32, SearchOptions(pp_degrees=[4], virtual_stages=()))
    assert undrawable(res.plan) is None
