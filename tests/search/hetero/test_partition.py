"""The hierarchical partition: pipelines, stages and local-search moves cover every device exactly once."""

import sys
from collections import Counter

import pytest

from autopar.cluster import load_cluster
from autopar.cluster.cluster import Cluster, Node
from autopar.search.hetero import graph_partition as gp
from autopar.search.hetero.local_search import neighbours
from tests.search.hetero.hetlib import FAST, SLOW, mixed

CLUSTERS = {
    "flashflex-40": lambda: load_cluster("8x3080Ti+8x3090+24x4090"),
    "flashflex-24": lambda: load_cluster("8x3090+8x4090+8xA100"),
    "geo": lambda: load_cluster("geo-us-3region"),
    "tiny": lambda: mixed(),
    "uneven-nodes": lambda: Cluster([Node(SLOW, 4, name="a"), Node(FAST, 2, name="b"), Node(FAST, 6, name="c")],
                                    inter_bw_gbps=3.0, name="uneven"),
}


def assert_exact_cover(groups, n):
    flat = sorted(d for g in groups for d in g)
    assert flat == list(range(n)), "every device exactly once"


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("metis", [True, False])
def test_pipeline_groups_cover_every_device_once(name, metis, monkeypatch):
    cluster = CLUSTERS[name]()
    if not metis:
        monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis fails: the greedy fallback
    cuts = Counter()
    for parts in range(1, 9):
        groups_list = gp.pipeline_groups(cluster, parts, cuts)
        for groups in groups_list:
            assert len(groups) == parts and all(groups)
            assert_exact_cover(groups, cluster.num_devices)
    said = gp.describe_partitioner(cuts)
    assert said.startswith("metis") if metis else said == "greedy (pymetis not installed)"
    # node slicing is offered whenever the parts divide every node
    if all(nd.count % 2 == 0 for nd in cluster.nodes):
        sliced = gp.pipeline_groups(cluster, 2)[0]
        for g in sliced:
            per_node = {cluster.node_of(d) for d in g}
            assert len(per_node) == cluster.num_nodes


def test_describe_partitioner_names_what_ran():
    assert gp.describe_partitioner(Counter({gp.METIS: 4})) == "metis"
    assert gp.describe_partitioner(Counter({gp.NO_PYMETIS: 4})) == "greedy (pymetis not installed)"
    assert gp.describe_partitioner(Counter({gp.METIS_REFUSED: 2})) == "greedy (METIS refused every graph)"
    assert gp.describe_partitioner(Counter({gp.METIS: 3, gp.METIS_REFUSED: 1})) == \
        "metis (greedy for 1 of 4 graphs METIS refused)"
    assert gp.describe_partitioner(Counter()).startswith("none")


def test_metis_refusing_a_graph_is_counted(monkeypatch):
    pytest.importorskip("pymetis")
    monkeypatch.setattr(gp, "_metis", lambda *a: None)
    cuts = Counter()
    assert gp.pipeline_groups(load_cluster("8x3090+8x4090+8xA100"), 3, cuts)
    assert cuts == Counter({gp.METIS_REFUSED: 2})


def test_pipeline_groups_balance_compute():
    cluster = load_cluster("8x3090+8x4090+8xA100")
    for groups in gp.pipeline_groups(cluster, 2):
        loads = [sum(cluster.gpu_of(d).tflops for d in g) for g in groups]
        total = sum(loads)
        # balanced up to one node's compute (METIS or greedy may keep nodes whole)
        assert max(loads) - min(loads) <= max(nd.count * nd.gpu.tflops for nd in cluster.nodes) + 1e-9
        assert max(loads) < total


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_initial_shapes_cover_devices_with_single_node_stages(name):
    cluster = CLUSTERS[name]()
    shapes = gp.initial_shapes(cluster, 4, 34)
    assert shapes
    for shape in shapes:
        assert_exact_cover([st for p in shape for st in p], cluster.num_devices)
        for pipe in shape:
            assert pipe, "no empty pipeline"
            for st in pipe:
                assert st and len({cluster.node_of(d) for d in st}) == 1, "a stage sits in one machine"
            first_mem = min(cluster.gpu_of(d).memory_gib for d in pipe[0])
            assert first_mem == max(min(cluster.gpu_of(d).memory_gib for d in st) for st in pipe)


def test_order_follows_fast_links():
    # three zones: the path must not hop back and forth over the slow WAN links
    cluster = load_cluster("geo-us-3region")
    stages = [tuple(cluster.node_devices(n)) for n in range(cluster.num_nodes)]
    path = gp.order_stages(cluster, stages[::-1])
    zones = [cluster.nodes[cluster.node_of(st[0])].zone for st in path]
    changes = sum(a != b for a, b in zip(zones, zones[1:]))
    assert changes == 2  # each zone visited once


@pytest.mark.parametrize("name", ["tiny", "uneven-nodes", "flashflex-24"])
def test_neighbours_keep_an_exact_cover(name):
    cluster = CLUSTERS[name]()
    for start in gp.initial_shapes(cluster, 3, 34)[:4]:
        count = 0
        for nb in neighbours(start, cluster, 34):
            assert_exact_cover([st for p in nb for st in p], cluster.num_devices)
            assert all(p and all(p) for p in nb)
            assert all(len(p) <= 34 for p in nb)
            count += 1
        assert count > 0
