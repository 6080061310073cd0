"""Reading plan dicts back into Plan objects: typed fields, and errors that name the field path.

Every error is an AutoparError naming the path as written in the file
(``pipelines[0].stages[1].layers[2].tp``: the third entry of that stage's ``layers`` list).
"""

from __future__ import annotations

import dataclasses
import re

from autopar.cluster.cluster import Cluster, GPUType, cluster_from_dict
from autopar.errors import AutoparError
from autopar.plan.schema import PLAN_VERSION, SCHEDULES, ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy

VERSION_KEY = "autopar_plan"
_RANGE = re.compile(r"^(?P<prefix>.*?)(?P<a>\d+)-(?P=prefix)(?P<b>\d+)$")
_GPU_KEYS = {f.name for f in dataclasses.fields(GPUType)}


def plan_from_dict(d: dict) -> Plan:
    """Inverse of ``plan_to_dict``; rejects unknown versions, missing keys and wrong types by field path."""
    if not isinstance(d, dict):
        raise AutoparError("plan", f"is {_kind(d)}, not a mapping", "give a plan file written by autopar search")
    if VERSION_KEY not in d:
        raise AutoparError(VERSION_KEY, "is missing, so this is not an autopar plan",
                           f"write plans with autopar search (they start with '{VERSION_KEY}: {PLAN_VERSION}')")
    top = _Fields(d, "")
    version = top.int(VERSION_KEY, low=1)
    if version > PLAN_VERSION:
        raise AutoparError(VERSION_KEY, f"plan format {version} is newer than this autopar reads ({PLAN_VERSION})",
                           "upgrade autopar, or write the plan again with this version")
    m = _Fields(top.req("model", dict), "model")
    model = ModelRef(name=m.str("name"), seq_len=m.int("seq_len", low=1), num_layers=m.int("layers", low=1),
                     source=m.str("source", default=""))
    m.done()
    cluster = _cluster_in(top.req("cluster", dict), "cluster")
    gbs = top.int("global_batch_size", low=1)
    schedule = top.str("schedule", default="1f1b")
    if schedule not in SCHEDULES:
        raise AutoparError("schedule", f"unknown schedule {schedule!r}", f"use one of {', '.join(SCHEDULES)}")
    budget = top.num("memory_budget_gib", default=None)
    if budget is not None and budget <= 0:
        raise AutoparError("memory_budget_gib", f"must be positive, got {budget}", "give GiB per device, or omit it")
    raw_pipes = top.req("pipelines", list)
    if not raw_pipes:
        raise AutoparError("pipelines", "is empty", "give at least one pipeline")
    pipelines = [_pipeline_in(p, f"pipelines[{i}]") for i, p in enumerate(raw_pipes)]
    predicted = top.req("predicted", dict, default={})
    search = top.req("search", dict, default={})
    top.done()
    return Plan(model=model, cluster=cluster, global_batch_size=gbs, pipelines=pipelines, schedule=schedule,
                memory_budget_gib=budget, predicted=predicted, search=search, version=version)


def _kind(x) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "empty"}.get(type(x), type(x).__name__)


_TYPE_WORDS = {int: "an integer", str: "a string", list: "a list", dict: "a mapping", bool: "true or false"}


class _Fields:
    """Typed access to one mapping of the file; every error names ``path.key`` and what to write."""

    def __init__(self, d, path: str) -> None:
        if not isinstance(d, dict):
            raise AutoparError(path or "plan", f"is {_kind(d)}, expected a mapping", "write key: value pairs here")
        self.d, self.path, self.seen = d, path, set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, default, what: str):
        self.seen.add(key)
        if key in self.d and self.d[key] is not None:
            return self.d[key], True
        if default is ...:
            raise AutoparError(self.at(key), "is missing", f"add '{key}:' with {what}")
        return default, False

    def req(self, key: str, kind: type, default=...):
        v, given = self._get(key, default, _TYPE_WORDS[kind])
        if given and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
            raise AutoparError(self.at(key), f"is {_kind(v)} ({v!r}), expected {_TYPE_WORDS[kind]}",
                               f"write {key} as {_TYPE_WORDS[kind]}")
        return v

    def int(self, key: str, low: int = 0, default=...) -> int:
        v = self.req(key, int, default)
        if key in self.d and v is not None and v < low:
            raise AutoparError(self.at(key), f"must be at least {low}, got {v}", f"give an integer >= {low}")
        return v

    def num(self, key: str, default=...) -> float | None:
        v, given = self._get(key, default, "a number")
        if not given:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise AutoparError(self.at(key), f"is {_kind(v)} ({v!r}), expected a number", f"write {key} as a number")
        return float(v)

    def str(self, key: str, default=...) -> str:
        return self.req(key, str, default)

    def done(self) -> None:
        extra = [k for k in self.d if k not in self.seen]
        if extra:
            raise AutoparError(self.at(str(extra[0])), "is not a known key here",
                               f"remove it or fix its spelling (known: {', '.join(sorted(self.seen))})")


def _pipeline_in(raw, path: str) -> Pipeline:
    f = _Fields(raw, path)
    share = f.int("batch_share", low=1)
    mbs = f.int("micro_batch_size", low=1)
    nmb = f.int("num_microbatches", low=1)
    stages = []
    for si, rs in enumerate(f.req("stages", list)):
        sf = _Fields(rs, f"{path}.stages[{si}]")
        devices = _devices_in(sf.d.get("devices"), sf.at("devices"))
        sf.seen.add("devices")
        layers: list[StageLayer] = []
        for li, entry in enumerate(sf.req("layers", list)):
            layers.extend(_layer_entry_in(entry, f"{sf.at('layers')}[{li}]"))
        sf.done()
        stages.append(Stage(devices=devices, layers=layers))
    f.done()
    return Pipeline(batch_share=share, micro_batch_size=mbs, num_microbatches=nmb, stages=stages)


def _layer_entry_in(raw, path: str) -> list[StageLayer]:
    f = _Fields(raw, path)
    if ("name" in f.d) == ("names" in f.d):
        raise AutoparError(path, "needs exactly one of 'name' (one unit) or 'names' (a range P0-P15 or a list)",
                           "write name: embed, or names: layers.0-layers.15")
    if "name" in f.d:
        names = [f.str("name")]
    else:
        f.seen.add("names")
        raw_names = f.d["names"]
        if isinstance(raw_names, str):
            names = _expand_range(raw_names, f.at("names"))
        elif isinstance(raw_names, list) and raw_names and all(isinstance(n, str) for n in raw_names):
            names = list(raw_names)
        else:
            raise AutoparError(f.at("names"), f"is {_kind(raw_names)}, expected a range like layers.0-layers.15 "
                               "or a list of unit names", "write names: P<a>-P<b> or names: [a, b]")
    tp, zero, ckpt = f.int("tp", low=1), f.int("zero"), f.str("ckpt")
    sp = f.req("sp", bool, default=False)
    f.done()
    try:
        strategy = Strategy(tp=tp, zero=zero, ckpt=ckpt, sp=sp)
    except AutoparError as e:  # re-aim the schema's error at this entry of the file
        raise AutoparError(f"{path}.{e.field.rsplit('.', 1)[-1]}", e.problem, e.fix) from e
    return [StageLayer(n, strategy) for n in names]


def _expand_range(text: str, path: str) -> list[str]:
    """``layers.0-layers.3`` -> [layers.0, layers.1, layers.2, layers.3]."""
    m = _RANGE.match(text)
    if m is None:
        raise AutoparError(path, f"{text!r} is not a range P<a>-P<b> with one prefix P on both sides",
                           "write e.g. layers.0-layers.15, or list the units with name: one entry each")
    a, b = m["a"], m["b"]
    if any(len(x) > 1 and x[0] == "0" for x in (a, b)):
        raise AutoparError(path, f"{text!r}: numbers with leading zeros are not ranges",
                           "list such units one by one with name:")
    if int(b) < int(a):
        raise AutoparError(path, f"{text!r} runs backwards ({a} > {b})", f"write {m['prefix']}{b}-{m['prefix']}{a} "
                           "if you mean those units, in model order")
    return [f"{m['prefix']}{k}" for k in range(int(a), int(b) + 1)]


def _devices_in(raw, path: str) -> list[int]:
    """A list of ints, or a string of ranges and ids like ``0-7`` or ``0-3,8-11``."""
    if isinstance(raw, list):
        for i, x in enumerate(raw):
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                raise AutoparError(f"{path}[{i}]", f"is {x!r}, expected a device id (integer >= 0)",
                                   "list global device ids, e.g. [0, 1, 2, 3]")
        return list(raw)
    if isinstance(raw, str):
        out: list[int] = []
        for part in raw.replace(" ", "").split(","):
            lo, sep, hi = part.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()) or (sep and int(hi) < int(lo)):
                raise AutoparError(path, f"{raw!r} is not a device range", "write e.g. 0-7, 0-3,8-11, or a list")
            out.extend(range(int(lo), int(hi if sep else lo) + 1))
        return out
    if raw is None:
        raise AutoparError(path, "is missing", "add 'devices:' with the stage's global device ids, e.g. 0-7")
    raise AutoparError(path, f"is {_kind(raw)} ({raw!r}), expected a list of device ids or a range like 0-7",
                       "write devices: 0-7 or devices: [0, 1, 2, 3]")


def _cluster_in(raw: dict, path: str) -> Cluster:
    """The embedded cluster: the compact form written here, or ``Cluster.to_dict()`` as is."""
    f = _Fields(raw, path)
    gpus = f.req("gpus", dict, default={})
    for gname, spec in gpus.items():
        _check_gpu(spec, f"{path}.gpus.{gname}", with_name=False)
    nodes: list[dict] = []
    raw_nodes = f.req("nodes", list)
    if not raw_nodes:
        raise AutoparError(f.at("nodes"), "is empty", "give at least one node")
    for i, rn in enumerate(raw_nodes):
        npath = f"{f.at('nodes')}[{i}]"
        nf = _Fields(rn, npath)
        gpu = nf.d.get("gpu")
        nf.seen.add("gpu")
        if isinstance(gpu, str):
            if gpu not in gpus:
                raise AutoparError(f"{npath}.gpu", f"names GPU {gpu!r}, which {path}.gpus does not list",
                                   f"add {gpu} under {path}.gpus or give the GPU inline")
            gpu = {"name": gpu, **gpus[gpu]}
        else:
            _check_gpu(gpu, f"{npath}.gpu", with_name=True)
        node = {"gpu": gpu, "count": nf.int("count", low=1), "intra_bw_gbps": nf.num("intra_bw_gbps", default=0.0),
                "intra_lat_us": nf.num("intra_lat_us", default=3.0), "zone": nf.str("zone", default="default"),
                "name": nf.str("name", default="")}
        repeat = nf.int("repeat", low=1, default=1)
        nf.done()
        nodes.extend(dict(node) for _ in range(repeat))
    d = {"name": f.str("name", default=""), "nodes": nodes, "inter_bw_gbps": f.num("inter_bw_gbps", default=25.0),
         "inter_lat_us": f.num("inter_lat_us", default=10.0)}
    for key in ("bw_matrix_gbps", "lat_matrix_us"):
        mat = f.req(key, list, default=None)
        if mat is not None:
            if not all(isinstance(r, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in r)
                       for r in mat):
                raise AutoparError(f.at(key), "must be a list of rows of numbers", "give one row per node")
            d[key] = [[float(x) for x in r] for r in mat]
    meta = f.req("meta", dict, default={})
    f.done()
    cluster = cluster_from_dict(d)
    cluster.meta = meta
    return cluster


def _check_gpu(spec, path: str, with_name: bool) -> None:
    f = _Fields(spec, path)
    if with_name:
        f.str("name")
    for key in ("memory_gib", "tflops", "hbm_gbps"):
        f.num(key)
    for key in ("nvlink_gbps", "pcie_gbps"):
        f.num(key, default=None)
    f.str("vendor", default="nvidia")
    extra = [k for k in spec if k not in _GPU_KEYS]
    if extra:
        raise AutoparError(f"{path}.{extra[0]}", "is not a GPU field", f"use only {', '.join(sorted(_GPU_KEYS))}")
