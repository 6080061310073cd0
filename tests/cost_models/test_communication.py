"""Collective formulas against hand-computed values."""

import numpy as np
import pytest

from cost_models import communication as comm

GB = 1e9


def test_p2p_is_latency_plus_bytes_over_bandwidth():
    assert comm.p2p_time(1e9, 10 * GB, 5e-6) == pytest.approx(5e-6 + 0.1)
    assert comm.p2p_time(0, 10 * GB, 5e-6) == 0.0


def test_ring_allreduce_hand_value():
    # 8 ranks, 1 GB, 100 GB/s, 10 us: 2*7/8*1/100 + 14*10us
    assert comm.ring_allreduce_time(1e9, 8, 100 * GB, 10e-6) == pytest.approx(2 * 7 / 8 * 0.01 + 14 * 10e-6)


def test_tree_allreduce_hand_value():
    assert comm.tree_allreduce_time(1e9, 8, 100 * GB, 10e-6) == pytest.approx(2 * 3 * 10e-6 + 2 * 0.01)


def test_allreduce_picks_ring_for_large_and_tree_for_small_messages():
    big = comm.allreduce_time(1e9, 8, 100 * GB, 10e-6)
    assert big == pytest.approx(comm.ring_allreduce_time(1e9, 8, 100 * GB, 10e-6))
    small = comm.allreduce_time(1e3, 64, 100 * GB, 10e-6)
    assert small == pytest.approx(comm.tree_allreduce_time(1e3, 64, 100 * GB, 10e-6))


def test_allgather_and_reduce_scatter_hand_value():
    assert comm.allgather_time(4e9, 4, 100 * GB, 1e-5) == pytest.approx(3 / 4 * 0.04 + 3e-5)
    assert comm.reduce_scatter_time(4e9, 4, 100 * GB, 1e-5) == pytest.approx(3 / 4 * 0.04 + 3e-5)


def test_single_rank_and_zero_bytes_cost_nothing():
    for f in (comm.ring_allreduce_time, comm.tree_allreduce_time, comm.allgather_time):
        assert f(1e9, 1, GB, 1e-5) == 0.0
        assert f(0, 8, GB, 1e-5) == 0.0


def test_hierarchical_allreduce_hand_value():
    # 2 nodes x 8: RS intra (7/8 * S / 300) + AR inter on S/8 (2 nodes: ring 2*1/2 * S/8 / 12.5 vs tree)
    S, intra, inter = 1e9, 300 * GB, 12.5 * GB
    expected = (7 / 8 * S / intra + 7 * 3e-6) * 2 + min(
        2 * 1 / 2 * (S / 8) / inter + 2 * 1 * 5e-6, 2 * 1 * 5e-6 + 2 * (S / 8) / inter)
    got = comm.hierarchical_allreduce_time(S, 8, 2, intra, 3e-6, inter, 5e-6)
    assert got == pytest.approx(expected)


def test_hierarchical_degenerates_to_flat():
    flat_intra = comm.ring_allreduce_time(1e9, 8, 300 * GB, 3e-6)
    assert comm.hierarchical_allreduce_time(1e9, 8, 1, 300 * GB, 3e-6, 12.5 * GB, 5e-6) == pytest.approx(flat_intra)
    flat_inter = comm.allreduce_time(1e9, 4, 12.5 * GB, 5e-6)
    assert comm.hierarchical_allreduce_time(1e9, 1, 4, 300 * GB, 3e-6, 12.5 * GB, 5e-6) == pytest.approx(flat_inter)


def test_crossing_nodes_is_slower_than_staying_inside():
    inside = comm.hierarchical_allreduce_time(1e9, 16, 1, 300 * GB, 3e-6, 12.5 * GB, 5e-6)
    across = comm.hierarchical_allreduce_time(1e9, 8, 2, 300 * GB, 3e-6, 12.5 * GB, 5e-6)
    assert across > inside


def test_allgather_and_reduce_scatter_across_nodes_are_nccls_ring_hand_value():
    # 2 nodes x 4: one ring of 8 ranks at min(intra, 4 x inter) = 50 GB/s, 7/8 of S through each rank; of its
    # 7 latency steps 1 crosses the network and 6 stay inside a node (NCCL's tuning.cc counts them so)
    S, intra, inter = 1e9, 300 * GB, 12.5 * GB
    expected = 7 / 8 * S / (4 * inter) + 6 * 3e-6 + 1 * 5e-6
    assert comm.nccl_allgather_time(S, 4, 2, intra, 3e-6, inter, 5e-6) == pytest.approx(expected)
    assert comm.nccl_reduce_scatter_time(S, 4, 2, intra, 3e-6, inter, 5e-6) == pytest.approx(expected)
    # inside one node, or one rank per node: the flat ring over that fabric
    assert comm.nccl_allgather_time(S, 4, 1, intra, 3e-6, inter, 5e-6) == pytest.approx(
        comm.allgather_time(S, 4, intra, 3e-6))
    assert comm.nccl_allgather_time(S, 1, 4, intra, 3e-6, inter, 5e-6) == pytest.approx(
        comm.allgather_time(S, 4, inter, 5e-6))


def test_a_ring_over_many_nodes_pays_a_latency_step_per_rank():
    """1536 ranks on 192 nodes: 1535 steps, 191 over the network, where a two-level gather would pay 191 + 7."""
    n, bw, lat = comm.node_ring(8, 192, 300 * GB, 3e-6, 25 * GB, 5e-6)
    assert n == 1536 and bw == pytest.approx(200 * GB)
    assert 1535 * lat == pytest.approx(1344 * 3e-6 + 191 * 5e-6)
    small = comm.nccl_allgather_time(1536 * 1024, 8, 192, 300 * GB, 3e-6, 25 * GB, 5e-6)
    assert small > 1344 * 3e-6 + 191 * 5e-6


def test_incast_hand_value():
    # 3 senders (2 extra) of 1 GB / 4 each into one 10 GB/s link
    assert comm.incast_time(1e9, 4, 3, 10 * GB) == pytest.approx(2 * 0.25e9 / 10e9)
    assert comm.incast_time(1e9, 4, 1, 10 * GB) == 0.0


def test_vectorised_over_arrays():
    out = comm.allreduce_time(np.array([1e6, 1e9]), np.array([2, 8]), 100 * GB, 1e-5)
    assert out.shape == (2,) and out[1] > out[0]


def test_reduction_time_gamma_term():
    assert comm.reduction_time(1e9, 4, 2e12) == pytest.approx(3 * 3 / 4 * 1e9 / 2e12)


def test_one_node_runs_the_ring_even_where_a_tree_would_be_faster():
    """NCCL runs its trees across nodes; inside one it rings at every size: a small all-reduce over 8 GPUs pays
    the ring's 14 latency steps (about 40 us measured on 8 A100 or 8 H200), not a tree's 6."""
    small = 32 * 1024
    assert comm.tree_allreduce_time(small, 8, 300 * GB, 3e-6) < comm.ring_allreduce_time(small, 8, 300 * GB, 3e-6)
    got = comm.hierarchical_allreduce_time(small, 8, 1, 300 * GB, 3e-6, 12.5 * GB, 5e-6)
    assert got == pytest.approx(14 * 3e-6 + 2 * 7 / 8 * small / (300 * GB))
    # across nodes, one rank per node: the faster of ring and tree, as before
    assert comm.hierarchical_allreduce_time(small, 1, 8, 300 * GB, 3e-6, 12.5 * GB, 5e-6) == pytest.approx(
        comm.tree_allreduce_time(small, 8, 12.5 * GB, 5e-6))


def test_nccl_ring_over_the_nodes_wins_where_the_network_is_fast():
    """2 nodes x 8 at 50 GB/s of network per rank: the rings leave each node over all 8 ranks' NICs (400 GB/s,
    so NVLink's 300 bounds them); one all-reduce over 16 ranks beats reduce-scatter + all-reduce + all-gather."""
    S, intra, inter = 1e9, 300 * GB, 50 * GB
    ring = 2 * 15 / 16 * S / intra + 2 * (14 * 3e-6 + 1 * 5e-6)  # 2 x 15 steps, 2 x 1 over the network
    hier = (7 / 8 * S / intra + 7 * 3e-6) * 2 + min(2 * 1 / 2 * (S / 8) / inter + 2 * 5e-6,
                                                     2 * 5e-6 + 2 * (S / 8) / inter)
    assert ring < hier
    assert comm.hierarchical_allreduce_time(S, 8, 2, intra, 3e-6, inter, 5e-6) == pytest.approx(ring)
    ag_ring = 15 / 16 * S / intra + 14 * 3e-6 + 1 * 5e-6
    assert comm.nccl_allgather_time(S, 8, 2, intra, 3e-6, inter, 5e-6) == pytest.approx(ag_ring)
    assert comm.nccl_reduce_scatter_time(S, 8, 2, intra, 3e-6, inter, 5e-6) == pytest.approx(ag_ring)
    # a slow network: the hierarchical phases, which send only 1/8 of the buffer across
    slow = comm.hierarchical_allreduce_time(S, 8, 2, intra, 3e-6, 1 * GB, 5e-6)
    assert slow == pytest.approx((7 / 8 * S / intra + 7 * 3e-6) * 2 + 2 * 1 / 2 * (S / 8) / GB + 2 * 5e-6)
