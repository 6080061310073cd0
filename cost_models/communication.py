"""Collective and point-to-point times under the alpha-beta(-gamma) model.

alpha = latency per message step (s), beta = 1/bandwidth (s/byte), gamma = reduction cost per byte
(memory bound: read two operands, write one, at HBM speed). Ring algorithms pay 2(n-1) steps for an
all-reduce; trees pay 2*log2(n) steps but move every byte twice. NCCL picks the faster, so
``allreduce_time`` takes the minimum. Groups that span nodes run hierarchically: an intra-node phase
on the node fabric and an inter-node phase on the network, each as slow as its slowest link.
GenModel (arXiv 2409.04202) adds a reduction (gamma) term, ``reduction_time`` (NCCL runs it under the
transfer: ``Collectives.reduced``), and an incast term for many senders meeting one receiver, ``incast_time``.

These are the raw formulas; ``cost_models.collectives.Collectives`` decides per group whether a
measured fit replaces them.

All functions accept numpy arrays; a group of one (n <= 1) or zero bytes costs nothing.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

Seconds = np.ndarray  # float64 array (0-d for scalar inputs)


def _arr(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=float)


def p2p_time(nbytes: ArrayLike, bw: ArrayLike, lat: ArrayLike) -> Seconds:
    """One send of ``nbytes`` over a link of ``bw`` bytes/s and ``lat`` s."""
    b = _arr(nbytes)
    return np.where(b > 0, lat + b / bw, 0.0)


def ring_allreduce_time(nbytes: ArrayLike, n: ArrayLike, bw: ArrayLike, lat: ArrayLike) -> Seconds:
    """Ring all-reduce: reduce-scatter then all-gather, 2(n-1) steps of nbytes/n."""
    b, n = _arr(nbytes), _arr(n)
    t = 2.0 * (n - 1) / np.maximum(n, 1) * b / bw + 2.0 * (n - 1) * lat
    return np.where((n > 1) & (b > 0), t, 0.0)


def tree_allreduce_time(nbytes: ArrayLike, n: ArrayLike, bw: ArrayLike, lat: ArrayLike) -> Seconds:
    """Pipelined (double binary) tree all-reduce: 2 log2(n) latency steps, every byte sent up and down."""
    b, n = _arr(nbytes), _arr(n)
    t = 2.0 * np.ceil(np.log2(np.maximum(n, 1))) * lat + 2.0 * b / bw
    return np.where((n > 1) & (b > 0), t, 0.0)


def allreduce_time(nbytes: ArrayLike, n: ArrayLike, bw: ArrayLike, lat: ArrayLike) -> Seconds:
    """Flat all-reduce over n ranks: the faster of ring and tree (as NCCL's tuner picks)."""
    return np.minimum(ring_allreduce_time(nbytes, n, bw, lat), tree_allreduce_time(nbytes, n, bw, lat))


def allgather_time(nbytes: ArrayLike, n: ArrayLike, bw: ArrayLike, lat: ArrayLike) -> Seconds:
    """Ring all-gather producing ``nbytes`` in total on every rank (each contributes nbytes/n)."""
    b, n = _arr(nbytes), _arr(n)
    t = (n - 1) / np.maximum(n, 1) * b / bw + (n - 1) * lat
    return np.where((n > 1) & (b > 0), t, 0.0)


def reduce_scatter_time(nbytes: ArrayLike, n: ArrayLike, bw: ArrayLike, lat: ArrayLike) -> Seconds:
    """Ring reduce-scatter of ``nbytes`` per rank into n shards: same wire cost as all-gather."""
    return allgather_time(nbytes, n, bw, lat)


def reduction_time(nbytes: ArrayLike, n: ArrayLike, hbm_bw: ArrayLike) -> Seconds:
    """GenModel's gamma term: summing (n-1)/n of the buffer, 3 bytes of memory traffic per byte."""
    b, n = _arr(nbytes), _arr(n)
    return np.where(n > 1, 3.0 * (n - 1) / np.maximum(n, 1) * b / hbm_bw, 0.0)


def node_ring(n_local: ArrayLike, n_nodes: ArrayLike, intra_bw: ArrayLike, intra_lat: ArrayLike,
              inter_bw: ArrayLike, inter_lat: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, bandwidth, latency per step) of NCCL's ring over n_local ranks on each of n_nodes nodes.

    NCCL opens one ring per channel and lays each across the nodes through a different rank's NIC, so the
    rings together leave a node over all of its n_local ranks' shares of the network: a ring step runs at
    the node fabric's bandwidth or at n_local x ``inter_bw``, whichever is less. (stas00/ml-engineering
    network/README.md @ 744d01e1: a 4 GiB all-reduce over 4 nodes of 8 B200 measured 22.05 ms against
    20.8 ms for this ring at the nodes' 400 GB/s; one NIC would take 166 ms.) Of a ring's n - 1 steps per
    pass, n_nodes - 1 cross the network and the others stay inside a node, as NCCL's own latency model
    counts them (NVIDIA/nccl src/graph/tuning.cc @ 01afd20: ``(nsteps - nInterSteps) * intraLat +
    nInterSteps * interLat`` with nInterSteps = nNodes - 1 per pass): the latency returned is their mean.
    """
    nl, nn = _arr(n_local), _arr(n_nodes)
    n = nl * nn
    steps = np.maximum(n - 1, 1)
    lat = ((n - nn) * _arr(intra_lat) + (nn - 1) * _arr(inter_lat)) / steps
    return n, np.minimum(_arr(intra_bw), nl * _arr(inter_bw)), lat


def nccl_allgather_time(nbytes: ArrayLike, n_local: ArrayLike, n_nodes: ArrayLike, intra_bw: ArrayLike,
                        intra_lat: ArrayLike, inter_bw: ArrayLike, inter_lat: ArrayLike) -> Seconds:
    """All-gather over n_local ranks on each of n_nodes nodes: NCCL's ring (``node_ring``), the one algorithm
    NCCL runs all-gather and reduce-scatter with on more than one GPU per node (tuning.cc prices no other),
    n - 1 latency steps however many ranks. Inside one node or with one rank per node it is the flat ring
    over that node's fabric or the network. ``inter_bw`` is the share of the node's network bandwidth one
    rank gets.
    """
    b, nl, nn = _arr(nbytes), _arr(n_local), _arr(n_nodes)
    one_level = np.where(nn > 1, allgather_time(b, nn, inter_bw, inter_lat), allgather_time(b, nl, intra_bw, intra_lat))
    n, bw, lat = node_ring(nl, nn, intra_bw, intra_lat, inter_bw, inter_lat)
    return np.where((nn > 1) & (nl > 1), allgather_time(b, n, bw, lat), one_level)


def nccl_reduce_scatter_time(nbytes: ArrayLike, n_local: ArrayLike, n_nodes: ArrayLike, intra_bw: ArrayLike,
                             intra_lat: ArrayLike, inter_bw: ArrayLike, inter_lat: ArrayLike) -> Seconds:
    """Reduce-scatter of ``nbytes`` per rank: the all-gather's ring run backwards, the same wire cost and
    latency steps. Its reduction is ``reduction_time``."""
    return nccl_allgather_time(nbytes, n_local, n_nodes, intra_bw, intra_lat, inter_bw, inter_lat)


def hierarchical_allreduce_time(nbytes: ArrayLike, n_local: ArrayLike, n_nodes: ArrayLike, intra_bw: ArrayLike,
                                intra_lat: ArrayLike, inter_bw: ArrayLike, inter_lat: ArrayLike) -> Seconds:
    """All-reduce = intra reduce-scatter, inter all-reduce of one shard, intra all-gather.

    With one node it is a flat intra-node ring all-reduce: NCCL runs its trees across nodes, and inside
    one node picks the ring at every size (NCCL_DEBUG TUNING on an 8x H200 node: ``Algo RING proto LL``
    up to 1 MiB, ``RING proto SIMPLE`` above with NVLS off; stas00/ml-engineering network/README.md @
    744d01e1, "SHARP"), whose 2(n-1) latency steps are what small all-reduces measure there (about 40 us
    on 8 A100 or 8 H200). With one rank per node it is a flat network all-reduce, ring or tree. Otherwise
    the faster of the hierarchical phases and NCCL's ring over the nodes (``node_ring``).
    """
    b, nl, nn = _arr(nbytes), _arr(n_local), _arr(n_nodes)
    flat_intra = ring_allreduce_time(b, nl, intra_bw, intra_lat)
    flat_inter = allreduce_time(b, nn, inter_bw, inter_lat)
    hier = (reduce_scatter_time(b, nl, intra_bw, intra_lat)
            + allreduce_time(b / np.maximum(nl, 1), nn, inter_bw, inter_lat)
            + allgather_time(b, nl, intra_bw, intra_lat))
    n, bw, lat = node_ring(nl, nn, intra_bw, intra_lat, inter_bw, inter_lat)
    hier = np.minimum(hier, ring_allreduce_time(b, n, bw, lat))
    return np.where(nn <= 1, flat_intra, np.where(nl <= 1, flat_inter, hier))


def incast_time(nbytes: ArrayLike, n: ArrayLike, fan_in: ArrayLike, bw: ArrayLike) -> ArrayLike:
    """GenModel's incast term with delta = 1: ``fan_in - 1`` extra senders, each with ``nbytes / n``,
    share one receiving link of ``bw`` bytes/s (no congestion penalty beyond the sharing)."""
    return (fan_in - 1) * (nbytes / n) / bw


def alltoall_time(nbytes: ArrayLike, n: ArrayLike, bw: ArrayLike, lat: ArrayLike) -> Seconds:
    """All-to-all over n ranks where each rank holds ``nbytes`` to scatter among them (1/n stays local):
    (n-1)/n of the data leaves every rank over the group's slowest link, and each rank pays the latency
    of one message per peer (n - 1)."""
    b, n = _arr(nbytes), _arr(n)
    t = (n - 1) / np.maximum(n, 1) * b / bw + (n - 1) * lat
    return np.where((n > 1) & (b > 0), t, 0.0)
