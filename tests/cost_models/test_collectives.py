"""Collectives: the one place deciding measured fit against formula, the links' efficiency, and the gamma term."""

import pytest

from cost_models import CostParams
from cost_models import communication as comm
from cost_models.collectives import Collectives, GroupLinks
from tests.cost_models.fakes import BW, CBW, HBM, LAT, links

FIT = CostParams(comm_fit=(("allreduce", 2, 3e-5, 2e-10), ("reduce_scatter", 2, 1e-5, 1e-10)))


def test_formula_for_groups_the_profile_does_not_cover():
    """One node: NCCL's ring (its tree would win on latency here: 4 steps against 6), at link_efficiency of BW."""
    c = Collectives(FIT, HBM)
    g4 = links(4)
    assert c.fit("allreduce", g4) is None
    ring = 2 * 3 / 4 * 1e6 / CBW + 6 * LAT
    assert comm.tree_allreduce_time(1e6, 4, CBW, LAT) < ring
    assert c.time("allreduce", 1e6, g4) == pytest.approx(ring, rel=1e-12)
    assert c.time("allgather", 1e6, g4) == pytest.approx(3 / 4 * 1e6 / CBW + 3 * LAT, rel=1e-12)
    assert c.reduction("allreduce", 1e6, g4) == pytest.approx(3 * 3 / 4 * 1e6 / HBM, rel=1e-12)
    assert c.reduced("allreduce", 1e6, g4) == pytest.approx(ring, rel=1e-12)  # the reduction runs under the wire


def test_link_efficiency_scales_the_formula_bandwidth_only():
    g4, across = links(4), GroupLinks(8, 4, 2, BW, LAT, 10e9, 20e-6)
    for eff in (1.0, 0.5):
        c = Collectives(CostParams(link_efficiency=eff), HBM)
        assert c.time("allgather", 1e6, g4) == pytest.approx(3 / 4 * 1e6 / (eff * BW) + 3 * LAT, rel=1e-12)
        assert c.time("allreduce", 1e6, across) == pytest.approx(comm.hierarchical_allreduce_time(
            1e6, 4, 2, eff * BW, LAT, eff * 10e9, 20e-6), rel=1e-12)
    # a measured fit is what the collective reached: no factor on it
    slow = Collectives(CostParams(link_efficiency=0.5, comm_fit=FIT.comm_fit), HBM)
    assert slow.time("allreduce", 1e6, links(2)) == pytest.approx(3e-5 + 2e-10 * 1e6, rel=1e-12)


def test_a_reduction_slower_than_the_wire_is_what_the_collective_takes():
    c = Collectives(CostParams(), 1e9)  # 1 GB/s memory: summing the buffer takes longer than sending it
    g4 = links(4)
    assert c.reduction("reduce_scatter", 1e6, g4) > c.time("reduce_scatter", 1e6, g4)
    assert c.reduced("reduce_scatter", 1e6, g4) == pytest.approx(3 * 3 / 4 * 1e6 / 1e9, rel=1e-12)


def test_measured_fit_replaces_formula_and_gamma():
    c = Collectives(FIT, HBM)
    g2 = links(2)
    assert c.time("allreduce", 1e6, g2) == pytest.approx(3e-5 + 2e-10 * 1e6, rel=1e-12)
    assert c.reduction("allreduce", 1e6, g2) == 0.0  # the measured time already summed the buffers
    assert c.reduced("reduce_scatter", 1e6, g2) == pytest.approx(1e-5 + 1e-10 * 1e6, rel=1e-12)
    assert c.time("allreduce", 0, g2) == 0.0
    # no fit for the all-gather of this size: the formula
    assert c.time("allgather", 1e6, g2) == pytest.approx(1 / 2 * 1e6 / CBW + LAT, rel=1e-12)


def test_fits_cover_one_node_only():
    across = GroupLinks(2, 1, 2, BW, LAT, 10e9, 20e-6)
    c = Collectives(FIT, HBM)
    assert c.fit("allreduce", across) is None
    assert c.reduction("allreduce", 1e6, across) == pytest.approx(1.5 * 1e6 / HBM, rel=1e-12)


def test_slowest_link_of_a_group():
    assert links(4).slowest == (BW, LAT)
    assert GroupLinks(4, 2, 2, BW, LAT, 10e9, 20e-6).slowest == (10e9, 20e-6)


def test_every_formula_priced_call_pays_the_call_cost_once():
    """A framework's fixed cost per collective call (``collective_call_s``, 0 by default: the per-step latencies
    hold NCCL's own base latency) is added once per call: nothing for no bytes or a group of one, and nothing on a
    measured fit, which includes it."""
    assert CostParams().collective_call_s == 0.0
    g4 = links(4)
    base = Collectives(CostParams(), HBM)
    for call in (8.4e-6, 1e-3):
        c = Collectives(CostParams(collective_call_s=call), HBM)
        for name in ("allreduce", "allgather", "reduce_scatter"):
            many = c.time(name, [0.0, 1e3, 1e9], g4)
            assert many[0] == 0.0
            assert many[1:] == pytest.approx(base.time(name, [1e3, 1e9], g4) + call, rel=1e-12)
            assert c.reduced(name, 1e9, g4) >= c.time(name, 1e9, g4)
        assert c.time("allreduce", 1e6, links(1)) == 0.0
        fitted = Collectives(CostParams(collective_call_s=call, comm_fit=FIT.comm_fit), HBM)
        assert fitted.time("allreduce", 1e6, links(2)) == pytest.approx(3e-5 + 2e-10 * 1e6, rel=1e-12)
