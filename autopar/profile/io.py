"""The profile file: versioned YAML, written whole, read back with every field checked.

A profile is plain data (see ``autopar/profile/profiler.py`` for how each part is measured)::

    autopar_profile: 1
    created, host, torch, autopar, quick
    device:  {type: cpu | <catalogue GPU name>, name, backend, nproc, threads_per_rank}
    model:   {name, source, seq_len, dtype_bytes, units: [...]}
    compute: {peak_tflops, hbm_gbps, samples: [...], fit: {all, by_kind}, zero_flop_units, optimizer}
    communication: {sizes, group_sizes, measured, fits: {n: {collective: {alpha_s, beta_s_per_byte,
                    rel_rms}}}, genmodel, link: {bw_gbps, lat_us}}
    memory:  {state_table: {zero0..zero3: {a, b}}, units: {unit: {tp_params, act_*_bytes,
              boundary_bytes, measured}}, runs}
    cost_params: the CostParams fields the profile sets
    assumptions: what is stated rather than measured, and why

``load_profile`` refuses anything else with one AutoparError line naming the field.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import yaml

from autopar.errors import AutoparError
from autopar.fileio import write_text_atomic

VERSION_KEY = "autopar_profile"
PROFILE_VERSION = 1
COLLECTIVES_USED = ("allreduce", "allgather", "reduce_scatter", "p2p")
FIX = "run `autopar profile -o FILE` again to write a fresh profile"


class Profile(dict):
    """A loaded, checked profile (a dict) plus where it came from."""

    path: str = ""
    sha256: str = ""

    @property
    def device_type(self) -> str:
        return self["device"]["type"]

    @property
    def group_sizes(self) -> list[int]:
        return sorted(int(n) for n in self["communication"]["fits"])

    @property
    def dtype_bytes(self) -> int:
        return int(self["model"]["dtype_bytes"])


def _need(d: dict, key: str, kind, where: str):
    if not isinstance(d, dict) or key not in d:
        raise AutoparError(f"profile.{where}{key}", "is missing", FIX)
    v = d[key]
    ok = isinstance(v, kind) and not (kind in ((int, float), int) and isinstance(v, bool))
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise AutoparError(f"profile.{where}{key}", f"must be a {names}, got {type(v).__name__}", FIX)
    return v


def _positive(d: dict, key: str, where: str) -> float:
    v = _need(d, key, (int, float), where)
    if not v > 0:
        raise AutoparError(f"profile.{where}{key}", f"must be positive, got {v}", FIX)
    return v


def check_profile(doc) -> None:
    """Raise AutoparError (one line, naming the field) unless ``doc`` is a complete profile."""
    if not isinstance(doc, dict):
        raise AutoparError("profile", f"is a {type(doc).__name__}, not a mapping", "give a file written by autopar profile")
    if VERSION_KEY not in doc:
        raise AutoparError(f"profile.{VERSION_KEY}", "is missing: not an autopar profile",
                           "give a file written by autopar profile")
    if doc[VERSION_KEY] != PROFILE_VERSION:
        raise AutoparError(f"profile.{VERSION_KEY}", f"is version {doc[VERSION_KEY]!r}; this autopar reads "
                           f"version {PROFILE_VERSION}", FIX)
    dev = _need(doc, "device", dict, "")
    _need(dev, "type", str, "device.")
    _need(dev, "nproc", int, "device.")
    model = _need(doc, "model", dict, "")
    _need(model, "name", str, "model.")
    _positive(model, "seq_len", "model.")
    _positive(model, "dtype_bytes", "model.")
    _need(model, "units", list, "model.")
    comp = _need(doc, "compute", dict, "")
    _positive(comp, "peak_tflops", "compute.")
    _positive(comp, "hbm_gbps", "compute.")
    comm = _need(doc, "communication", dict, "")
    fits = _need(comm, "fits", dict, "communication.")
    for n, per in fits.items():
        if not isinstance(n, int) or n < 2:
            raise AutoparError(f"profile.communication.fits.{n}", "is not a group size >= 2", FIX)
        for c in COLLECTIVES_USED:
            row = _need(per, c, dict, f"communication.fits.{n}.")
            for k in ("alpha_s", "beta_s_per_byte"):
                v = _need(row, k, (int, float), f"communication.fits.{n}.{c}.")
                if v < 0:
                    raise AutoparError(f"profile.communication.fits.{n}.{c}.{k}", f"is negative ({v})", FIX)
    if fits:
        link = _need(comm, "link", dict, "communication.")
        _positive(link, "bw_gbps", "communication.link.")
        _need(link, "lat_us", (int, float), "communication.link.")
    mem = _need(doc, "memory", dict, "")
    table = _need(mem, "state_table", dict, "memory.")
    for z in range(4):
        row = _need(table, f"zero{z}", dict, "memory.state_table.")
        _need(row, "a", (int, float), f"memory.state_table.zero{z}.")
        _need(row, "b", (int, float), f"memory.state_table.zero{z}.")
    units = _need(mem, "units", dict, "memory.")
    for name in model["units"]:
        row = _need(units, name, dict, "memory.units.")
        for k in ("tp_params", "act_tp_bytes", "act_seq_bytes", "act_attn_bytes", "boundary_bytes"):
            v = _need(row, k, (int, float), f"memory.units.{name}.")
            if v < 0:
                raise AutoparError(f"profile.memory.units.{name}.{k}", f"is negative ({v})", FIX)
    _need(doc, "cost_params", dict, "")


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and check a profile file; AutoparError (one line) if it is missing, unreadable or incomplete."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise AutoparError("profile", f"cannot read {p}: {e.strerror or e}",
                           "give the file `autopar profile -o FILE` wrote") from e
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise AutoparError("profile", f"{p} is not valid YAML{where}", FIX) from e
    check_profile(doc)
    prof = Profile(doc)
    prof.path = str(p)
    prof.sha256 = hashlib.sha256(raw).hexdigest()
    return prof


def plain(x):
    """Python scalars, lists and dicts only (numpy numbers, str subclasses and tuples converted)."""
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, dict):
        return {plain(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy / torch scalars
        return x.item()
    for kind in (bool, int, float, str):
        if isinstance(x, kind):
            return kind(x)
    raise AutoparError("profile", f"holds a {type(x).__name__}, which a profile file cannot store",
                       "store numbers, strings, lists or dicts")


def save_profile(doc: dict, path: str | os.PathLike) -> Path:
    """Check ``doc`` and write it as YAML (whole or not at all)."""
    doc = plain(doc)
    check_profile(doc)
    text = "# autopar profile: what this machine measured (autopar profile --help)\n"
    text += yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
    return write_text_atomic(path, text, "profile")
