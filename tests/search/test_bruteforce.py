"""The search against brute force over every per-layer assignment, every partition and every
(pp, micro-batch) setting: exact under the closed form the partition DP minimises, within a few percent
of the simulated schedule that prices plans (the DP's best partitions are re-priced by simulation), and
the plan's estimate is the number the search optimised.

Each stage's assignment is the least per-micro-batch cost ``c = w + s / m`` that fits (what the
pipeline formula asks of its bottleneck stage, and of every stage when they are equal); the
brute force also scores every joint assignment of all stages, and the search stays within 1% of it."""

import itertools

import numpy as np
import pytest

from autopar.estimate import (
    StageContext,
    device_budget_bytes,
    estimate_plan,
    layer_costs,
    layout_switch_time,
    stage_link,
    transient_bound,
)
from autopar.modelspec.spec import CKPT_MODES
from autopar.plan.schema import Strategy
from autopar.search import SearchOptions, search
from cost_models import CostParams
from cost_models import communication as comm
from cost_models.memory import inflight_microbatches
from cost_models.pipeline import pipeline_time, simulated_pipeline_time
from tests.search.tiny import gpt_like, small_cluster

PARAMS = CostParams(reserve_gib=0.0)


def raw_strategies(layer, ctx):
    """Every legal strategy, with no equivalence or dominance pruning."""
    out = []
    for tp in (1, 2, 4):
        if ctx.n % tp or tp > 2 or not layer.tp_ok(tp) or ctx.micro_batch_size % (ctx.n // tp):
            continue  # 2 GPUs per node: TP stays inside a node
        for zero, ckpt in itertools.product(range(4), CKPT_MODES):
            if ckpt == "op" and layer.op is None:
                continue  # op is legal only where the model spec models it (blocks)
            for sp in ((False, True) if tp > 1 else (False,)):
                out.append(Strategy(tp, zero, ckpt, sp))
    return out


def stage_points(layers, ctx, inflight, budget, params=PARAMS, with_fwd=False):
    """(c, s) of every assignment of strategies that fits (numpy broadcasting, flattened); ``with_fwd``:
    (c, s, forward) (a layout switch counts half to forward)."""
    per = [raw_strategies(ly, ctx) for ly in layers]
    if any(not s for s in per):
        return (np.zeros(0),) * (3 if with_fwd else 2)
    total_c, total_s, total_m, total_f = 0.0, 0.0, 0.0, 0.0
    for j, (ly, strats) in enumerate(zip(layers, per)):
        lc = layer_costs(ly, strats, ctx)
        shape = [1] * len(layers)
        shape[j] = len(strats)
        total_c = total_c + lc.cost.reshape(shape)
        total_s = total_s + lc.step.reshape(shape)
        total_m = total_m + lc.mem(inflight).reshape(shape)
        total_f = total_f + lc.fwd.reshape(shape)
        if j:
            sw = np.array([[layout_switch_time(layers[j - 1].boundary_bytes, (a.tp, a.sp), (b.tp, b.sp), ctx)
                            for b in strats] for a in per[j - 1]])
            shp = [1] * len(layers)
            shp[j - 1], shp[j] = sw.shape
            total_c = total_c + sw.reshape(shp)
            total_f = total_f + sw.reshape(shp) / 2
    room = budget - params.reserve_bytes - max(transient_bound(ly, ctx, raw_strategies(ly, ctx)) for ly in layers)
    total_c, total_s, total_m, total_f = np.broadcast_arrays(total_c, total_s, total_m, total_f)
    ok = total_m <= room
    if with_fwd:
        return total_c[ok].ravel(), total_s[ok].ravel(), total_f[ok].ravel()
    return total_c[ok].ravel(), total_s[ok].ravel()


def joint_best(points, P, m, slots):
    """Least T over every joint choice of the stages' points: given the bottleneck bound tau on
    (m - 1) w + s, each stage takes its least w under it."""
    fronts = []
    for c, s in points:  # per stage, the least w at each bound on g (a running minimum in g order)
        w = c - s / m
        g = (m - 1) * w + s
        order = np.argsort(g, kind="stable")
        fronts.append((g[order], np.minimum.accumulate(w[order])))
    best = np.inf
    for tau in np.unique(np.concatenate([g for g, _ in fronts])):
        idx = [np.searchsorted(g, tau, side="right") - 1 for g, _ in fronts]
        if min(idx) >= 0:
            best = min(best, sum(float(w[i]) for (_, w), i in zip(fronts, idx)) + sum(P) + float(tau) + slots)
    return best


def brute_force(model, cluster, B, budget_gib, params=PARAMS, with_joint=False):
    """Least simulated T (the schedule table, what plans are priced by) with each stage's least-c
    assignment; ``with_joint``: (that, the least closed-form T with those assignments, the least closed
    form over joint assignments)."""
    N, L = cluster.num_devices, model.num_layers
    best = joint = sim = np.inf
    for p in (1, 2, 4):
        if p > L:
            continue
        n = N // p
        for m in [d for d in range(1, B + 1) if B % d == 0]:
            mbs = B // m
            for cuts in itertools.combinations(range(1, L), p - 1):
                bounds = [0, *cuts, L]
                pts, P = [], []
                for i in range(p):
                    devs = list(range(i * n, (i + 1) * n))
                    ctx = StageContext(cluster, tuple(devs), mbs, m, params)
                    budget = device_budget_bytes(cluster, 0, budget_gib)
                    k = inflight_microbatches("1f1b", p, i, m)
                    pts.append(stage_points(model.layers[bounds[i]:bounds[i + 1]], ctx, k, budget, params, True))
                    if i + 1 < p:
                        bw, lat = stage_link(cluster, devs, list(range((i + 1) * n, (i + 2) * n)))
                        P.append(2 * float(comm.p2p_time(model.layers[bounds[i + 1] - 1].boundary_bytes * mbs, bw, lat)))
                    else:
                        P.append(0.0)
                if all(len(c) for c, _, _ in pts):
                    slots = params.slot_overhead_s * (m + p - 1)
                    picks = [(c, s) for c, s, _ in pts]
                    cs = [(float(c[np.argmin(c)]), float(s[np.argmin(c)]), float(f[np.argmin(c)])) for c, s, f in pts]
                    best = min(best, pipeline_time([c for c, _, _ in cs], P, m, params.slot_overhead_s,
                                                     steps=[s for _, s, _ in cs]))
                    sim = min(sim, simulated_pipeline_time("1f1b", m, [c for c, _, _ in cs], [f for _, _, f in cs],
                                                           [s for _, s, _ in cs], [x / 2 for x in P],
                                                           params.slot_overhead_s))
                    joint = min(joint, joint_best(picks, P, m, slots))
    return (sim, best, joint) if with_joint else sim


@pytest.mark.parametrize("budget_gib,inter_gbps", [(None, 5.0), (0.3, 5.0), (0.12, 5.0), (0.08, 5.0), (0.05, 5.0),
                                                  (None, 0.05), (0.08, 0.05)])
def test_search_matches_brute_force(budget_gib, inter_gbps):
    model, cluster, B = gpt_like(blocks=2), small_cluster(inter_gbps=inter_gbps), 8
    expected, closed, joint = brute_force(model, cluster, B, budget_gib, with_joint=True)
    opts = SearchOptions(memory_budget_gib=budget_gib, params=PARAMS, zero_bubble=False,
                         virtual_stages=())  # over 1F1B plans, as the brute force
    if not np.isfinite(expected):
        with pytest.raises(Exception, match="no plan fits"):
            search(model, cluster, B, opts, with_baselines=False)
        return
    res = search(model, cluster, B, opts, with_baselines=False)
    # The partition DP minimises the closed form; its best partitions are re-priced by simulation, within 3.5%
    # of the simulated brute force on these cases. The brute force takes each stage's least-cost strategies,
    # the simulated optimum only up to how a cost splits into forward and backward (zero_overlap moves time
    # between them at equal cost), so the search may undercut it a little: by 1% at most here.
    assert expected * 0.99 <= res.estimate.step_time_s <= expected * 1.035
    assert joint <= closed * (1 + 1e-12) and closed <= joint * 1.01
    again = estimate_plan(res.plan, model, PARAMS)
    assert again.step_time_s == res.estimate.step_time_s
    assert again.fits


def test_search_matches_brute_force_with_a_slot_overhead():
    """A fixed cost per pipeline slot (m + p - 1 of them) moves the optimum to fewer micro-batches and
    stages; the search still finds the brute-force optimum (within the window of ``test_search_matches_brute_force``:
    the DP minimises the closed form, the plan is priced by simulation), and the plan's estimate is that number."""
    model, cluster, B = gpt_like(blocks=2), small_cluster(inter_gbps=0.05), 8
    plain = search(model, cluster, B, SearchOptions(params=PARAMS, zero_bubble=False), with_baselines=False)
    params = CostParams(reserve_gib=0.0, slot_overhead_s=plain.estimate.step_time_s)
    res = search(model, cluster, B, SearchOptions(params=params, zero_bubble=False), with_baselines=False)
    expected = brute_force(model, cluster, B, None, params)
    assert expected * 0.99 <= res.estimate.step_time_s <= expected * 1.035
    assert estimate_plan(res.plan, model, params).step_time_s == res.estimate.step_time_s
    slots = lambda r: r.plan.pipelines[0].num_microbatches + len(r.plan.stages) - 1  # noqa: E731
    assert slots(res) < slots(plain)


def test_search_matches_brute_force_with_a_collective_call_cost():
    """A fixed cost per collective call (a framework that waits around each) makes TP's per-micro-batch
    all-reduces dearer than one gradient sync a step; the search still finds the brute-force optimum and uses
    less TP than without it, and the plan's estimate is that number."""
    model, cluster, B = gpt_like(blocks=2), small_cluster(inter_gbps=0.05), 8  # a slow network: TP 2 inside nodes
    plain = search(model, cluster, B, SearchOptions(params=PARAMS, zero_bubble=False), with_baselines=False)
    params = CostParams(reserve_gib=0.0, collective_call_s=plain.estimate.step_time_s / 100)
    res = search(model, cluster, B, SearchOptions(params=params, zero_bubble=False), with_baselines=False)
    expected = brute_force(model, cluster, B, None, params)
    assert expected * 0.99 <= res.estimate.step_time_s <= expected * 1.035
    assert estimate_plan(res.plan, model, params).step_time_s == res.estimate.step_time_s
    tp = lambda r: [ly.strategy.tp for st in r.plan.stages for ly in st.layers]  # noqa: E731
    assert set(tp(plain)) == {2} and set(tp(res)) == {1}


def test_tight_memory_forces_memory_saving_strategies():
    model, cluster, B = gpt_like(blocks=2), small_cluster(), 8
    loose = search(model, cluster, B, SearchOptions(params=PARAMS), with_baselines=False)
    tight = search(model, cluster, B, SearchOptions(memory_budget_gib=0.08, params=PARAMS), with_baselines=False)
    assert tight.estimate.step_time_s > loose.estimate.step_time_s
    assert tight.estimate.max_memory_gib <= 0.08
    used = {(ly.strategy.zero, ly.strategy.ckpt) for st in tight.plan.stages for ly in st.layers}
    assert any(z > 0 or c != "none" for z, c in used)


def test_slow_network_makes_pipelining_win():
    model, B = gpt_like(blocks=2), 8
    fast = search(model, small_cluster(inter_gbps=50.0), B, SearchOptions(params=PARAMS), with_baselines=False)
    slow = search(model, small_cluster(inter_gbps=0.05), B, SearchOptions(params=PARAMS), with_baselines=False)
    assert len(fast.plan.stages) == 1
    assert len(slow.plan.stages) > 1
