"""The GPU catalogue: ``catalogue.yaml`` read into GPUType objects, names and aliases resolved.

Names are matched case-insensitively, ignoring spaces, dashes, underscores and the words
"nvidia" / "geforce", with "80GB" read as "80G": ``a100``, ``A100-80GB`` and ``NVIDIA A100 80G``
are all ``A100-80G``.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from autopar.cluster.cluster import MAMF_FIELDS, PEAK_FIELDS, GPUType
from autopar.errors import AutoparError
from autopar.fields import Fields, as_list, as_name

CATALOGUE_PATH = Path(__file__).with_name("catalogue.yaml")
GPU_FIELDS = ("memory_gib", "tflops", "hbm_gbps", "nvlink_gbps", "pcie_gbps", "vendor", "sustained", "gddr_ecc", "sms",
              *PEAK_FIELDS, *MAMF_FIELDS)
ENTRY_KEYS = set(GPU_FIELDS) | {"aliases", "class", "node"}
NODE_KEYS = ("gpus_per_node", "intra_bw_gbps", "intra_lat_us", "inter_bw_gbps", "inter_lat_us")


@dataclass(frozen=True)
class NodeDefaults:
    """The node and network a spec gets for a GPU type when it names none (see node_classes)."""

    gpus_per_node: int  # 0: one node holds them all
    intra_bw_gbps: float
    intra_lat_us: float
    inter_bw_gbps: float
    inter_lat_us: float


def normalize(name: str) -> str:
    """The lookup key of a GPU name: lower case, no separators or vendor words, '80gb' -> '80g'."""
    key = name.lower()
    for word in ("nvidia", "geforce"):
        key = key.replace(word, "")
    key = re.sub(r"[\s_\-]+", "", key)
    return re.sub(r"(\d+)gb", r"\1g", key)


def gpu_from_entry(name: str | None, entry: object, where: str) -> tuple[GPUType, str, dict]:
    """Build (GPUType, class, node overrides) from a GPU mapping, naming ``where`` in errors.

    The one reader of GPU fields: catalogue entries, custom GPUs of cluster files and the GPUs of a
    plan's cluster all come through here, with one set of defaults. Needs memory_gib, tflops and
    hbm_gbps (> 0); nvlink_gbps (0: no NVLink), pcie_gbps (32: PCIe Gen4 x16, one direction), vendor
    (nvidia), the per-precision dense peaks tflops_fp32 / tflops_tf32 / tflops_fp8 (0: not known, so
    planning that precision on the GPU is refused, naming the field), sustained (1: the fraction of
    those peaks a power-capped part holds on long GEMMs), gddr_ecc (false: GDDR memory with ECC on,
    which leaves less memory and bandwidth usable, ``cluster.ECC_MEMORY_FRACTION``), sms (0: the streaming
    multiprocessor count is not known, so GEMMs are not quantised into waves), mamf / mamf_fp8 / mamf_fp32 (0: the measured
    achievable matmul efficiency is not known, so its GEMMs run at the reference GPU's), class and node (overrides of
    the class defaults) are optional; ``name`` is read from
    the mapping when ``name`` is None (an inline GPU). The default class is ``sxm`` when the GPU has
    NVLink, ``cpu`` for vendor ``cpu``, else ``pcie``.
    """
    f = Fields(entry, where, kind="GPU", keys=sorted(ENTRY_KEYS | {"name"}))
    if name is None:
        name = as_name(f.raw("name", what="the GPU's name"), f.at("name"))
    else:
        name = as_name(name, where)
    fix = "give memory GiB, dense bf16 TFLOPS and HBM GB/s, each > 0"
    nums = {k: f.req_num(k, gt=0, fix=fix) for k in ("memory_gib", "tflops", "hbm_gbps")}
    nums["nvlink_gbps"] = f.opt_num("nvlink_gbps", 0.0, ge=0)
    nums["pcie_gbps"] = f.opt_num("pcie_gbps", 32.0, gt=0)
    nums.update({k: f.opt_num(k, 0.0, ge=0) for k in (*PEAK_FIELDS, *MAMF_FIELDS)})
    nums["sustained"] = f.opt_num("sustained", 1.0, gt=0)
    vendor = f.opt_str("vendor", "nvidia")
    ecc = bool(f.opt_bool("gddr_ecc", False))
    sms = f.opt_int("sms", 0, low=0)
    gpu = GPUType(name=str(name), vendor=vendor, gddr_ecc=ecc, sms=int(sms or 0), **nums)
    default_cls = "cpu" if vendor == "cpu" else "sxm" if gpu.nvlink_gbps > 0 else "pcie"
    cls = f.opt_str("class", default_cls, choices=tuple(_classes()))
    overrides = _node_values(f.opt_mapping("node", {}), f.at("node"), required=False)
    return gpu, cls, overrides


def _node_values(raw: object, where: str, required: bool) -> dict:
    """Node defaults (a class of node_classes, or a GPU's ``node:`` overrides), every value checked."""
    f = Fields(raw, where, kind="node default", keys=NODE_KEYS)
    out: dict = {}
    for key in NODE_KEYS:
        if not (required or f.has(key)):
            continue
        if key == "gpus_per_node":
            out[key] = f.req_int(key, low=0)
        elif key == "intra_bw_gbps" and isinstance(f.raw(key), str):  # the GPU's own link figure
            out[key] = f.req_str(key, choices=("nvlink", "pcie"),
                                 fix="give GB/s, or nvlink / pcie for the GPU's own link figure")
        else:
            out[key] = f.req_num(key, gt=0) if key.endswith("bw_gbps") else f.req_num(key, ge=0)
    return out


@functools.cache
def _raw() -> dict:
    with open(CATALOGUE_PATH) as f:
        return yaml.safe_load(f)


@functools.cache
def _classes() -> dict[str, dict]:
    """node_classes of catalogue.yaml, every value checked."""
    classes = Fields(_raw(), "catalogue.yaml").req_mapping("node_classes")
    return {str(k): _node_values(v, f"catalogue.yaml node_classes.{k}", required=True) for k, v in classes.items()}


@functools.cache
def _catalogue() -> tuple[dict[str, tuple[GPUType, str, dict]], dict[str, str]]:
    """({canonical name: (GPUType, class, node overrides)}, {lookup key: canonical name})."""
    entries: dict[str, tuple[GPUType, str, dict]] = {}
    keys: dict[str, str] = {}
    for raw_name, entry in Fields(_raw(), "catalogue.yaml").req_mapping("gpus").items():
        name = str(raw_name)
        where = f"catalogue.yaml gpus.{name}"
        gpu, cls, overrides = gpu_from_entry(name, entry, where)
        entries[name] = (gpu, cls, overrides)
        for alias in [name, *as_list(entry.get("aliases") or [], f"{where}.aliases")]:
            key = normalize(str(alias))
            if keys.get(key, name) != name:
                raise AutoparError(f"{where}.aliases", f"{alias!r} already names {keys[key]}", "remove the duplicate")
            keys[key] = name
    return entries, keys


def gpu_names() -> list[str]:
    """Canonical GPU names in catalogue order."""
    return list(_catalogue()[0])


def gpu_aliases(name: str) -> list[str]:
    """The other names a catalogue GPU answers to."""
    canonical = gpu(name).name
    return [str(a) for a in _raw()["gpus"][canonical].get("aliases", [])]


def lookup(name: str) -> str | None:
    """Canonical catalogue name for ``name`` (any alias, any case), or None."""
    return _catalogue()[1].get(normalize(str(name)))


def gpu(name: str, field: str = "gpu") -> GPUType:
    """The catalogue GPUType called ``name`` (alias, any case); AutoparError naming ``field`` if unknown."""
    canonical = lookup(name)
    if canonical is not None:
        return _catalogue()[0][canonical][0]
    keys = _catalogue()[1]
    close = difflib.get_close_matches(normalize(str(name)), list(keys), n=6, cutoff=0.6)
    names = list(dict.fromkeys(keys[k] for k in close))[:3]
    hint = f"did you mean {', '.join(names)}? " if names else ""
    raise AutoparError(field, f"unknown GPU type {name!r}",
                       f"{hint}run `autopar list gpus` for the catalogue, or define it under gpus: in a cluster file")


def _entry(gpu_type: GPUType) -> tuple[GPUType, str, dict] | None:
    """The catalogue row of ``gpu_type`` (the same GPU at any precision), or None for a custom GPU."""
    own = _catalogue()[0].get(gpu_type.name)
    return own if own is not None and own[0] == replace(gpu_type, precision=own[0].precision) else None


def gpu_class(gpu_type: GPUType) -> str:
    """The node class of a catalogue GPU (``sxm``, ``pcie``, ``geforce``, ``cpu``)."""
    own = _entry(gpu_type)
    if own is not None:
        return own[1]
    return "cpu" if gpu_type.vendor == "cpu" else "sxm" if gpu_type.nvlink_gbps > 0 else "pcie"


def node_defaults(gpu_type: GPUType, cls: str | None = None, overrides: dict | None = None) -> NodeDefaults:
    """Default node size, intra-node link and network for ``gpu_type``.

    Catalogue GPUs use their class and their own ``node:`` overrides; custom GPUs (cluster files)
    pass ``cls`` and ``overrides``. "nvlink" / "pcie" intra values resolve to the GPU's own figure.
    """
    if cls is None:
        own = _entry(gpu_type)
        if own is not None:
            cls, overrides = own[1], own[2]
    values = {**_classes()[cls or gpu_class(gpu_type)], **(overrides or {})}
    intra = values["intra_bw_gbps"]
    if intra == "nvlink":
        intra = gpu_type.nvlink_gbps or gpu_type.pcie_gbps
    elif intra == "pcie":
        intra = gpu_type.pcie_gbps
    return NodeDefaults(gpus_per_node=int(values["gpus_per_node"]), intra_bw_gbps=float(intra),
                        intra_lat_us=float(values["intra_lat_us"]), inter_bw_gbps=float(values["inter_bw_gbps"]),
                        inter_lat_us=float(values["inter_lat_us"]))


def describe_gpu(name: str) -> str:
    """One line for ``autopar list gpus``: name, memory, TFLOPS (bf16, then the other precisions'), HBM, links, aliases."""
    g = gpu(name)
    link = (f"{'xGMI' if g.vendor == 'amd' else 'NVLink'} {g.nvlink_gbps:g}" if g.nvlink_gbps else
            f"{'IPC' if g.vendor == 'cpu' else 'PCIe'} {g.pcie_gbps:g}")
    aliases = gpu_aliases(g.name)
    alias_txt = f"  (also {', '.join(aliases)})" if aliases else ""
    others = " ".join(f"{k.split('_')[1]} {getattr(g, k):g}" for k in PEAK_FIELDS if getattr(g, k))
    ecc = f" (ECC: {g.usable_memory_gib:g} GiB, {g.hbm_bw / 1e9:g} GB/s usable)" if g.gddr_ecc else ""
    sms = f"  {g.sms} SMs" if g.sms else ""
    mamf = "".join(f"  {k.replace('_', ' ')} {getattr(g, k):.1%}" for k in MAMF_FIELDS if getattr(g, k))
    return (f"{g.name:<14} {g.memory_gib:>5g} GiB  {g.tflops:>6g} TFLOPS  {g.hbm_gbps:>5g} GB/s mem{ecc}  "
            f"{link} GB/s  [{others or 'bf16 only'}]{sms}{mamf}{alias_txt}")
