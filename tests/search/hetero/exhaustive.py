"""Exhaustive enumeration of asymmetric plans on tiny clusters (the reference the planner is checked against).

Every grouping of the devices into pipelines, every split of a pipeline's devices into ordered stages,
every share vector and micro-batch size, and every layer split of every pipeline (jointly, so the
cross-pipeline sync is scored for each combination). Per stage the strategies are the exact optimum
of the frontier DP for that stage, range and batching (proved exact by tests/search/test_bruteforce.py).
Each combination is scored by ``estimate_plan``.
"""

import itertools

import numpy as np

from autopar.estimate import CostCache, estimate_plan
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer
from autopar.search.hetero.layer_split import LayerSplitter, role
from cost_models.memory import inflight_microbatches


def set_partitions(items):
    """All partitions of ``items`` into non-empty blocks (blocks in order of their first item)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]


def ordered_partitions(items):
    """All ordered sequences of non-empty blocks covering ``items`` (stages of a pipeline)."""
    for part in set_partitions(list(items)):
        for perm in itertools.permutations(part):
            yield [tuple(sorted(b)) for b in perm]


def compositions(total, parts):
    """Positive integer vectors of length ``parts`` summing to ``total``."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        b = (0, *cuts, total)
        yield [b[i + 1] - b[i] for i in range(parts)]


def stage_layers(splitter, model, devices, a, b, mbs, m, k, role_):
    """Exact best strategies for layers a..b-1 on this stage, or None if they do not fit."""
    tab = splitter.table(devices, mbs, m, k, role_)
    if not np.isfinite(tab.C[a, b]):
        return None
    node = tab.node_of[(a, b)]
    _, point = tab.trie.best(node, tab.room - max(tab.transient[a:b]))
    picks = tab.trie.trace(node, point)
    return [StageLayer(model.layers[j].name, tab.cands[splitter.sigs[j]].strategies[picks[j - a]]) for j in range(a, b)]


def pipeline_options(splitter, model, stages, share):
    """Every (mbs, m, layer split) of one pipeline that fits: lists of Pipelines."""
    L, p = model.num_layers, len(stages)
    out = []
    if p > L:
        return out
    for mbs in [d for d in range(1, share + 1) if share % d == 0]:
        m = share // mbs
        for cuts in itertools.combinations(range(1, L), p - 1):
            bounds = [0, *cuts, L]
            built = []
            for i, devs in enumerate(stages):
                k = inflight_microbatches("1f1b", p, i, m)
                ls = stage_layers(splitter, model, devs, bounds[i], bounds[i + 1], mbs, m, k, role(i, p))
                if ls is None:
                    break
                built.append(Stage(list(devs), ls))
            if len(built) == p:
                out.append(Pipeline(share, mbs, m, built))
    return out


def exhaustive_best(model, cluster, B, opts):
    """(step time, plan) of the fastest plan over the whole enumerated space (inf, None if nothing fits)."""
    splitter = LayerSplitter(model, cluster, opts, buckets=None)
    ref = ModelRef(model.name, model.seq_len, model.num_layers, model.source)
    best_t, best_plan = np.inf, None
    devices = list(range(cluster.num_devices))
    memo = {}
    costs = CostCache()  # the cost model's memo, shared by every estimate below
    for groups in set_partitions(devices):
        P = len(groups)
        if P > B:
            continue
        per_group = [list(ordered_partitions(g)) for g in groups]
        for shares in compositions(B, P):
            choices = []
            for stage_sets, share in zip(per_group, shares):
                opts_j = []
                for stages in stage_sets:
                    key = (tuple(stages), share)
                    if key not in memo:
                        memo[key] = pipeline_options(splitter, model, stages, share)
                    opts_j.extend(memo[key])
                choices.append(opts_j)
            for combo in itertools.product(*choices):
                plan = Plan(ref, cluster, B, list(combo), memory_budget_gib=opts.memory_budget_gib)
                est = estimate_plan(plan, model, opts.params, costs)
                if est.fits and est.step_time_s < best_t:
                    best_t, best_plan = est.step_time_s, plan
    return best_t, best_plan
