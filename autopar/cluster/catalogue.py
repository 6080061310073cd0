"""The GPU catalogue: ``catalogue.yaml`` read into GPUType objects, names and aliases resolved.

Names are matched case-insensitively, ignoring spaces, dashes, underscores and the words
"nvidia" / "geforce", with "80GB" read as "80G": ``a100``, ``A100-80GB`` and ``NVIDIA A100 80G``
are all ``A100-80G``.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from autopar.cluster.cluster import GPUType
from autopar.errors import AutoparError

CATALOGUE_PATH = Path(__file__).with_name("catalogue.yaml")
GPU_FIELDS = ("memory_gib", "tflops", "hbm_gbps", "nvlink_gbps", "pcie_gbps", "vendor")
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


def _number(value, where: str, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AutoparError(where, f"must be a number, got {value!r}", "give a plain number")
    if value < 0 or (positive and value == 0):
        raise AutoparError(where, f"must be {'positive' if positive else '>= 0'}, got {value}",
                           "give a number > 0" if positive else "give a number >= 0")
    return float(value)


def gpu_from_entry(name: str, entry: dict, where: str) -> tuple[GPUType, str, dict]:
    """Build (GPUType, class, node overrides) from a catalogue-style mapping, naming ``where`` in errors.

    Needs memory_gib, tflops and hbm_gbps; nvlink_gbps (0), pcie_gbps (32: PCIe Gen4 x16, one
    direction), vendor, class and node (overrides of the class defaults) are optional. The default
    class is ``sxm`` when the GPU has NVLink, ``cpu`` for vendor ``cpu``, else ``pcie``.
    """
    if not isinstance(entry, dict):
        raise AutoparError(where, f"must be a mapping of GPU fields, got {entry!r}",
                           "give memory_gib, tflops and hbm_gbps")
    unknown = sorted(set(entry) - ENTRY_KEYS - {"name"})
    if unknown:
        raise AutoparError(f"{where}.{unknown[0]}", "is not a GPU field",
                           f"use {', '.join(sorted(ENTRY_KEYS))}")
    for key in ("memory_gib", "tflops", "hbm_gbps"):
        if key not in entry:
            raise AutoparError(f"{where}.{key}", "is missing", "give memory GiB, dense bf16 TFLOPS and HBM GB/s")
    nums = {k: _number(entry[k], f"{where}.{k}") for k in ("memory_gib", "tflops", "hbm_gbps")}
    nums["nvlink_gbps"] = _number(entry.get("nvlink_gbps", 0.0), f"{where}.nvlink_gbps", positive=False)
    nums["pcie_gbps"] = _number(entry.get("pcie_gbps", 32.0), f"{where}.pcie_gbps")
    vendor = str(entry.get("vendor", "nvidia"))
    gpu = GPUType(name=str(name), vendor=vendor, **nums)
    default_cls = "cpu" if vendor == "cpu" else "sxm" if gpu.nvlink_gbps > 0 else "pcie"
    cls = str(entry.get("class", default_cls))
    if cls not in _classes():
        raise AutoparError(f"{where}.class", f"unknown class {cls!r}", f"use one of {', '.join(_classes())}")
    overrides = entry.get("node") or {}
    if not isinstance(overrides, dict):
        raise AutoparError(f"{where}.node", f"must be a mapping, got {overrides!r}", f"use keys {', '.join(NODE_KEYS)}")
    bad = sorted(set(overrides) - set(NODE_KEYS))
    if bad:
        raise AutoparError(f"{where}.node.{bad[0]}", "is not a node default", f"use {', '.join(NODE_KEYS)}")
    return gpu, cls, dict(overrides)


@functools.cache
def _raw() -> dict:
    with open(CATALOGUE_PATH) as f:
        return yaml.safe_load(f)


def _classes() -> dict:
    return _raw()["node_classes"]


@functools.cache
def _catalogue() -> tuple[dict[str, tuple[GPUType, str, dict]], dict[str, str]]:
    """({canonical name: (GPUType, class, node overrides)}, {lookup key: canonical name})."""
    entries: dict[str, tuple[GPUType, str, dict]] = {}
    keys: dict[str, str] = {}
    for name, entry in _raw()["gpus"].items():
        where = f"catalogue.yaml gpus.{name}"
        gpu, cls, overrides = gpu_from_entry(name, entry, where)
        entries[name] = (gpu, cls, overrides)
        for alias in [name, *entry.get("aliases", [])]:
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


def gpu_class(gpu_type: GPUType) -> str:
    """The node class of a catalogue GPU (``sxm``, ``pcie``, ``geforce``, ``cpu``)."""
    entries = _catalogue()[0]
    if gpu_type.name in entries and entries[gpu_type.name][0] == gpu_type:
        return entries[gpu_type.name][1]
    return "cpu" if gpu_type.vendor == "cpu" else "sxm" if gpu_type.nvlink_gbps > 0 else "pcie"


def node_defaults(gpu_type: GPUType, cls: str | None = None, overrides: dict | None = None) -> NodeDefaults:
    """Default node size, intra-node link and network for ``gpu_type``.

    Catalogue GPUs use their class and their own ``node:`` overrides; custom GPUs (cluster files)
    pass ``cls`` and ``overrides``. "nvlink" / "pcie" intra values resolve to the GPU's own figure.
    """
    if cls is None:
        own = _catalogue()[0].get(gpu_type.name)
        if own is not None and own[0] == gpu_type:
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
    """One line for ``autopar list gpus``: name, memory, TFLOPS, HBM, links, aliases."""
    g = gpu(name)
    link = (f"NVLink {g.nvlink_gbps:g}" if g.nvlink_gbps else
            f"{'IPC' if g.vendor == 'cpu' else 'PCIe'} {g.pcie_gbps:g}")
    aliases = gpu_aliases(g.name)
    alias_txt = f"  (also {', '.join(aliases)})" if aliases else ""
    return (f"{g.name:<10} {g.memory_gib:>5g} GiB  {g.tflops:>6g} TFLOPS  {g.hbm_gbps:>5g} GB/s mem  "
            f"{link} GB/s{alias_txt}")
