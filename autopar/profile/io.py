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

A calibration (``autopar calibrate``, see ``autopar/calibrate/``) is the other kind ``--profile``
accepts: it only replaces CostParams fields, fitted to measured runs of the GPU types it names::

    format: autopar-calibration/1
    gpus: [<catalogue GPU name>, ...]
    cost_params: the fitted CostParams fields (comm_fit rows from nccl-tests tables of one host)
    communication: {link: {bw_gbps, lat_us}, inter_link: {bw_gbps, lat_us}}  (optional, nccl-tests: the
                   measured intra-node link and network; cost_params may then be empty)
    (runs, base_params, cv, in_sample, fit: how it was fitted and how well it predicts held-out runs)

``load_profile`` reads both (one reader, dispatching on the version key: ``autopar_profile`` or
``format``) and refuses anything else with one AutoparError line naming the field.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import yaml

from autopar.errors import AutoparError
from autopar.fields import Fields, as_int, as_str
from autopar.fileio import write_text_atomic
from autopar.plan.cost_params import read_cost_params

VERSION_KEY = "autopar_profile"
PROFILE_VERSION = 1
COLLECTIVES_USED = ("allreduce", "allgather", "reduce_scatter", "p2p")
FIX = "run `autopar profile -o FILE` again to write a fresh profile"
CALIBRATION_FORMAT = "autopar-calibration/1"
CALIBRATION_FIX = "run `autopar calibrate RUNS -o FILE` again to write a fresh calibration"


class Profile(dict):
    """A loaded, checked profile (a dict) plus where it came from."""

    path: str = ""
    sha256: str = ""

    @property
    def kind(self) -> str:
        """``calibration`` (only CostParams fields, fitted to measured runs) or ``profile`` (a measured machine)."""
        return "calibration" if self.get("format") == CALIBRATION_FORMAT else "profile"

    @property
    def device_type(self) -> str:
        return self["device"]["type"]

    @property
    def group_sizes(self) -> list[int]:
        return sorted(int(n) for n in self["communication"]["fits"])

    @property
    def dtype_bytes(self) -> int | None:
        """The training dtype the profile measured (None for a calibration: the model's own)."""
        return int(self["model"]["dtype_bytes"]) if self.kind == "profile" else None


def check_profile(doc) -> None:
    """Raise AutoparError (one line, naming the field) unless ``doc`` is a complete profile.

    Fields are read by ``autopar.fields``; keys beyond those the planner uses are allowed (the
    profile also records how it was measured).
    """
    top = Fields(doc, "profile", fix=FIX)
    if "format" in top.doc and VERSION_KEY not in top.doc:
        check_calibration(doc)
        return
    if VERSION_KEY not in top.doc:
        raise AutoparError(f"profile.{VERSION_KEY}", "is missing: neither an autopar profile nor a calibration",
                           "give a file written by autopar profile or autopar calibrate")
    if top.doc[VERSION_KEY] != PROFILE_VERSION:
        raise AutoparError(f"profile.{VERSION_KEY}", f"is version {top.doc[VERSION_KEY]!r}; this autopar reads "
                           f"version {PROFILE_VERSION}", FIX)
    dev = top.sub("device")
    dev.req_str("type")
    dev.req_int("nproc", low=1)
    model = top.sub("model")
    model.req_str("name")
    model.req_int("seq_len", low=1)
    model.req_int("dtype_bytes", low=1)
    unit_names = [as_str(u, f"profile.model.units[{i}]", fix=FIX) for i, u in enumerate(model.req_list("units"))]
    comp = top.sub("compute")
    comp.req_num("peak_tflops", gt=0)
    comp.req_num("hbm_gbps", gt=0)
    comm = top.sub("communication")
    fits = comm.sub("fits")
    for n in fits.doc:
        as_int(n, fits.at(n), low=2, fix=FIX)  # keys are group sizes
        per = fits.sub(n)
        for c in COLLECTIVES_USED:
            row = per.sub(c)
            row.req_num("alpha_s", ge=0)
            row.req_num("beta_s_per_byte", ge=0)
    if fits.doc:
        link = comm.sub("link")
        link.req_num("bw_gbps", gt=0)
        link.req_num("lat_us")
    mem = top.sub("memory")
    table = mem.sub("state_table")
    for z in range(4):
        row = table.sub(f"zero{z}")
        row.req_num("a")
        row.req_num("b")
    units = mem.sub("units")
    for name in unit_names:
        row = units.sub(name)
        for k in ("tp_params", "act_tp_bytes", "act_seq_bytes", "act_attn_bytes", "boundary_bytes"):
            row.req_num(k, ge=0)
    read_cost_params(top.req_mapping("cost_params"), "profile.cost_params", FIX, partial=True)


def check_calibration(doc) -> None:
    """Raise AutoparError (one line, naming the field) unless ``doc`` is a calibration: its format, the
    GPU types it was fitted on and its fitted cost parameters (typed and in range, as a plan's are)."""
    top = Fields(doc, "calibration", fix=CALIBRATION_FIX)
    top.req_str("format", choices=(CALIBRATION_FORMAT,), fix="give a file written by autopar calibrate")
    for i, g in enumerate(top.req_list("gpus", nonempty=True)):
        as_str(g, f"calibration.gpus[{i}]", fix=CALIBRATION_FIX)
    fitted = read_cost_params(top.req_mapping("cost_params"), "calibration.cost_params", CALIBRATION_FIX,
                              partial=True)
    links = top.sub("communication") if "communication" in top.doc else None  # measured links (nccl-tests)
    for key in (k for k in ("link", "inter_link") if links is not None and k in links.doc):
        links.sub(key).req_num("bw_gbps", gt=0)
        links.sub(key).req_num("lat_us", ge=0)
    if not fitted and not (links is not None and {"link", "inter_link"} & set(links.doc)):
        raise AutoparError("calibration.cost_params", "is empty", CALIBRATION_FIX)


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and check a profile or calibration file (``Profile.kind`` says which); AutoparError (one line)
    if it is missing, unreadable or incomplete."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise AutoparError("profile", f"cannot read {p}: {e.strerror or e}",
                           "give the file `autopar profile -o FILE` or `autopar calibrate -o FILE` wrote") from e
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
    """Check ``doc`` (a profile or a calibration) and write it as YAML (whole or not at all)."""
    doc = plain(doc)
    check_profile(doc)
    what = ("calibration: cost parameters fitted to measured runs (autopar calibrate --help)"
            if isinstance(doc, dict) and doc.get("format") == CALIBRATION_FORMAT
            else "profile: what this machine measured (autopar profile --help)")
    text = f"# autopar {what}\n"
    text += yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
    return write_text_atomic(path, text, "profile")
