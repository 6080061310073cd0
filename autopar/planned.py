"""One path from a plan file to everything its estimate needs: the plan, its model and its cost parameters.

A plan is self-contained: it embeds its cluster and the cost parameters the search used
(``plan.search["cost_params"]``), and a plan searched with ``--profile`` also keeps the profile's
per-unit model numbers (``plan.search["profile"]``). ``load_planned`` rebuilds all of them, so
``estimate_plan(*load_planned(path))`` gives the very figures the search optimised and wrote into
the plan, and ``autopar estimate`` / ``autopar validate`` use this same function.

With ``profile=`` (a path or a loaded Profile) the plan is re-based on that profile instead: the
measured device figures replace the plan cluster's, the measured cost parameters replace the plan's,
and the model gets the profile's unit numbers (as ``autopar estimate --profile`` does). A calibration
(``autopar calibrate``) is accepted the same way and replaces the cost parameters it fitted, nothing else.

The CLI trusts none of the plan's own numbers (``check=True``, ``check_predicted``): the stored cost
parameters must be this autopar's defaults or what the recorded profile gives, and the stored
``predicted`` figures must be what the plan estimates to now; otherwise "tampered or written by
another version", one line.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace

from autopar.cluster.cluster import PEAK_FIELDS
from autopar.cluster.parse import load_cluster
from autopar.errors import AutoparError
from autopar.estimate.plan_cost import PlanEstimate, plan_cost_params
from autopar.modelspec.load import load_model
from autopar.modelspec.spec import ModelSpec
from autopar.plan.io import load_plan
from autopar.plan.precision import activation_bytes, at_precision, precision_params
from autopar.plan.schema import Plan
from autopar.profile import (
    Profile,
    apply_profile,
    apply_profile_model,
    load_profile,
    model_from_record,
    profile_record,
)
from cost_models import CostParams


@dataclass
class Planned:
    """A loaded plan with the model spec and cost parameters its figures were computed with."""

    plan: Plan
    model: ModelSpec
    params: CostParams
    notes: list[str] = field(default_factory=list)  # what could not be checked, a profile that differs

    def __iter__(self):
        """``plan, model, params = load_planned(path)``: the arguments of ``estimate_plan`` in order."""
        return iter((self.plan, self.model, self.params))


def load_planned(path: str | os.PathLike, profile: str | os.PathLike | Profile | None = None, *,
                 check: bool = False, precision: str | None = None, trace: bool = False) -> Planned:
    """The plan at ``path``, its model spec and cost parameters; re-based on ``profile`` when given.

    ``check``: refuse stored cost parameters that are not what this autopar searches with
    (``check_stored_params``). ``notes`` of the result: a profile that could not be re-checked, or a
    ``profile`` other than the one the plan was searched with (its figures are then the profile's).
    ``precision``: estimate the plan at this precision instead of its own (``autopar estimate
    --precision``): its GPUs, cost parameters and the model's activations at that precision.
    ``trace``: the model of a formula family's HF config traced (``autopar estimate --trace``: the plan as
    ``autopar.wrap`` runs the transformers model; ``modelspec.hf.from_hf_config``).
    The model's activations are at the plan's precision (``activation_bytes``), a profiled plan's at
    the profile's dtype. Raises AutoparError (one line) for a plan, model or profile that cannot be
    read or does not match.
    """
    plan = load_plan(path)
    prof = None if profile is None else profile if isinstance(profile, Profile) else load_profile(profile)
    notes = [check_stored_params(plan, prof)] if check else []
    if precision is not None and precision != plan.precision:
        cluster, params = at_precision(plan.cluster, plan_cost_params(plan), precision,
                                       profiled=_machine(prof) or _machine(plan.search.get("profile")))
        plan = replace(plan, cluster=cluster, search={**plan.search, "cost_params": params.to_dict()})
    record = plan.search.get("profile")
    if prof is not None and isinstance(record, dict) and record.get("sha256") != prof.sha256:
        notes.append(f"plan.search.profile: the plan was searched with profile {record.get('path', '?')} "
                     f"(sha256 {str(record.get('sha256'))[:12]}), not {prof.path} ({prof.sha256[:12]}); "
                     f"the figures are {prof.path}'s")
    notes = [n for n in notes if n]
    source = plan.model.source or plan.model.name
    if prof is None:
        dtype = record.get("model", {}).get("dtype_bytes") if isinstance(record, dict) else None
        model = load_model(source, plan.model.seq_len, dtype_bytes=dtype or activation_bytes(plan.precision),
                           trace=trace)
        if record is not None:
            model = model_from_record(model, record)
        return Planned(plan, model, plan_cost_params(plan), notes)
    at_precision(plan.cluster, plan_cost_params(plan), plan.precision, profiled=_machine(prof))  # a profile: bf16
    dtype = prof.dtype_bytes if _machine(prof) else activation_bytes(plan.precision)
    model = apply_profile_model(load_model(source, plan.model.seq_len, dtype_bytes=dtype, trace=trace), prof)
    cluster, params = apply_profile(plan.cluster, plan_cost_params(plan), prof)
    plan = replace(plan, cluster=cluster, search={**plan.search, "profile": profile_record(prof)})
    return Planned(plan, model, params, notes)


def _machine(profile: Profile | dict | None) -> bool:
    """Whether ``profile`` (a loaded file or a plan's record of one) is a machine profile, measured in the
    runtime's own dtype (a calibration only replaces cost parameters: any precision goes with it)."""
    if isinstance(profile, Profile):
        return profile.kind == "profile"
    return profile is not None and not (isinstance(profile, dict) and profile.get("kind") == "calibration")


def _same(a: object, b: object) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return a == b


def _recorded_profile(record: dict) -> Profile | None:
    """The profile file a plan recorded, when it is still there as a regular file with the recorded sha256."""
    path = record.get("path")
    if not isinstance(path, str) or not os.path.isfile(path) or os.path.getsize(path) > 64 << 20:
        return None
    try:
        prof = load_profile(path)
    except AutoparError:
        return None
    return prof if prof.sha256 == record.get("sha256") else None


def check_stored_params(plan: Plan, profile: Profile | None = None) -> str:
    """Refuse a plan whose stored cost parameters differ from what this autopar searches with: the
    defaults (``CostParams()``) for a plan without a profile record, what ``apply_profile`` makes of
    the recorded profile (``profile`` or the recorded file, when its sha256 matches) otherwise.
    Returns a note when the recorded profile is not at hand (then the fields' ranges alone were checked)."""
    stored, record = plan_cost_params(plan), plan.search.get("profile")
    if record is None:
        expected, what, word, prof = precision_params(plan.precision), "this autopar's defaults", "default", None
    else:
        if not isinstance(record, dict):
            raise AutoparError("plan.search.profile", "is not a mapping", "search the plan again with --profile")
        at_precision(plan.cluster, stored, plan.precision, profiled=_machine(record))  # a profiled plan: bf16
        prof = profile if profile is not None and profile.sha256 == record.get("sha256") else _recorded_profile(record)
        if prof is None:
            kind = "calibration" if record.get("kind") == "calibration" else "profile"
            _check_cluster_source(plan, None, measured=True, network=kind == "calibration")
            return (f"note: {kind} {record.get('path', '?')} (sha256 {str(record.get('sha256'))[:12]}) is not here: "
                    "the plan's cost parameters were checked for range only (pass --profile to re-check them)")
        expected = apply_profile(plan.cluster, precision_params(plan.precision), prof)[1]
        what, word = f"what {prof.kind} {prof.path} gives", prof.kind
    for f in fields(CostParams):
        a, b = getattr(stored, f.name), getattr(expected, f.name)
        if not _same(a, b):
            raise AutoparError("plan.search.cost_params", f"differ from {what} (field {f.name}: stored {a!r:.40}, "
                               f"{word} {b!r:.40}): tampered or written by another version", "search the plan again")
    _check_cluster_source(plan, prof)
    return ""


def _first_difference(a: object, b: object, path: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            found = _first_difference(a.get(k), b.get(k), f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _first_difference(x, y, f"{path}[{i}]"))), None)
    return None if _same(a, b) else f"{path}: stored {a!r:.40}, rebuilt {b!r:.40}"


def _check_cluster_source(plan: Plan, profile: Profile | None, measured: bool = False, network: bool = False) -> None:
    """A plan's cluster named by a preset or an inline spec (not a file, which may change) must be what
    that name gives now (after the recorded ``profile``); ``measured``: a profiled plan whose profile is
    not here, whose measured figures (peak, HBM and intra-node link; with ``network``, a calibration's,
    the network too: nccl-tests may have measured it) are then taken as stored."""
    name = plan.cluster.name
    if not name or name.lower().endswith((".yaml", ".yml", ".json")) or os.sep in name or os.path.exists(name):
        return
    try:
        rebuilt = load_cluster(name)
    except AutoparError:
        return  # not a spec this autopar reads: nothing to compare with
    if profile is not None:
        rebuilt = apply_profile(rebuilt, CostParams(), profile)[0]
    elif measured and len(rebuilt.nodes) == len(plan.cluster.nodes):
        rebuilt = replace(rebuilt, nodes=[replace(r, gpu=replace(r.gpu, tflops=s.gpu.tflops, hbm_gbps=s.gpu.hbm_gbps),
                                                  intra_bw_gbps=s.intra_bw_gbps, intra_lat_us=s.intra_lat_us)
                                          for r, s in zip(rebuilt.nodes, plan.cluster.nodes)])
        if network:
            rebuilt = replace(rebuilt, inter_bw_gbps=plan.cluster.inter_bw_gbps, inter_lat_us=plan.cluster.inter_lat_us)
    stored, fresh = plan.cluster.to_dict(), rebuilt.to_dict()
    stored.pop("meta", None)
    fresh.pop("meta", None)
    for old, new in zip(stored["nodes"], fresh["nodes"]):  # plans written before a peak column existed lack it
        for key in PEAK_FIELDS:
            if key not in old["gpu"]:
                new["gpu"].pop(key, None)
    diff = _first_difference(stored, fresh, "cluster")
    if diff:
        raise AutoparError("plan.cluster", f"differs from what {name!r} gives ({diff}): tampered or written by "
                           "another version", f"search the plan again with --cluster {name}")


PREDICTED = ("step_time_s", "tokens_per_s", "tps", "tflops", "mfu", "max_memory_gib")


def check_predicted(plan: Plan, est: PlanEstimate) -> None:
    """Refuse a plan whose stored ``predicted`` figures differ (rel 1e-6; per-stage memory to its 3
    decimals) from the estimate recomputed from its model and checked cost parameters."""
    now = est.predicted()
    pairs = [(k, plan.predicted.get(k), now[k]) for k in PREDICTED if k in plan.predicted]
    stored_stages = (plan.predicted.get("memory_gib") or {}).get("per_stage") \
        if isinstance(plan.predicted.get("memory_gib"), dict) else None
    if stored_stages is not None:
        got = [x for p in stored_stages for x in p] if isinstance(stored_stages, list) and all(
            isinstance(p, list) for p in stored_stages) else [stored_stages]
        want = [x for p in now["memory_gib"]["per_stage"] for x in p]
        ok = len(got) == len(want) and all(isinstance(g, (int, float)) and not isinstance(g, bool)
                                           and abs(g - w) <= 2e-3 for g, w in zip(got, want))
        if not ok:
            pairs.append(("memory_gib.per_stage", stored_stages, now["memory_gib"]["per_stage"]))
    for key, stored, fresh in pairs:
        number = isinstance(stored, (int, float)) and not isinstance(stored, bool)
        if isinstance(fresh, list) or not number or not math.isclose(stored, fresh, rel_tol=1e-6):
            raise AutoparError(f"predicted.{key}", f"is {stored!r:.40} but the plan estimates to {fresh!r:.40}: "
                               "tampered or written by another version", "search the plan again")
