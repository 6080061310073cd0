"""``--cluster`` values into Cluster objects: preset names, inline specs and YAML files.

Inline spec: terms joined by ``+``, each ``[NODES x] COUNT x GPU``:
  ``8xA100-80G`` one node of 8; ``2x8xA100-80G`` two nodes of 8; ``4xcpu`` four CPU processes on
  one machine; ``8x3090+8x4090+8xA100`` three nodes of different types. Without NODES a term
  fills nodes of the GPU's default size (8 for GPUs, all in one for cpu): ``24x4090`` is 3 nodes.
Nodes and network not given take the catalogue defaults of each GPU's class (catalogue.yaml
``node_classes``); between nodes of different classes the slower NIC and the larger latency apply.

Cluster file (YAML), also the schema of every preset in presets.yaml::

  gpus:            # optional custom GPU types, catalogue fields (memory_gib, tflops, hbm_gbps, ...)
    MyGPU: {memory_gib: 32, tflops: 100, hbm_gbps: 1000, class: pcie}
  nodes:           # or spec: 2x8xA100-80G
    - {gpu: A100, count: 8, repeat: 4, intra_bw_gbps: 300, intra_lat_us: 3, zone: east, name: a}
  inter_bw_gbps: 25        # one value for every node pair ...
  inter_lat_us: 5
  bw_matrix_gbps: [[...]]  # ... or node x node matrices (diagonal ignored) ...
  lat_matrix_us: [[...]]
  zones:                   # ... or per zone pair; node pairs inside a zone use inter_*
    links: [{zones: [east, west], bw_gbps: 1.25, lat_us: 30000}]
    default: {bw_gbps: 0.5, lat_us: 80000}   # optional: zone pairs not listed

A node's ``gpu`` may also be a mapping with ``name`` and GPU fields (what Cluster.to_dict writes).
``description`` is free text; a ``name`` key is accepted (to_dict writes one) but the Cluster's
name is always the spec string as given (preset name, inline spec or file path), so a plan that
records it can load the same cluster again.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from pathlib import Path

import yaml

from autopar.cluster import catalogue
from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.errors import AutoparError

PRESETS_PATH = Path(__file__).with_name("presets.yaml")
DOC_KEYS = ("name", "description", "spec", "gpus", "nodes", "inter_bw_gbps", "inter_lat_us",
            "bw_matrix_gbps", "lat_matrix_us", "zones")
NODE_KEYS = ("gpu", "count", "repeat", "intra_bw_gbps", "intra_lat_us", "zone", "name")
FORMS = ("use a preset (`autopar list clusters`), an inline spec [NODESx]COUNTxGPU joined by + "
         "(8xA100-80G, 2x8xA100-80G, 4xcpu, 8x3090+8x4090+8xA100), or a YAML file path")
TERM = re.compile(r"^(?:(\d+)[xX])?(\d+)[xX]([A-Za-z0-9][A-Za-z0-9_.\-]*)$")


# -- small validators ---------------------------------------------------------------------------
def _num(value, where: str, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AutoparError(where, f"must be a number, got {value!r}", "give a plain number")
    if value != value or value < 0 or (positive and value == 0):  # value != value: NaN
        what = "bandwidth must be > 0" if positive else "must be >= 0"
        raise AutoparError(where, f"is {value}", f"{what}; give GB/s for bandwidths, microseconds for latencies")
    return float(value)


def _int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AutoparError(where, f"must be a whole number, got {value!r}", "give an integer such as 8")
    if value < 1:
        raise AutoparError(where, f"must be at least 1, got {value}", "give the node at least one GPU, or remove it")
    return value


def _matrix(value, n: int, where: str, positive: bool) -> list[list[float]]:
    if not isinstance(value, list) or len(value) != n or any(not isinstance(r, list) or len(r) != n for r in value):
        shape = f"{len(value)} rows" if isinstance(value, list) else type(value).__name__
        raise AutoparError(where, f"must be {n}x{n} (one row and column per node), got {shape}",
                           "give one value per node pair, nodes in file order (repeats expanded)")
    return [[_num(x, f"{where}[{i}][{j}]", positive) if i != j else _num(x, f"{where}[{i}][{j}]", False)
             for j, x in enumerate(row)] for i, row in enumerate(value)]


# -- inline specs -------------------------------------------------------------------------------
def _inline_nodes(spec: str) -> list[Node] | None:
    """Nodes of an inline spec with default links, or None when ``spec`` is not inline-shaped."""
    terms = spec.replace(" ", "").split("+")
    matches = [TERM.match(t) for t in terms]
    if not all(matches):
        return None
    nodes: list[Node] = []
    for term, m in zip(terms, matches):
        n_nodes, count, name = m.group(1), int(m.group(2)), m.group(3)
        if count < 1 or (n_nodes is not None and int(n_nodes) < 1):
            raise AutoparError("cluster", f"term {term!r} has no GPUs", "counts must be at least 1, e.g. 2x8xA100-80G")
        gpu = catalogue.gpu(name)
        d = catalogue.node_defaults(gpu)
        if n_nodes is not None:
            sizes = [count] * int(n_nodes)
        else:
            per = d.gpus_per_node or count
            sizes = [per] * (count // per) + ([count % per] if count % per else [])
        for size in sizes:
            nodes.append(Node(gpu=gpu, count=size, intra_bw_gbps=d.intra_bw_gbps, intra_lat_us=d.intra_lat_us,
                              name=f"node{len(nodes)}"))
    return nodes


def _default_network(nodes: list[Node], defaults: list[catalogue.NodeDefaults]) -> dict:
    """inter_bw_gbps / inter_lat_us, plus matrices when node pairs differ (slower NIC, larger latency)."""
    bws = [d.inter_bw_gbps for d in defaults]
    lats = [d.inter_lat_us for d in defaults]
    out: dict = {"inter_bw_gbps": min(bws), "inter_lat_us": max(lats)}
    n = len(nodes)
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    if len({(min(bws[a], bws[b]), max(lats[a], lats[b])) for a, b in pairs}) > 1:
        out["bw_matrix_gbps"] = [[min(bws[a], bws[b]) for b in range(n)] for a in range(n)]
        out["lat_matrix_us"] = [[max(lats[a], lats[b]) for b in range(n)] for a in range(n)]
    return out


# -- cluster documents (files and presets) ------------------------------------------------------
def _custom_gpus(doc: dict, where: str) -> dict[str, tuple[GPUType, str, dict]]:
    gpus = doc.get("gpus") or {}
    if not isinstance(gpus, dict):
        raise AutoparError(f"{where}gpus", "must map GPU names to their fields", "e.g. gpus: {MyGPU: {memory_gib: 24, ...}}")
    return {catalogue.normalize(str(k)): catalogue.gpu_from_entry(str(k), v, f"{where}gpus.{k}") for k, v in gpus.items()}


def _resolve_gpu(value, custom: dict, where: str) -> tuple[GPUType, catalogue.NodeDefaults]:
    if isinstance(value, dict):
        if "name" not in value:
            raise AutoparError(f"{where}.name", "is missing", "give the inline GPU a name")
        gpu, cls, over = catalogue.gpu_from_entry(str(value["name"]), value, where)
        return gpu, catalogue.node_defaults(gpu, cls, over)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # `gpu: 4090` reads as a number in YAML
    if not isinstance(value, str):
        raise AutoparError(where, f"must be a GPU name or mapping, got {value!r}", "e.g. gpu: A100-80G")
    key = catalogue.normalize(value)
    if key in custom:
        gpu, cls, over = custom[key]
        return gpu, catalogue.node_defaults(gpu, cls, over)
    gpu = catalogue.gpu(value, field=where)
    return gpu, catalogue.node_defaults(gpu)


def _doc_nodes(doc: dict, where: str) -> tuple[list[Node], list[catalogue.NodeDefaults]]:
    if ("spec" in doc) == ("nodes" in doc):
        raise AutoparError(f"{where}nodes", "give either nodes: or spec:, not both or neither",
                           "e.g. spec: 2x8xA100-80G, or nodes: [{gpu: A100, count: 8, repeat: 2}]")
    if "spec" in doc:
        nodes = _inline_nodes(str(doc["spec"]))
        if nodes is None:
            raise AutoparError(f"{where}spec", f"cannot read {doc['spec']!r}", "give [NODESx]COUNTxGPU terms joined by +")
        return nodes, [catalogue.node_defaults(nd.gpu) for nd in nodes]
    raw = doc["nodes"]
    if not isinstance(raw, list) or not raw:
        raise AutoparError(f"{where}nodes", "must be a non-empty list of nodes", "e.g. nodes: [{gpu: A100, count: 8}]")
    custom = _custom_gpus(doc, where)
    nodes: list[Node] = []
    defaults: list[catalogue.NodeDefaults] = []
    for i, nd in enumerate(raw):
        at = f"{where}nodes[{i}]"
        if not isinstance(nd, dict):
            raise AutoparError(at, f"must be a mapping, got {nd!r}", "e.g. {gpu: A100, count: 8}")
        bad = sorted(set(nd) - set(NODE_KEYS))
        if bad:
            raise AutoparError(f"{at}.{bad[0]}", "is not a node field", f"use {', '.join(NODE_KEYS)}")
        if "gpu" not in nd or "count" not in nd:
            raise AutoparError(f"{at}.{'gpu' if 'gpu' not in nd else 'count'}", "is missing",
                               "every node needs gpu and count")
        gpu, d = _resolve_gpu(nd["gpu"], custom, f"{at}.gpu")
        count = _int(nd["count"], f"{at}.count")
        repeat = _int(nd.get("repeat", 1), f"{at}.repeat")
        intra = _num(nd["intra_bw_gbps"], f"{at}.intra_bw_gbps") if "intra_bw_gbps" in nd else d.intra_bw_gbps
        lat = _num(nd["intra_lat_us"], f"{at}.intra_lat_us", False) if "intra_lat_us" in nd else d.intra_lat_us
        for k in range(repeat):
            name = str(nd.get("name", f"node{len(nodes)}"))
            if "name" in nd and repeat > 1:
                name = f"{name}-{k}"
            nodes.append(Node(gpu=gpu, count=count, intra_bw_gbps=intra, intra_lat_us=lat,
                              zone=str(nd.get("zone", "default")), name=name))
            defaults.append(d)
    return nodes, defaults


def _zone_matrices(zones, nodes: list[Node], bwm: list, latm: list, lat: float, where: str) -> tuple[list, list]:
    """Node x node matrices from per-zone-pair links over the base matrices ``bwm`` / ``latm``
    (pairs inside one zone keep them); ``lat`` is the latency of a link that gives none."""
    if not isinstance(zones, dict) or set(zones) - {"links", "default"}:
        raise AutoparError(f"{where}zones", "must be a mapping with links: (and optionally default:)",
                           "e.g. zones: {links: [{zones: [east, west], bw_gbps: 1.25, lat_us: 30000}]}")
    links: dict[frozenset, tuple[float, float]] = {}
    for i, link in enumerate(zones.get("links") or []):
        at = f"{where}zones.links[{i}]"
        pair = link.get("zones") if isinstance(link, dict) else None
        if not isinstance(pair, list) or len(pair) != 2:
            raise AutoparError(f"{at}.zones", f"must name two zones, got {pair!r}", "e.g. zones: [east, west]")
        if "bw_gbps" not in link:
            raise AutoparError(f"{at}.bw_gbps", "is missing", "give the bandwidth between the zones in GB/s")
        links[frozenset(map(str, pair))] = (_num(link["bw_gbps"], f"{at}.bw_gbps"),
                                            _num(link.get("lat_us", lat), f"{at}.lat_us", False))
    default = zones.get("default")
    if default is not None:
        if not isinstance(default, dict) or "bw_gbps" not in default:
            raise AutoparError(f"{where}zones.default", "needs bw_gbps (and lat_us)", "e.g. default: {bw_gbps: 1, lat_us: 50000}")
        default = (_num(default["bw_gbps"], f"{where}zones.default.bw_gbps"),
                   _num(default.get("lat_us", lat), f"{where}zones.default.lat_us", False))
    known = {z for pair in links for z in pair}
    node_zones = {nd.zone for nd in nodes}
    strays = sorted(known - node_zones)
    if strays:
        raise AutoparError(f"{where}zones.links", f"zone {strays[0]!r} has no nodes",
                           f"check the spelling; the nodes' zones are {', '.join(sorted(node_zones))}")
    for nd in nodes:
        if nd.zone not in known and default is None and len(node_zones) > 1:
            raise AutoparError(f"{where}zones.links", f"no link names zone {nd.zone!r} (node {nd.name})",
                               "add a link for every zone pair, or a zones.default")
    n = len(nodes)
    bwm, latm = [list(r) for r in bwm], [list(r) for r in latm]
    for a in range(n):
        for b in range(n):
            za, zb = nodes[a].zone, nodes[b].zone
            key = frozenset((za, zb))
            if key in links:
                bwm[a][b], latm[a][b] = links[key]
            elif za != zb:
                if default is None:
                    raise AutoparError(f"{where}zones.links", f"zones {za!r} and {zb!r} have no link",
                                       "add {zones: [" + f"{za}, {zb}" + "], bw_gbps: ..., lat_us: ...} or a zones.default")
                bwm[a][b], latm[a][b] = default
    return bwm, latm


def cluster_from_doc(doc, name: str, where: str = "") -> Cluster:
    """A Cluster from a cluster document (parsed YAML of a file or preset), named ``name``.

    ``where`` prefixes every field named in an error (e.g. ``my.yaml:``).
    """
    if not isinstance(doc, dict):
        raise AutoparError(where.rstrip(":") or "cluster", "must be a mapping with nodes: or spec:",
                           "see the cluster file format in autopar/cluster/parse.py")
    bad = sorted(set(doc) - set(DOC_KEYS))
    if bad:
        close = difflib.get_close_matches(bad[0], DOC_KEYS, n=1)
        raise AutoparError(f"{where}{bad[0]}", "is not a cluster field",
                           (f"did you mean {close[0]}? " if close else "") + f"use {', '.join(DOC_KEYS)}")
    nodes, defaults = _doc_nodes(doc, where)
    net = _default_network(nodes, defaults)
    n = len(nodes)
    if "zones" in doc and ("bw_matrix_gbps" in doc or "lat_matrix_us" in doc):
        raise AutoparError(f"{where}zones", "cannot be combined with bw_matrix_gbps / lat_matrix_us",
                           "give either per-zone links or node matrices")
    # each given value replaces its default (a scalar drops the default per-pair matrix too)
    for scalar, mat, positive in (("inter_bw_gbps", "bw_matrix_gbps", True), ("inter_lat_us", "lat_matrix_us", False)):
        if scalar in doc:
            net[scalar] = _num(doc[scalar], f"{where}{scalar}", positive)
            net.pop(mat, None)
        if mat in doc:
            net[mat] = _matrix(doc[mat], n, f"{where}{mat}", positive)
    if "zones" in doc:
        net["bw_matrix_gbps"], net["lat_matrix_us"] = _zone_matrices(
            doc["zones"], nodes, net.get("bw_matrix_gbps") or [[net["inter_bw_gbps"]] * n for _ in range(n)],
            net.get("lat_matrix_us") or [[net["inter_lat_us"]] * n for _ in range(n)], net["inter_lat_us"], where)
    return Cluster(nodes=nodes, name=name, **net)


# -- presets and files --------------------------------------------------------------------------
@functools.cache
def _presets() -> dict[str, dict]:
    with open(PRESETS_PATH) as f:
        return {str(k): v for k, v in yaml.safe_load(f).items()}


def preset_names() -> list[str]:
    """Preset cluster names in presets.yaml order."""
    return list(_presets())


def preset_description(name: str) -> str:
    """The one-line description (and assumptions) of a preset."""
    return str(_presets()[_preset_key(name) or name].get("description", ""))


def _preset_key(spec: str) -> str | None:
    folded = {k.lower().replace(" ", ""): k for k in _presets()}
    return folded.get(spec.lower().replace(" ", ""))


def _load_file(path: str) -> Cluster:
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise AutoparError(at, f"malformed YAML ({problem})", "fix the syntax at that line") from None
    except OSError as e:
        raise AutoparError("cluster", f"cannot read {path!r} ({e.strerror})", "check the path and permissions") from None
    return cluster_from_doc(doc, name=path, where=f"{path}:")


def load_cluster(spec: str) -> Cluster:
    """The Cluster for a ``--cluster`` value: an existing YAML file, a preset name, or an inline spec.

    Every bad input raises AutoparError naming the field: unknown GPU, a node without GPUs, a
    bandwidth <= 0, a malformed spec or YAML (with file and line), a matrix of the wrong shape, a
    missing file.
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise AutoparError("cluster", f"is empty ({spec!r})", FORMS)
    spec = spec.strip()
    if spec.lower().endswith((".yaml", ".yml", ".json")) or os.sep in spec:
        if not os.path.isfile(spec):
            raise AutoparError("cluster", f"file {spec!r} not found", f"check the path, or {FORMS}")
        return _load_file(spec)
    key = _preset_key(spec)
    if key is not None:
        return cluster_from_doc(_presets()[key], name=key, where=f"preset {key}: ")
    nodes = _inline_nodes(spec)
    if nodes is None and os.path.isfile(spec):  # a cluster file named without an extension
        return _load_file(spec)
    if nodes is None:
        close = difflib.get_close_matches(spec.lower(), [k.lower() for k in _presets()], n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise AutoparError("cluster", f"cannot read {spec!r}", hint + FORMS)
    return Cluster(nodes=nodes, name=spec, **_default_network(nodes, [catalogue.node_defaults(nd.gpu) for nd in nodes]))


# -- descriptions -------------------------------------------------------------------------------
def _fmt_lat(us: float) -> str:
    return f"{us / 1000:g} ms" if us >= 1000 else f"{us:g} us"


def _span(values: list[float], fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"


def describe_cluster(c: Cluster) -> str:
    """One line for ``autopar list clusters``: name, devices, types, memory, network."""
    counts: dict[str, int] = {}
    for nd in c.nodes:
        counts[nd.gpu.name] = counts.get(nd.gpu.name, 0) + nd.count
    types = " + ".join(f"{k}x{name}" for name, k in counts.items())
    mem = sum(nd.gpu.memory_gib * nd.count for nd in c.nodes)
    intra = _span([nd.intra_bw / 1e9 for nd in c.nodes], lambda v: f"{v:g}") + " GB/s"
    if c.num_nodes == 1:
        net = "single node"
    else:
        pairs = [c.node_link(a, b) for a in range(c.num_nodes) for b in range(c.num_nodes) if a != b]
        net = (f"inter {_span([bw / 1e9 for bw, _ in pairs], lambda v: f'{v:g}')} GB/s, "
               f"{_span([lat * 1e6 for _, lat in pairs], _fmt_lat)}")
        if c.bw_matrix_gbps is not None or c.lat_matrix_us is not None:
            net += " (per node pair)"
    return (f"{c.name or c.describe()}: {c.num_devices} devices, {c.num_nodes} node{'s' * (c.num_nodes > 1)}, "
            f"{types}, {mem:g} GiB, intra {intra}, {net}")
