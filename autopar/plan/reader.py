"""Reading plan dicts back into Plan objects: typed fields, and errors that name the field path.

Every error is an AutoparError naming the path as written in the file
(``pipelines[0].stages[1].layers[2].tp``: the third entry of that stage's ``layers`` list). Fields
are read by ``autopar.fields`` and the embedded ``cluster:`` by ``cluster_from_doc``, the reader of
cluster files, in its standalone form (GPUs from the block itself, no catalogue).
"""

from __future__ import annotations

import re

from autopar.cluster.parse import cluster_from_doc
from autopar.errors import AutoparError
from autopar.fields import Fields, as_int, as_list, as_str, kind_of
from autopar.plan.cost_params import read_cost_params
from autopar.plan.precision import check_precision
from autopar.plan.schema import PLAN_VERSION, SCHEDULES, ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from cost_models.precision import DEFAULT

VERSION_KEY = "autopar_plan"
TOP_KEYS = (VERSION_KEY, "model", "global_batch_size", "schedule", "precision", "memory_budget_gib", "memory_margin",
            "pipelines", "cluster", "predicted", "search")
MODEL_KEYS = ("name", "source", "seq_len", "layers")
PIPELINE_KEYS = ("batch_share", "micro_batch_size", "num_microbatches", "virtual_stages", "stages")
STAGE_KEYS = ("devices", "layers")
LAYER_KEYS = ("name", "names", "tp", "zero", "ckpt", "sp", "ep", "reshard", "zero_overlap", "cp", "async_tp")
_RANGE = re.compile(r"^(?P<prefix>.*?)(?P<a>\d+)-(?P=prefix)(?P<b>\d+)$")


def plan_from_dict(d: dict) -> Plan:
    """Inverse of ``plan_to_dict``; rejects unknown versions, missing keys and wrong types by field path."""
    if not isinstance(d, dict):
        raise AutoparError("plan", f"is {kind_of(d)}, not a mapping", "give a plan file written by autopar search")
    if VERSION_KEY not in d:
        raise AutoparError(VERSION_KEY, "is missing, so this is not an autopar plan",
                           f"write plans with autopar search (they start with '{VERSION_KEY}: {PLAN_VERSION}')")
    top = Fields(d, "", kind="plan", keys=TOP_KEYS)
    version = top.req_int(VERSION_KEY, low=1)
    if version > PLAN_VERSION:
        raise AutoparError(VERSION_KEY, f"plan format {version} is newer than this autopar reads ({PLAN_VERSION})",
                           "upgrade autopar, or write the plan again with this version")
    m = top.sub("model", kind="model", keys=MODEL_KEYS)
    model = ModelRef(name=m.req_str("name"), seq_len=m.req_int("seq_len", low=1), num_layers=m.req_int("layers", low=1),
                     source=m.opt_str("source", ""))
    precision = check_precision(top.opt_str("precision", DEFAULT), top.at("precision"))
    margin = top.opt_num("memory_margin", 0.0, ge=0, fix="give the share of each GPU's memory kept free, in [0, 1)")
    if not margin < 1:
        raise AutoparError(top.at("memory_margin"), f"must be below 1, got {margin}",
                           "give the share of each GPU's memory kept free, in [0, 1)")
    cluster = cluster_from_doc(top.req_mapping("cluster"), None, "cluster", standalone=True).at_precision(precision)
    cluster = cluster.with_memory_margin(margin)
    gbs = top.req_int("global_batch_size", low=1)
    schedule = top.opt_str("schedule", "1f1b", choices=SCHEDULES)
    budget = top.opt_num("memory_budget_gib", None, gt=0, fix="give GiB per device, or omit it")
    raw_pipes = top.req_list("pipelines", nonempty=True)
    pipelines = [_pipeline_in(p, f"pipelines[{i}]") for i, p in enumerate(raw_pipes)]
    predicted = top.opt_mapping("predicted", {})
    search = top.opt_mapping("search", {})
    if search.get("cost_params") is not None:
        read_cost_params(search["cost_params"], "search.cost_params", "search the plan again (autopar search)")
    return Plan(model=model, cluster=cluster, global_batch_size=gbs, pipelines=pipelines, schedule=schedule,
                memory_budget_gib=budget, predicted=predicted, search=search, version=version)


def _pipeline_in(raw: object, path: str) -> Pipeline:
    f = Fields(raw, path, kind="pipeline", keys=PIPELINE_KEYS)
    share = f.req_int("batch_share", low=1)
    mbs = f.req_int("micro_batch_size", low=1)
    nmb = f.req_int("num_microbatches", low=1)
    virtual = f.opt_int("virtual_stages", 1, low=1)
    stages = []
    for si, rs in enumerate(f.req_list("stages")):
        sf = Fields(rs, f"{path}.stages[{si}]", kind="stage", keys=STAGE_KEYS)
        devices = _devices_in(sf.raw("devices", what="the stage's global device ids, e.g. 0-7"), sf.at("devices"))
        layers: list[StageLayer] = []
        for li, entry in enumerate(sf.req_list("layers")):
            layers.extend(_layer_entry_in(entry, f"{sf.at('layers')}[{li}]"))
        stages.append(Stage(devices=devices, layers=layers))
    return Pipeline(batch_share=share, micro_batch_size=mbs, num_microbatches=nmb, stages=stages,
                    virtual_stages=virtual)


def _layer_entry_in(raw: object, path: str) -> list[StageLayer]:
    f = Fields(raw, path, kind="layer", keys=LAYER_KEYS)
    if f.has("name") == f.has("names"):
        raise AutoparError(path, "needs exactly one of 'name' (one unit) or 'names' (a range P0-P15 or a list)",
                           "write name: embed, or names: layers.0-layers.15")
    if f.has("name"):
        names = [f.req_str("name")]
    else:
        raw_names = f.raw("names")
        if isinstance(raw_names, str):
            names = _expand_range(raw_names, f.at("names"))
        else:
            fix = "write names: P<a>-P<b> (a range like layers.0-layers.15) or names: [a, b]"
            items = as_list(raw_names, f.at("names"), nonempty=True, fix=fix)
            names = [as_str(n, f"{f.at('names')}[{i}]", fix=fix) for i, n in enumerate(items)]
    tp, zero, ckpt = f.req_int("tp", low=1), f.req_int("zero", low=0), f.req_str("ckpt")
    sp, async_tp = f.opt_bool("sp", False), f.opt_bool("async_tp", False)
    ep = f.opt_int("ep", 1, low=1)
    reshard, overlap = f.opt_bool("reshard", True), f.opt_bool("zero_overlap", False)
    cp = f.opt_int("cp", 1, low=1)
    try:  # the schema states what a strategy may be (zero 0-3, known ckpt modes, sp needs tp > 1)
        strategy = Strategy(tp=tp, zero=zero, ckpt=ckpt, sp=sp, ep=ep, reshard=reshard, zero_overlap=overlap, cp=cp,
                            async_tp=async_tp)
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


def _devices_in(raw: object, path: str) -> list[int]:
    """A list of ints, or a string of ranges and ids like ``0-7`` or ``0-3,8-11``."""
    if isinstance(raw, str):
        out: list[int] = []
        for part in raw.replace(" ", "").split(","):
            lo, sep, hi = part.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()) or (sep and int(hi) < int(lo)):
                raise AutoparError(path, f"{raw!r} is not a device range", "write e.g. 0-7, 0-3,8-11, or a list")
            out.extend(range(int(lo), int(hi if sep else lo) + 1))
        return out
    fix = "write devices: 0-7 or devices: [0, 1, 2, 3] (global device ids)"
    return [as_int(x, f"{path}[{i}]", low=0, fix=fix) for i, x in enumerate(as_list(raw, path, fix=fix))]
