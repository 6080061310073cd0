"""Layer splits: thinned tables never promise more than exact ones, and every device stays inside its
own GPU's memory (small-memory stages get fewer layers)."""

import numpy as np
import pytest

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.estimate import estimate_plan
from autopar.plan.schema import ModelRef, Pipeline, Plan
from autopar.plan.validate import validate_plan
from autopar.search import search
from autopar.search.hetero.layer_split import LayerSplitter, role
from tests.search.hetero.hetlib import mixed, model, opts

STAGES = [(2, 3), (0,), (1,)]


@pytest.mark.parametrize("mbs,m", [(1, 4), (2, 2), (4, 1)])
def test_thin_tables_are_never_optimistic(mbs, m):
    c, mdl, o = mixed(), model(blocks=3), opts()
    thin, exact = LayerSplitter(mdl, c, o, buckets=4), LayerSplitter(mdl, c, o, buckets=None)
    for i, st in enumerate(STAGES):
        a = thin.table(st, mbs, m, len(STAGES) - i, role(i, len(STAGES))).C
        b = exact.table(st, mbs, m, len(STAGES) - i, role(i, len(STAGES))).C
        assert np.all(np.isinf(b) <= np.isinf(a)), "a range the thin table fits, the exact one fits too"
        fin = np.isfinite(a)
        assert np.all(a[fin] >= b[fin] * (1 - 1e-12))
    ts, es = thin.split(STAGES, mbs, m), exact.split(STAGES, mbs, m)
    assert es is not None and ts is not None
    assert ts.time >= es.time * (1 - 1e-12)


def test_split_time_equals_the_estimate():
    c, mdl, o = mixed(), model(blocks=3), opts()
    sp = LayerSplitter(mdl, c, o)
    r = sp.split(STAGES, 2, 4)
    plan = Plan(ModelRef(mdl.name, mdl.seq_len, mdl.num_layers), c, 8, [Pipeline(8, 2, 4, r.plan_stages())])
    assert estimate_plan(plan, mdl, o.params).step_time_s == pytest.approx(r.time, rel=1e-9)


SMALL = GPUType("small", memory_gib=0.3, tflops=100.0, hbm_gbps=800.0, nvlink_gbps=100.0)
BIG = GPUType("big", memory_gib=2.0, tflops=100.0, hbm_gbps=800.0, nvlink_gbps=100.0)


def test_each_device_within_its_own_gpu_memory():
    # equal speed, very different memory: the memory decides the split
    c = Cluster([Node(SMALL, 2, name="s"), Node(BIG, 2, name="b")], inter_bw_gbps=20.0, inter_lat_us=10.0,
                name="2xsmall+2xbig")
    mdl = model(blocks=6, h=1024, s=512)
    res = search(mdl, c, 8, opts(), with_baselines=False)
    est = estimate_plan(res.plan, mdl, opts().params)
    validate_plan(res.plan, mdl, est.memory_gib)
    for d, gib in est.memory_gib.items():
        assert gib <= c.gpu_of(d).memory_gib + 1e-9
    # the big GPUs use more than a small GPU could hold: budgets are per GPU type, not the minimum
    assert max(est.memory_gib[d] for d in (2, 3)) > SMALL.memory_gib
    layers_on = {t: sum(len(st.layers) for st in res.plan.stages if c.gpu_of(st.devices[0]).name == t)
                 for t in ("small", "big")}
    assert layers_on["big"] > layers_on["small"]


def test_user_cap_applies_to_every_type():
    c = Cluster([Node(SMALL, 2, name="s"), Node(BIG, 2, name="b")], inter_bw_gbps=20.0, name="x")
    mdl = model(blocks=6, h=1024, s=512)
    res = search(mdl, c, 8, opts(budget=0.3), with_baselines=False)
    assert res.estimate.max_memory_gib <= 0.3 + 1e-9
    assert res.estimate.budget_gib == {d: pytest.approx(0.3) for d in range(4)}
