"""GEMM waves in the estimate: a GPU's SM count makes narrow TP shards slower per FLOP, where nothing measured says otherwise."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar.cluster.cluster import Cluster
from autopar.cluster.parse import load_cluster
from autopar.estimate import estimate_plan
from autopar.estimate.context import StageContext
from autopar.modelspec import from_zoo
from autopar.plan.schema import Strategy
from autopar.search import SearchOptions, search
from cost_models import CostParams
from cost_models.layer import CKPT_CODE, compute_times, one_layer_cost


def without_sms(cluster: Cluster) -> Cluster:
    return replace(cluster, nodes=[replace(nd, gpu=replace(nd.gpu, sms=0)) for nd in cluster.nodes])


def block_cost(cluster: Cluster, tp: int, mbs: int, params: CostParams | None = None) -> float:
    block = from_zoo("gpt3-1.3b", seq_len=1024).layers[1]
    stage = StageContext(cluster, tuple(range(4)), mbs * 4 // tp, 1, params or CostParams())
    return one_layer_cost(block, Strategy(tp=tp), stage).cost


def test_narrow_shards_pay_their_idle_waves_on_a_t4():
    t4 = load_cluster("1x4xT4")
    assert t4.nodes[0].gpu.sms == 40
    slow = {tp: block_cost(t4, tp, 1) / block_cost(without_sms(t4), tp, 1) for tp in (1, 4)}
    assert slow[1] >= 1.0 and slow[4] > slow[1] + 0.05


def test_a_measured_curve_of_the_kind_already_times_its_waves():
    block = from_zoo("gpt3-1.3b", seq_len=1024).layers[1]
    measured = CostParams(eff_by_kind=(("block", 4, 0, 0.4, 1e-4),))
    one = np.ones(1)
    args = (block, 4 * one, 0 * one, np.array([CKPT_CODE["none"]]), one, one, 24e12)
    assert compute_times(*args, measured, None, 40) == compute_times(*args, measured, None, 0)
    assert compute_times(*args, CostParams(), None, 40)[0] > compute_times(*args, CostParams(), None, 0)[0]


def test_the_search_optimises_the_number_the_estimate_prints():
    model, cluster = from_zoo("gpt3-1.3b", seq_len=1024), load_cluster("2x4xT4")
    result = search(model, cluster, 32, SearchOptions(), with_baselines=False)
    best = min(c.step_time for c in result.configs)
    assert estimate_plan(result.plan, model).step_time_s == result.estimate.step_time_s == pytest.approx(best, rel=1e-9)
    plain = search(model, without_sms(cluster), 32, SearchOptions(), with_baselines=False)
    assert best >= min(c.step_time for c in plain.configs)  # idle waves only ever add time
