"""--cluster values: presets, inline specs, YAML files, round trips, links, and every bad input."""

import math

import pytest
import yaml
from pytest import approx

from autopar.cluster import (
    cluster_from_doc,
    load_cluster,
    preset_description,
    preset_names,
)
from autopar.errors import AutoparError

GB = 1e9


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# -- presets ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_and_round_trips(name):
    c = load_cluster(name)
    assert c.name == name and c.num_devices > 0
    assert c.num_devices == sum(nd.count for nd in c.nodes)
    assert preset_description(name)
    assert cluster_from_doc(c.to_dict(), None, standalone=True) == c
    assert cluster_from_doc(yaml.safe_load(yaml.safe_dump(c.to_dict())), None, standalone=True) == c


def test_required_presets_exist():
    names = set(preset_names())
    assert {"8x3080Ti+8x3090+24x4090", "8x3080Ti+8x3090+8x4090+8xA100", "8x3090+8x4090+8xA100"} <= names
    geo = [load_cluster(n) for n in names if n.startswith("geo-")]
    assert geo and all(c.bw_matrix_gbps is not None and len({nd.zone for nd in c.nodes}) > 1 for c in geo)


def test_preset_lookup_ignores_case():
    assert load_cluster("DGX-A100-2NODE").name == "dgx-a100-2node"


def test_flashflex_mix_preset():
    c = load_cluster("8x3080Ti+8x3090+24x4090")
    assert (c.num_devices, c.num_nodes, len(c.gpu_types)) == (40, 5, 3)
    assert [nd.gpu.name for nd in c.nodes] == ["RTX3080Ti", "RTX3090", "RTX4090", "RTX4090", "RTX4090"]
    assert c.inter_bw_gbps == 5 and not c.is_homogeneous
    c = load_cluster("8x3080Ti+8x3090+8x4090+8xA100")
    assert c.nodes[3].gpu.name == "A100-80G" and c.nodes[3].intra_bw == 300 * GB


def test_geo_world_links():
    c = load_cluster("geo-world-8region")
    zones = [nd.zone for nd in c.nodes]
    o, v, t, s = (zones.index(z) for z in ("oregon", "virginia", "tokyo", "seoul"))
    assert c.node_link(o, v) == approx((0.625 * GB, 33.5e-3))
    assert c.node_link(t, s) == c.node_link(s, t) == approx((1.25 * GB, 16.5e-3))
    bws = [c.node_link(a, b)[0] for a in range(8) for b in range(8) if a != b]
    lats = [c.node_link(a, b)[1] for a in range(8) for b in range(8) if a != b]
    assert min(bws) == 0.125 * GB and max(bws) == 1.25 * GB
    assert 5e-3 <= min(lats) and max(lats) <= 150e-3


# -- inline specs -------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,devices,nodes,types", [
    ("8xA100-80G", 8, 1, 1), ("2x8xA100-80G", 16, 2, 1), ("4x8xH100", 32, 4, 1), ("4xcpu", 4, 1, 1),
    ("16xcpu", 16, 1, 1), ("8x3090+8x4090+8xA100", 24, 3, 3), ("8x3080Ti+16x4090", 24, 3, 2),
    ("24x4090", 24, 3, 1), ("1x16xV100", 16, 1, 1), ("128x8xA100-80G", 1024, 128, 1), ("2 x 8 x a100", 16, 2, 1),
])
def test_inline_counts(spec, devices, nodes, types):
    c = load_cluster(spec)
    assert (c.num_devices, c.num_nodes, len(c.gpu_types)) == (devices, nodes, types)
    assert c.name == spec


def test_inline_splits_large_terms_into_nodes_of_eight():
    c = load_cluster("12x4090")
    assert [nd.count for nd in c.nodes] == [8, 4]
    assert not c.is_homogeneous  # unequal nodes
    assert [nd.name for nd in c.nodes] == ["node0", "node1"]


def test_inline_default_networks():
    a100 = load_cluster("2x8xA100-80G")
    assert a100.link(0, 1) == approx((300 * GB, 3e-6)) and a100.link(0, 8) == approx((200 * GB, 5e-6))
    assert load_cluster("2x8xH100").link(0, 8)[0] == 400 * GB
    rtx = load_cluster("16x4090")
    assert rtx.link(0, 1)[0] == 16 * GB and rtx.link(0, 8)[0] == 12.5 * GB
    cpu = load_cluster("4xcpu")
    assert cpu.num_nodes == 1 and cpu.link(0, 3)[0] == 2 * GB


def test_inline_mixed_network_takes_the_slower_nic_per_pair():
    c = load_cluster("2x8xA100+8x4090")
    assert c.bw_matrix_gbps is not None
    assert c.node_link(0, 1) == approx((200 * GB, 5e-6))  # two A100 nodes: InfiniBand
    assert c.node_link(0, 2) == approx((12.5 * GB, 30e-6))  # A100 to a 4090 server: its Ethernet
    assert cluster_from_doc(c.to_dict(), None, standalone=True) == c


def test_is_homogeneous():
    assert load_cluster("2x8xA100-80G").is_homogeneous
    assert load_cluster("4xcpu").is_homogeneous
    assert not load_cluster("8x3090+8x4090+8xA100").is_homogeneous
    assert not load_cluster("geo-us-3region").is_homogeneous  # one GPU type, uneven network


def test_group_links():
    c = load_cluster("2x8xA100-80G")
    assert c.group_links(list(range(8))) == approx((300 * GB, 3e-6, math.inf, 0.0))
    assert c.group_links([0, 1, 8, 9]) == approx((300 * GB, 3e-6, 200 * GB, 5e-6))
    assert c.group_layout([0, 1, 8, 9]) == (2, 2)
    m = load_cluster("8x3090+8x4090+8xA100")
    intra_bw, _, inter_bw, inter_lat = m.group_links([0, 8, 16, 17])  # 3090, 4090, two A100s
    assert intra_bw == 16 * GB and inter_bw == 5 * GB and inter_lat == approx(30e-6)
    geo = load_cluster("geo-us-3region")  # nodes: oregon x2, virginia x2, ohio x2
    assert geo.group_links([16, 32])[2:] == approx((1.25 * GB, 6e-3))  # virginia-ohio
    assert geo.group_links([0, 16, 32])[2:] == approx((0.625 * GB, 33.5e-3))  # slowest pair is oregon's


# -- YAML files ---------------------------------------------------------------------------------
def test_yaml_nodes_repeat_names_and_scalar_network(tmp_path):
    p = write(tmp_path, """
nodes:
  - {gpu: A100, count: 8, repeat: 2, name: a, zone: east}
  - {gpu: 4090, count: 4, intra_bw_gbps: 20, intra_lat_us: 8}
inter_bw_gbps: 10
inter_lat_us: 40
""")
    c = load_cluster(p)
    assert c.name == p and c.num_devices == 20
    assert [nd.name for nd in c.nodes] == ["a-0", "a-1", "node2"]
    assert [nd.zone for nd in c.nodes] == ["east", "east", "default"]
    assert c.link(16, 17) == approx((20 * GB, 8e-6)) and c.link(0, 1) == approx((300 * GB, 3e-6))
    assert c.link(0, 16) == approx((10 * GB, 40e-6)) and c.bw_matrix_gbps is None


def test_yaml_matrix(tmp_path):
    p = write(tmp_path, """
nodes: [{gpu: A100, count: 8, repeat: 3}]
bw_matrix_gbps: [[0, 25, 1], [25, 0, 2], [1, 2, 0]]
lat_matrix_us: [[0, 5, 900], [5, 0, 800], [900, 800, 0]]
""")
    c = load_cluster(p)
    assert c.node_link(0, 1) == approx((25 * GB, 5e-6))
    assert c.node_link(2, 0) == approx((1 * GB, 900e-6))
    assert c.link(8, 23) == approx((2 * GB, 800e-6))
    assert not c.is_homogeneous


def test_yaml_uniform_matrix_is_homogeneous(tmp_path):
    p = write(tmp_path, "nodes: [{gpu: H100, count: 8, repeat: 2}]\nbw_matrix_gbps: [[0, 50], [50, 0]]\n")
    assert load_cluster(p).is_homogeneous


def test_yaml_zones(tmp_path):
    p = write(tmp_path, """
nodes:
  - {gpu: A100, count: 8, repeat: 2, zone: a}
  - {gpu: A100, count: 8, zone: b}
  - {gpu: A100, count: 8, zone: c}
inter_bw_gbps: 100
inter_lat_us: 4
zones:
  links:
    - {zones: [a, b], bw_gbps: 1.25, lat_us: 20000}
    - {zones: [c, b], bw_gbps: 0.5}
  default: {bw_gbps: 0.25, lat_us: 90000}
""")
    c = load_cluster(p)
    assert c.node_link(0, 1) == approx((100 * GB, 4e-6))  # same zone: inter_*
    assert c.node_link(1, 2) == c.node_link(2, 0) == approx((1.25 * GB, 20e-3))
    assert c.node_link(3, 2) == approx((0.5 * GB, 4e-6))  # lat_us defaults to inter_lat_us
    assert c.node_link(0, 3) == approx((0.25 * GB, 90e-3))  # a-c not listed: zones.default
    assert cluster_from_doc(c.to_dict(), None, standalone=True) == c


def test_yaml_custom_gpu_types(tmp_path):
    p = write(tmp_path, """
gpus:
  MI250X: {memory_gib: 128, tflops: 383, hbm_gbps: 3277, vendor: amd, class: pcie, node: {inter_bw_gbps: 25}}
nodes:
  - {gpu: mi250x, count: 4}
  - {gpu: {name: Tiny, memory_gib: 4, tflops: 1, hbm_gbps: 50, class: geforce}, count: 2}
""")
    c = load_cluster(p)
    assert c.nodes[0].gpu.name == "MI250X" and c.nodes[0].gpu.vendor == "amd"
    assert c.nodes[0].intra_bw == 32 * GB  # default pcie_gbps of a custom entry
    assert c.nodes[1].intra_bw == 16 * GB  # geforce class default
    assert c.inter_bw_gbps == 12.5  # slower of the two NICs (25 vs the geforce class's 12.5)


def test_yaml_spec_with_network_override(tmp_path):
    c = load_cluster(write(tmp_path, "spec: 4x8xA100-40G\ninter_bw_gbps: 50\n"))
    assert c.num_devices == 32 and c.link(0, 8)[0] == 50 * GB


def test_to_dict_file_loads_back_equal(tmp_path):
    for name in ("geo-us-3region", "2x8xA100+8x4090", "8x3080Ti+8x3090+24x4090"):
        c = load_cluster(name)
        p = write(tmp_path, yaml.safe_dump(c.to_dict()), "dump.yaml")
        d = load_cluster(p)
        d.name = c.name
        assert d == c


def test_file_without_extension(tmp_path):
    p = write(tmp_path, "spec: 4xcpu\n", "mycluster")
    c = load_cluster(p)  # has a path separator
    assert c.num_devices == 4 and c.name == p


# -- bad input ----------------------------------------------------------------------------------
FORMS_HINT = "2x8xA100-80G"


@pytest.mark.parametrize("spec,field,words", [
    ("2x8xA1000", "gpu", ["A1000", "autopar list gpus"]),
    ("8xB300+8xA100", "gpu", ["B300"]),
    ("0xA100", "cluster", ["no GPUs"]),
    ("2x0xA100", "cluster", ["no GPUs"]),
    ("0x8xA100", "cluster", ["no GPUs"]),
    ("8xA100+", "cluster", [FORMS_HINT, "preset", "YAML"]),
    ("8x", "cluster", [FORMS_HINT]),
    ("A100", "cluster", [FORMS_HINT]),
    ("dgx-a100-2nod", "cluster", ["dgx-a100-2node"]),
    ("", "cluster", [FORMS_HINT]),
    ("missing.yaml", "cluster", ["not found"]),
    ("no/such/dir/c.yml", "cluster", ["not found"]),
])
def test_bad_specs(spec, field, words):
    with pytest.raises(AutoparError) as e:
        load_cluster(spec)
    assert e.value.field == field
    for w in words:
        assert w in str(e.value)
    assert "\n" not in str(e.value)


BAD_FILES = [
    ("nodes:\n  - {gpu: A100, count: 8\n  - {gpu: A100, count: 8}\n", "c.yaml:3", "malformed YAML"),
    ("nodes:\n  - {gpu: B300, count: 8}\n", "nodes[0].gpu", "B300"),
    ("nodes:\n  - {gpu: A100, count: 8}\n  - {gpu: A100, count: 0}\n", "nodes[1].count", "at least 1"),
    ("nodes:\n  - {gpu: A100, count: '8'}\n", "nodes[0].count", "expected an integer"),
    ("nodes:\n  - {gpu: A100, count: 8, repeat: 0}\n", "nodes[0].repeat", "at least 1"),
    ("nodes:\n  - {gpu: A100}\n", "nodes[0].count", "missing"),
    ("nodes: []\n", "nodes", "is empty"),
    ("nodes:\n  - {gpu: A100, count: 8, gpus: 3}\n", "nodes[0].gpus", "not a node field"),
    ("nodes: [{gpu: A100, count: 8, repeat: 2}]\ninter_bw_gbps: 0\n", "inter_bw_gbps", "> 0"),
    ("nodes: [{gpu: A100, count: 8, repeat: 2}]\ninter_bw_gbps: -5\n", "inter_bw_gbps", "> 0"),
    ("nodes: [{gpu: A100, count: 8, repeat: 2}]\ninter_lat_us: -1\n", "inter_lat_us", ">= 0"),
    ("nodes: [{gpu: A100, count: 8, intra_bw_gbps: 0}]\n", "nodes[0].intra_bw_gbps", "> 0"),
    ("nodes: [{gpu: A100, count: 8, repeat: 3}]\nbw_matrix_gbps: [[0, 1], [1, 0]]\n", "bw_matrix_gbps", "3x3"),
    ("nodes: [{gpu: A100, count: 8, repeat: 2}]\nbw_matrix_gbps: [[0, 1, 2], [1, 0]]\n", "bw_matrix_gbps", "2x2"),
    ("nodes: [{gpu: A100, count: 8, repeat: 2}]\nbw_matrix_gbps: [[0, 0], [1, 0]]\n", "bw_matrix_gbps[0][1]", "> 0"),
    ("nodes: [{gpu: A100, count: 8, repeat: 2}]\nlat_matrix_us: [[0, 1], [1]]\n", "lat_matrix_us", "2x2"),
    ("nodes: [{gpu: A100, count: 8}]\ninter_bw: 3\n", "inter_bw", "inter_bw_gbps"),
    ("spec: 8xA100\nnodes: [{gpu: A100, count: 8}]\n", "nodes", "either"),
    ("inter_bw_gbps: 3\n", "nodes", "either"),
    ("spec: 8xZ9\n", "gpu", "Z9"),
    ("- {gpu: A100, count: 8}\n", "c.yaml", "mapping"),
    ("gpus: {X: {memory_gib: 8, hbm_gbps: 100}}\nnodes: [{gpu: X, count: 2}]\n", "gpus.X.tflops", "missing"),
    ("nodes:\n  - {gpu: A100, count: 8, zone: a}\n  - {gpu: A100, count: 8, zone: b}\n"
     "  - {gpu: A100, count: 8, zone: c}\nzones: {links: [{zones: [a, b], bw_gbps: 1}]}\n", "zones.links", "'c'"),
    ("nodes:\n  - {gpu: A100, count: 8, zone: a}\n  - {gpu: A100, count: 8, zone: b}\n"
     "zones: {links: [{zones: [a, bb], bw_gbps: 1}]}\n", "zones.links", "has no nodes"),
    ("nodes:\n  - {gpu: A100, count: 8, zone: a}\n  - {gpu: A100, count: 8, zone: b}\n"
     "zones: {links: [{zones: [a, b], bw_gbps: 0}]}\n", "zones.links[0].bw_gbps", "> 0"),
    ("nodes:\n  - {gpu: A100, count: 8, zone: a}\n  - {gpu: A100, count: 8, zone: b}\n"
     "zones: {links: [{zones: [a, b], bw_gbps: 1}]}\nbw_matrix_gbps: [[0, 1], [1, 0]]\n", "zones", "cannot be combined"),
]


@pytest.mark.parametrize("text,field,words", BAD_FILES)
def test_bad_files(tmp_path, text, field, words):
    p = write(tmp_path, text)
    with pytest.raises(AutoparError) as e:
        load_cluster(p)
    assert field in e.value.field, str(e.value)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_yaml_latency_alone_keeps_per_pair_default_bandwidth(tmp_path):
    p = write(tmp_path, "nodes:\n  - {gpu: A100, count: 8, repeat: 2}\n  - {gpu: 4090, count: 8}\ninter_lat_us: 7\n")
    c = load_cluster(tmp_path / "c.yaml")  # a Path works too
    assert c.name == p
    assert c.node_link(0, 1) == approx((200 * GB, 7e-6))
    assert c.node_link(1, 2) == approx((12.5 * GB, 7e-6))
