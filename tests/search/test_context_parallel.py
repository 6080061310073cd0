"""Context parallel in the search (autopar/search/context_parallel.py): which degrees are tried, one
search per degree, the fastest plan kept with every degree's outcome recorded."""

from __future__ import annotations

import pytest

from autopar.cluster.parse import load_cluster
from autopar.errors import NoFitError
from autopar.modelspec.zoo import from_zoo
from autopar.plan.validate import validate_plan
from autopar.search import SearchOptions, search
from autopar.search.context_parallel import cp_degrees


def test_degrees_tried():
    assert cp_degrees(4096, 16) == (1,)  # short sequences: the search is unchanged
    assert cp_degrees(16384, 16) == (1, 2)  # at least 8192 tokens per rank
    assert cp_degrees(65536, 4) == (1, 2, 4)  # no more than the devices
    assert cp_degrees(131072, 16384) == (1, 2, 4, 8, 16)


def test_long_sequence_search_picks_among_degrees_and_records_them():
    model = from_zoo("llama3-8b", 65536)
    res = search(model, load_cluster("2x8xH100"), 16, SearchOptions(), with_baselines=False)
    tried = res.plan.search["cp"]
    assert set(tried) == {"1", "2", "4", "8"}
    chosen = {ly.strategy.cp for st in res.plan.stages for ly in st.layers}
    assert len(chosen) == 1  # one cp per pipeline
    (c,) = chosen
    assert tried[str(c)] == round(res.estimate.step_time_s, 6)
    assert all(isinstance(v, str) or v >= tried[str(c)] for v in tried.values())
    assert c > 1  # 64K tokens: splitting the sequence wins on this cluster under the cost model
    validate_plan(res.plan, model, res.estimate.memory_gib)
    assert all(f"cp{c}" in ly.strategy.short() for st in res.plan.stages for ly in st.layers)


def test_short_sequence_search_records_no_cp():
    res = search(from_zoo("gpt-tiny", 32), load_cluster("4xcpu"), 8, SearchOptions(), with_baselines=False)
    assert "cp" not in res.plan.search
    assert {ly.strategy.cp for st in res.plan.stages for ly in st.layers} == {1}


def test_when_no_degree_fits_the_refusal_names_the_closest_degree():
    model, cluster = from_zoo("llama3-8b", seq_len=1048576), load_cluster("2x8xH100")
    needs = {}
    for c in (1, 16):
        with pytest.raises(NoFitError) as e:
            search(model, cluster, 4, SearchOptions(cp_degrees=(c,)), with_baselines=False)
        needs[c] = e.value.need_gib
    assert needs[16] < needs[1]  # a 64K-token shard per rank needs less than the whole sequence
    with pytest.raises(NoFitError) as e:
        search(model, cluster, 4, SearchOptions(), with_baselines=False)  # the default degrees, none fits
    assert e.value.need_gib == min(needs.values()) and "the closest, cp=16," in str(e.value)
