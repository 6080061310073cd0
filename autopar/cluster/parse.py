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
    # optional per-precision dense peaks: tflops_fp32, tflops_tf32, tflops_fp8 (absent: that precision
    # is refused on the GPU, one line naming the field)
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

A plan's ``cluster:`` block is the same document read standalone (``cluster_from_doc(...,
standalone=True)``): its GPUs are listed in it (``gpus:`` or inline, never looked up in the
catalogue), it has no ``spec:``, it keeps its ``name`` and a ``meta`` mapping, and what it leaves out
takes the Cluster's own defaults: a node without ``intra_bw_gbps`` uses its GPU's own fabric, one
without ``name`` is unnamed, and ``repeat: k`` is k equal nodes. Every GPU mapping, in the
catalogue, a cluster file or a plan, is read by ``catalogue.gpu_from_entry`` with one set of defaults.
Every field is read by ``autopar.fields``: errors are one line naming the field and the fix.
"""

from __future__ import annotations

import collections
import difflib
import functools
import os
import re
from pathlib import Path

import yaml

from autopar.cluster import catalogue
from autopar.cluster.cluster import Cluster, GPUType, Node, check_size
from autopar.errors import AutoparError
from autopar.fields import Fields, as_list, as_matrix, as_name, as_str, join

PRESETS_PATH = Path(__file__).with_name("presets.yaml")
DOC_KEYS = ("name", "description", "spec", "gpus", "nodes", "inter_bw_gbps", "inter_lat_us",
            "bw_matrix_gbps", "lat_matrix_us", "zones")
NODE_KEYS = ("gpu", "count", "repeat", "intra_bw_gbps", "intra_lat_us", "zone", "name")
# A plan's cluster block: no spec (it lists its nodes), plus the Cluster's meta.
STANDALONE_KEYS = tuple(k for k in DOC_KEYS if k != "spec") + ("meta",)
NET_FIX = "give GB/s for bandwidths, microseconds for latencies"
FORMS = ("use a preset (`autopar list clusters`), an inline spec [NODESx]COUNTxGPU joined by + "
         "(8xA100-80G, 2x8xA100-80G, 4xcpu, 8x3090+8x4090+8xA100), or a YAML file path")
TERM = re.compile(r"^(?:(\d+)[xX])?(\d+)[xX]([A-Za-z0-9][A-Za-z0-9_.\-]*)$")


# -- inline specs -------------------------------------------------------------------------------
def _inline_nodes(spec: str) -> list[Node] | None:
    """Nodes of an inline spec with default links, or None when ``spec`` is not inline-shaped."""
    terms = spec.replace(" ", "").split("+")
    matches = [TERM.match(t) for t in terms]
    if not all(matches):
        return None
    nodes: list[Node] = []
    total = 0
    for term, m in zip(terms, matches):
        n_nodes, count, name = m.group(1), int(m.group(2)), m.group(3)
        if count < 1 or (n_nodes is not None and int(n_nodes) < 1):
            raise AutoparError("cluster", f"term {term!r} has no GPUs", "counts must be at least 1, e.g. 2x8xA100-80G")
        total += count * (1 if n_nodes is None else int(n_nodes))
        check_size("cluster", total)
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
    # The node pairs' links, from the distinct (bw, lat) kinds: quadratic in kinds, not in nodes.
    kinds = collections.Counter(zip(bws, lats))
    pair_links = {(min(a[0], b[0]), max(a[1], b[1])) for a in kinds for b in kinds if a != b or kinds[a] > 1}
    if len(pair_links) > 1:
        check_size("cluster", sum(nd.count for nd in nodes), n)
        out["bw_matrix_gbps"] = [[min(bws[a], bws[b]) for b in range(n)] for a in range(n)]
        out["lat_matrix_us"] = [[max(lats[a], lats[b]) for b in range(n)] for a in range(n)]
    return out


# -- cluster documents (files, presets, a plan's cluster block) --------------------------------------
def _custom_gpus(f: Fields, standalone: bool) -> dict[str, tuple[GPUType, str, dict]]:
    """GPU types defined under ``gpus:``, by lookup key (any spelling in a file, the exact name standalone)."""
    gpus = f.opt_mapping("gpus", {}, fix="map GPU names to their fields, e.g. gpus: {MyGPU: {memory_gib: 24, ...}}")
    key = str if standalone else catalogue.normalize
    return {key(str(k)): catalogue.gpu_from_entry(str(k), v, join(f.at("gpus"), k)) for k, v in gpus.items()}


def _resolve_gpu(value, custom: dict, where: str, gpus_at: str,
                 standalone: bool) -> tuple[GPUType, catalogue.NodeDefaults]:
    """A node's ``gpu`` (inline mapping, ``gpus:`` entry or catalogue name) and its node defaults."""
    if isinstance(value, dict):
        gpu, cls, over = catalogue.gpu_from_entry(None, value, where)
        return gpu, catalogue.node_defaults(gpu, cls, over)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # `gpu: 4090` reads as a number in YAML
    name = as_str(value, where, fix="give a GPU name (gpu: A100-80G) or a mapping with name and GPU fields")
    key = name if standalone else catalogue.normalize(name)
    if key in custom:
        gpu, cls, over = custom[key]
        return gpu, catalogue.node_defaults(gpu, cls, over)
    if standalone:  # a plan's cluster stands alone: its GPUs are listed in it, never looked up
        raise AutoparError(where, f"names GPU {name!r}, which {gpus_at} does not list",
                           f"add {name} under {gpus_at} or give the GPU inline")
    gpu = catalogue.gpu(name, field=where)
    return gpu, catalogue.node_defaults(gpu)


def _doc_nodes(f: Fields, standalone: bool) -> tuple[list[Node], list[catalogue.NodeDefaults]]:
    """The nodes (repeats expanded) and, for files, each node's catalogue defaults."""
    if f.has("spec") == f.has("nodes"):
        raise AutoparError(f.at("nodes"), "give either nodes: or spec:, not both or neither",
                           "e.g. spec: 2x8xA100-80G, or nodes: [{gpu: A100, count: 8, repeat: 2}]")
    if f.has("spec"):
        spec = str(f.raw("spec"))
        nodes = _inline_nodes(spec)
        if nodes is None:
            raise AutoparError(f.at("spec"), f"cannot read {spec!r}", "give [NODESx]COUNTxGPU terms joined by +")
        return nodes, [catalogue.node_defaults(nd.gpu) for nd in nodes]
    raw = as_list(f.raw("nodes"), f.at("nodes"), nonempty=True,
                  fix="give at least one node, e.g. nodes: [{gpu: A100, count: 8}]")
    custom = _custom_gpus(f, standalone)
    nodes: list[Node] = []
    defaults: list[catalogue.NodeDefaults] = []
    total = 0
    for i, rn in enumerate(raw):
        nf = Fields(rn, f"{f.at('nodes')}[{i}]", kind="node", keys=NODE_KEYS)
        gpu, d = _resolve_gpu(nf.raw("gpu", what="a GPU name, e.g. gpu: A100-80G"), custom, nf.at("gpu"),
                              f.at("gpus"), standalone)
        count = nf.req_int("count", low=1)
        repeat = nf.opt_int("repeat", 1, low=1)
        total += count * repeat
        check_size(nf.at("repeat") if repeat > 1 else nf.at("count"), total)
        # Standalone, a field left out takes the Node's own default (intra 0: the GPU's own fabric),
        # exactly what the plan writer leaves out; in a cluster file the catalogue class's default.
        intra = nf.opt_num("intra_bw_gbps", Node.intra_bw_gbps if standalone else d.intra_bw_gbps, gt=0, fix=NET_FIX)
        lat = nf.opt_num("intra_lat_us", Node.intra_lat_us if standalone else d.intra_lat_us, ge=0, fix=NET_FIX)
        zone = as_name(nf.raw("zone", "default"), nf.at("zone"))
        given = nf.raw("name", None)
        given = None if given is None else as_name(given, nf.at("name"), empty=standalone)
        for k in range(repeat):
            if standalone:  # repeat: k equal nodes, names included (what the writer merged)
                name = "" if given is None else str(given)
            else:
                name = f"node{len(nodes)}" if given is None else f"{given}-{k}" if repeat > 1 else str(given)
            nodes.append(Node(gpu=gpu, count=count, intra_bw_gbps=intra, intra_lat_us=lat, zone=zone, name=name))
            defaults.append(d)
    return nodes, defaults


def _zone_matrices(z: Fields, nodes: list[Node], bwm: list, latm: list, lat: float) -> tuple[list, list]:
    """Node x node matrices from per-zone-pair links over the base matrices ``bwm`` / ``latm``
    (pairs inside one zone keep them); ``lat`` is the latency of a link that gives none."""
    links: dict[frozenset, tuple[float, float]] = {}
    for i, link in enumerate(z.opt_list("links", [])):
        lf = Fields(link, f"{z.at('links')}[{i}]", kind="zone link", keys=("zones", "bw_gbps", "lat_us"))
        pair = lf.raw("zones", what="the two zones it joins, e.g. zones: [east, west]")
        if not isinstance(pair, list) or len(pair) != 2:
            raise AutoparError(lf.at("zones"), f"must name two zones, got {pair!r}", "e.g. zones: [east, west]")
        links[frozenset(map(str, pair))] = (lf.req_num("bw_gbps", gt=0, fix=NET_FIX),
                                            lf.opt_num("lat_us", lat, ge=0, fix=NET_FIX))
    default = None
    if z.has("default"):
        df = z.sub("default", kind="zone default", keys=("bw_gbps", "lat_us"))
        default = (df.req_num("bw_gbps", gt=0, fix=NET_FIX), df.opt_num("lat_us", lat, ge=0, fix=NET_FIX))
    known = {zn for pair in links for zn in pair}
    node_zones = {nd.zone for nd in nodes}
    strays = sorted(known - node_zones)
    if strays:
        raise AutoparError(z.at("links"), f"zone {strays[0]!r} has no nodes",
                           f"check the spelling; the nodes' zones are {', '.join(sorted(node_zones))}")
    for nd in nodes:
        if nd.zone not in known and default is None and len(node_zones) > 1:
            raise AutoparError(z.at("links"), f"no link names zone {nd.zone!r} (node {nd.name})",
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
                    raise AutoparError(z.at("links"), f"zones {za!r} and {zb!r} have no link",
                                       "add {zones: [" + f"{za}, {zb}" + "], bw_gbps: ..., lat_us: ...} or a zones.default")
                bwm[a][b], latm[a][b] = default
    return bwm, latm


def cluster_from_doc(doc: object, name: str | None, where: str = "", *, standalone: bool = False) -> Cluster:
    """A Cluster from a cluster document (parsed YAML of a file, a preset, or a plan's ``cluster:`` block).

    ``name``: the Cluster's name (None: the document's ``name``). ``where`` prefixes every field named
    in an error (``my.yaml:``, or ``cluster`` for a plan's block). ``standalone`` reads a plan's block:
    GPUs only from the document (no catalogue), a ``meta`` mapping, and fields left out take the
    Cluster's and Node's own defaults rather than the catalogue's; GPU fields are read by
    ``catalogue.gpu_from_entry`` either way.
    """
    f = Fields(doc, where, kind="cluster", keys=STANDALONE_KEYS if standalone else DOC_KEYS)
    nodes, defaults = _doc_nodes(f, standalone)
    # Standalone: the Cluster's own defaults (what the plan reader has always used).
    net = ({"inter_bw_gbps": Cluster.inter_bw_gbps, "inter_lat_us": Cluster.inter_lat_us} if standalone
           else _default_network(nodes, defaults))
    n = len(nodes)
    if f.has("zones") and (f.has("bw_matrix_gbps") or f.has("lat_matrix_us")):
        raise AutoparError(f.at("zones"), "cannot be combined with bw_matrix_gbps / lat_matrix_us",
                           "give either per-zone links or node matrices")
    # each given value replaces its default (a scalar drops the default per-pair matrix too)
    for scalar, mat, bound in (("inter_bw_gbps", "bw_matrix_gbps", {"gt": 0.0}),
                               ("inter_lat_us", "lat_matrix_us", {"ge": 0.0})):
        if f.has(scalar):
            net[scalar] = f.req_num(scalar, **bound, fix=NET_FIX)
            net.pop(mat, None)
        if f.has(mat):
            net[mat] = as_matrix(f.raw(mat), f.at(mat), n, symmetric=True, **bound)
    if f.has("zones"):
        check_size(f.at("zones"), sum(nd.count for nd in nodes), n)
        net["bw_matrix_gbps"], net["lat_matrix_us"] = _zone_matrices(
            f.sub("zones", kind="zones", keys=("links", "default")), nodes,
            net.get("bw_matrix_gbps") or [[net["inter_bw_gbps"]] * n for _ in range(n)],
            net.get("lat_matrix_us") or [[net["inter_lat_us"]] * n for _ in range(n)], net["inter_lat_us"])
    doc_name = as_name(f.raw("name", ""), f.at("name"), free=True, empty=True)
    f.opt_str("description", "")
    meta = f.opt_mapping("meta", {}) if standalone else {}
    return Cluster(nodes=nodes, name=doc_name if name is None else name, meta=meta, **net)


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
    spec = as_name(spec.strip(), "cluster", free=True)
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
