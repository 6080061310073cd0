"""Plan files: versioned, readable YAML, and the plain dicts behind them.

Format (``autopar_plan: 1``)::

    autopar_plan: 1
    model: {name: llama2-7b, source: llama2-7b, seq_len: 4096, layers: 34}
    global_batch_size: 512
    schedule: 1f1b
    precision: bf16                    # optional (absent: bf16); bf16 | fp16 | fp32 | tf32 | fp8
    memory_budget_gib: 70.0            # optional; absent: each device's own memory
    memory_margin: 0.1                 # optional (absent: 0); the share of each GPU's memory kept free
    pipelines:
    - batch_share: 512
      micro_batch_size: 4
      num_microbatches: 128
      stages:
      - devices: 0-7                   # or a list [0, 1, 2, 3]; "0-3,8-11" also reads
        layers:
        - {name: embed, tp: 1, zero: 3, ckpt: none}
        - {names: layers.0-layers.15, tp: 2, zero: 2, ckpt: full, sp: true}
    cluster:                           # the whole cluster, so the plan stands alone
      name: 2x8xA100-80G
      gpus: {A100-80G: {memory_gib: 80.0, tflops: 312.0, ...}}
      nodes:
      - {gpu: A100-80G, count: 8, intra_lat_us: 3.0, repeat: 2}
      inter_bw_gbps: 25.0
      inter_lat_us: 10.0
    predicted: {...}
    search: {...}

``names: P<a>-P<b>`` stands for the units ``P<a>, P<a+1>, ..., P<b>`` (one prefix, numbers without
leading zeros); it is written for every run of two or more such units that share one strategy, and
only when it reads back to exactly those names. ``sp`` and ``async_tp`` are written only when true, ``ep`` (expert
parallel degree of an MoE unit) only when above 1, ``reshard`` only when false and ``zero_overlap`` only when
true (their defaults; see ``Strategy``), ``cp`` only when > 1. The ``cluster:``
block is a cluster document (autopar/cluster/parse.py) read standalone: its GPUs are listed in it,
and a node entry without ``name`` has the empty name, without ``intra_bw_gbps`` the GPU's default
fabric, without ``zone`` the zone ``default``; ``repeat: k`` stands for k equal nodes in a row.

Every error while reading is an AutoparError naming the field path as written in the file
(``pipelines[0].stages[1].layers[2].tp``: the third entry of that stage's ``layers`` list).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import yaml

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.fields import kind_of
from autopar.fileio import write_text_atomic
from autopar.plan.reader import VERSION_KEY, _expand_range, plan_from_dict
from autopar.plan.schema import PLAN_VERSION, Plan, StageLayer

_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<num>0|[1-9]\d*)$")
_HEADER = ("# autopar plan. Devices are global ids numbered node by node (= launch ranks).\n"
           "# `names: P0-P15` is the run of units P0, P1, ..., P15 sharing one strategy.\n")


# -- writing -----------------------------------------------------------------------------------
def plan_to_dict(plan: Plan) -> dict:
    """Plain data (YAML/JSON-ready: no numpy types) that ``plan_from_dict`` turns back into an equal Plan."""
    d: dict = {
        VERSION_KEY: PLAN_VERSION,
        "model": {"name": plan.model.name, "source": plan.model.source, "seq_len": int(plan.model.seq_len),
                  "layers": int(plan.model.num_layers)},
        "global_batch_size": int(plan.global_batch_size),
        "schedule": plan.schedule,
        "precision": plan.precision,
    }
    if plan.memory_budget_gib is not None:
        d["memory_budget_gib"] = float(plan.memory_budget_gib)
    if plan.cluster.memory_margin:
        d["memory_margin"] = float(plan.cluster.memory_margin)
    d["pipelines"] = [
        {
            "batch_share": int(p.batch_share),
            "micro_batch_size": int(p.micro_batch_size),
            "num_microbatches": int(p.num_microbatches),
            **({"virtual_stages": int(p.virtual_stages)} if p.virtual_stages != 1 else {}),
            "stages": [{"devices": _devices_out([int(x) for x in st.devices]), "layers": _layers_out(st.layers)}
                       for st in p.stages],
        }
        for p in plan.pipelines
    ]
    d["cluster"] = _cluster_out(plan.cluster)
    d["predicted"] = _plain(plan.predicted, "predicted")
    d["search"] = _plain(plan.search, "search")
    return d


def dump_plan_yaml(plan: Plan) -> str:
    """The plan file text: a short header comment, then block YAML with one line per layer entry."""
    body = yaml.dump(plan_to_dict(plan), Dumper=_Dumper, sort_keys=False, default_flow_style=None,
                     width=110, allow_unicode=True)
    return _HEADER + body


def save_plan(plan: Plan, path: str | os.PathLike) -> Path:
    """Write ``plan`` as YAML to ``path`` (parents created; written whole or not at all)."""
    return write_text_atomic(path, dump_plan_yaml(plan), "plan")


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors/aliases (repeated objects are written out, never ``&id001``)."""

    def ignore_aliases(self, data) -> bool:
        return True


def _plain(x, path: str):
    """Python scalars, lists and dicts only (numpy scalars/arrays converted, tuples made lists)."""
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {_plain(k, path): _plain(v, f"{path}.{k}") for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(x)]
    for kind in (bool, int, float, str):  # subclasses (IntEnum, str enums): write the base value
        if isinstance(x, kind):
            return kind(x)
    raise AutoparError(path, f"holds a {type(x).__name__}, which a plan file cannot store",
                       "store numbers, strings, lists or dicts")


def _split_numbered(name: str) -> tuple[str, int] | None:
    m = _NUMBERED.match(name)
    return (m["prefix"], int(m["num"])) if m else None


def _layers_out(layers: list[StageLayer]) -> list[dict]:
    """Layer entries, runs of numbered units with one strategy compressed to ``names: P<a>-P<b>``."""
    out: list[dict] = []
    i = 0
    while i < len(layers):
        j = i + 1
        first = _split_numbered(layers[i].name)
        if first is not None:
            while (j < len(layers) and layers[j].strategy == layers[i].strategy
                   and _split_numbered(layers[j].name) == (first[0], first[1] + (j - i))):
                j += 1
        names = [ly.name for ly in layers[i:j]]
        entry: dict = {}
        if len(names) > 1:
            text = f"{names[0]}-{names[-1]}"
            try:
                ok = _expand_range(text, "") == names
            except AutoparError:
                ok = False
            if not ok:  # the range would read back differently: write this unit alone
                j, names = i + 1, names[:1]
            else:
                entry["names"] = text
        if len(names) == 1:
            entry["name"] = names[0]
        s = layers[i].strategy
        entry.update(tp=int(s.tp), zero=int(s.zero), ckpt=s.ckpt)
        if s.sp:
            entry["sp"] = True
        if s.ep != 1:
            entry["ep"] = int(s.ep)
        if not s.reshard:
            entry["reshard"] = False
        if s.zero_overlap:
            entry["zero_overlap"] = True
        if s.cp > 1:
            entry["cp"] = int(s.cp)
        if s.async_tp:
            entry["async_tp"] = True
        out.append(entry)
        i = j
    return out


def _devices_out(devices: list[int]) -> str | list[int]:
    """``"a-b"`` when the devices are a contiguous ascending run of two or more, else the list."""
    if len(devices) >= 2 and devices == list(range(devices[0], devices[0] + len(devices))):
        return f"{devices[0]}-{devices[-1]}"
    return list(devices)


def _cluster_out(cluster: Cluster) -> dict:
    """``Cluster.to_dict()`` made shorter: GPU types listed once, equal neighbouring nodes merged."""
    cd = cluster.to_dict()
    gpus: dict[str, dict] = {}
    nodes: list[dict] = []
    for nd, raw in zip(cluster.nodes, cd["nodes"]):
        gpu = dict(raw["gpu"])
        gname = gpu.pop("name")
        entry: dict = {"gpu": gname}
        if gpus.setdefault(gname, gpu) != gpu:  # two different GPUs share a name: keep this one inline
            entry["gpu"] = dict(raw["gpu"])
        # The node's own setting (0 = the GPU's default fabric), not the resolved bandwidth: exact round trip.
        entry["count"] = nd.count
        if nd.intra_bw_gbps:  # absent: 0, the GPU's default fabric (NVLink or PCIe)
            entry["intra_bw_gbps"] = float(nd.intra_bw_gbps)
        entry["intra_lat_us"] = float(nd.intra_lat_us)
        if nd.zone != "default":
            entry["zone"] = nd.zone
        if nd.name:
            entry["name"] = nd.name
        if nodes and {k: v for k, v in nodes[-1].items() if k != "repeat"} == entry:
            nodes[-1]["repeat"] = nodes[-1].get("repeat", 1) + 1
        else:
            nodes.append(entry)
    out: dict = {"name": cd.get("name", ""), "gpus": gpus, "nodes": nodes}
    out.update({k: v for k, v in cd.items() if k not in ("name", "nodes")})
    if cluster.meta:
        out["meta"] = _plain(cluster.meta, "cluster.meta")
    return out


# -- reading -----------------------------------------------------------------------------------
def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan file (YAML, or JSON) written by ``save_plan`` or by hand."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise AutoparError("plan", f"file {path} does not exist", "give the path of a plan from autopar search") from e
    except (OSError, UnicodeDecodeError) as e:
        raise AutoparError("plan", f"cannot read {path}: {e}", "give a readable plan file") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise AutoparError("plan", f"{path} is not valid YAML{at} ({problem})",
                           "fix the YAML there or write the plan again with autopar search") from e
    if not isinstance(data, dict):
        raise AutoparError("plan", f"{path} does not hold a plan (top level is {kind_of(data)}, not a mapping)",
                           "give a plan file written by autopar search")
    return plan_from_dict(data)
