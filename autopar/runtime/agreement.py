"""Every rank starts from the same plan, model and wrap settings: ``wrap``'s first collective checks it.

Ranks given different plan files (one layer's ZeRO level, a stage split) or different models would
build different process groups and schedules and wait on each other until the collective timeout.
``agreed_start`` reads the plan and the model's units and applies the plan rules on each rank
(locally, no collective), then ``agree`` all-gathers a digest of what the rank is about to run, with
any error the rank hit on the way. On a difference the canonical documents are gathered too and
every rank raises the same one-line AutoparError naming the first differing field and the ranks on
each side; a rank that failed on its own (a plan file missing on one node) is named to the others.

What is hashed (sha256 of canonical JSON), and why:

- the plan's execution fields: global batch size, schedule, each pipeline's batch share and
  micro-batching, each stage's devices, units and strategies. Not the planner's records (the
  embedded cluster, ``predicted``, ``search``, the memory budget): two files differing only there
  run identically (one re-estimated under another profile, say), so they are not refused;
- the model's structure: its units in order, each unit's class and its parameters' names, shapes
  and dtypes (not their values: a meta model is materialised from the seed on every rank);
- the ``wrap`` arguments that change what runs: seed, loss_parallel, on_nonfinite, ... and whether
  the model is on the meta device (its units are then materialised in rounds every rank joins).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch import nn

from autopar.errors import AutoparError
from autopar.models.hf import units_view
from autopar.plan.rules import id_ranges
from autopar.plan.schema import Plan
from autopar.runtime.checks import (
    check_batchnorm,
    check_plan,
    check_precision,
    check_tf32,
    tf32_matmuls,
    unit_experts,
)
from autopar.runtime.context_parallel import check_cp_model
from autopar.runtime.expert_parallel import check_moe_units
from autopar.runtime.ties import Tie, check_ties, untie
from autopar.units import UnitTPInfo, unit_tp_info, units

_FIXES = {"plan": "give every rank the same plan file", "model": "build the same model on every rank",
          "wrap": "pass the same wrap arguments on every rank"}
_ABSENT = "absent"


def rank_list(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2, 5``: consecutive runs compressed."""
    return f"rank{'s' if len(ranks) > 1 else ''} {id_ranges(sorted(ranks))}"


def plan_doc(plan: Plan) -> dict:
    """The fields of ``plan`` the runtime executes, as plain data (units expanded, one entry each)."""
    return {"global_batch_size": int(plan.global_batch_size), "schedule": plan.schedule, "pipelines": [
        {"batch_share": int(p.batch_share), "micro_batch_size": int(p.micro_batch_size),
         "num_microbatches": int(p.num_microbatches), "virtual_stages": int(p.virtual_stages),
         "stages": [{"devices": [int(d) for d in st.devices], "units": st.layer_names,
                     "strategies": {ly.name: asdict(ly.strategy) for ly in st.layers}} for st in p.stages]}
        for p in plan.pipelines]}


def model_doc(named: list[tuple[str, nn.Module]]) -> dict:
    """The model's structure: unit names in order, each unit's class and parameter shapes and dtypes."""
    return {"units": [n for n, _ in named],
            "unit": {n: {"class": type(m).__qualname__,
                         "params": {fqn: f"{tuple(p.shape)} {p.dtype}" for fqn, p in m.named_parameters()}}
                     for n, m in named}}


def _flatten(doc, path: str, out: dict) -> None:
    """Leaves of a nested document by field path; a list of scalars is one leaf."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            _flatten(v, f"{path}.{k}" if str(k).isidentifier() else f"{path}[{k}]", out)
    elif isinstance(doc, list) and any(isinstance(v, (dict, list)) for v in doc):
        for i, v in enumerate(doc):
            _flatten(v, f"{path}[{i}]", out)
    else:
        out[path.lstrip(".")] = doc


def first_difference(docs: list[dict]) -> AutoparError:
    """The error naming the first field (in rank order of appearance) whose value differs between ranks."""
    flats = []
    for doc in docs:
        flats.append({})
        _flatten(doc, "", flats[-1])
    order = list(dict.fromkeys(p for f in flats for p in f))
    for path in order:
        shown = [_short(f.get(path, _ABSENT)) for f in flats]
        if len(set(shown)) > 1:
            sides = {v: [r for r, s in enumerate(shown) if s == v] for v in dict.fromkeys(shown)}
            text = "; ".join(f"{v} on {rank_list(rs)}" for v, rs in sides.items())
            return AutoparError(path, f"differs between ranks: {text}", _FIXES[path.split(".")[0]])
    return AutoparError("wrap", "the ranks' digests differ but no field does", "report this as a bug")


def _short(value) -> str:
    text = value if value == _ABSENT else json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _summary(error: BaseException | None):
    if error is None:
        return None
    if isinstance(error, AutoparError):
        return ("autopar", error.field, error.problem, error.fix)
    return ("other", f"{type(error).__name__}: {error}")


def agree(doc: dict | None, error: BaseException | None) -> None:
    """Collective over the default group: raise, the same on every rank, unless every rank holds the
    same ``doc`` and none hit an error. A rank's own error is re-raised there (its traceback kept)."""
    digest = None if doc is None else hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
    views: list = [None] * dist.get_world_size()
    dist.all_gather_object(views, (digest, _summary(error)))
    digests = [d for d, _ in views]
    if None not in digests and len(set(digests)) > 1:
        docs: list = [None] * len(views)
        dist.all_gather_object(docs, doc)
        raise first_difference(docs) from error
    failed = {}
    for r, (_, s) in enumerate(views):
        if s is not None:
            failed.setdefault(s, []).append(r)
    if not failed:
        return
    summary, ranks = next(iter(failed.items()))
    if len(ranks) == len(views) and error is not None:
        raise error  # the same verdict everywhere (the plan rules are pure): each rank raises its own
    where = rank_list(ranks)
    if summary[0] == "autopar":
        raise AutoparError(summary[1], f"on {where}: {summary[2]}", summary[3]) from error
    if error is not None and _summary(error) == summary:
        raise error
    raise AutoparError("wrap", f"{where} failed before the first collective: {summary[1]}",
                       f"see the traceback of {where}") from error


def agreed_start(model: nn.Module, plan: Plan | str | os.PathLike, world_size: int, settings: dict, device: torch.device
                 ) -> tuple[Plan, list[tuple[str, nn.Module]], dict[str, UnitTPInfo], list[Tie], object | None]:
    """Load the plan, read the model's units and check them on this rank, then ``agree`` (a collective).

    Returns (plan, named units, their TP facts, the ties between units, a transformers model's
    ``autopar.models.hf.HFSource`` or None: ``ParallelModel.load_hf`` / ``save_hf``) once every rank holds the same
    and all passed.
    Units sharing a tensor or module get their own copies (``ties.untie``).
    """
    doc = error = hf_source = None
    ties: list[Tie] = []
    try:
        if isinstance(plan, (str, os.PathLike)):
            from autopar.plan.io import load_plan

            plan = load_plan(plan)
        model = units_view(model)  # a transformers model: its embed / layers / head view (same weights)
        hf_source = getattr(model, "hf_source", None)
        named = units(model)
        infos = {n: unit_tp_info(model, n, m) for n, m in named}
        doc = {"plan": plan_doc(plan), "model": model_doc(named), "wrap": settings}
        check_plan(plan, [n for n, _ in named], infos, world_size, unit_experts(named))
        named, ties = untie(named)
        check_ties(ties, plan)
        check_batchnorm(plan, named)
        check_precision(plan, named)
        check_tf32(plan.precision, tf32_matmuls(device))  # the rate the plan was priced at
        check_cp_model(plan, model)
        check_moe_units(plan, named)
    except Exception as e:  # noqa: BLE001  (every rank must hear of it before anyone waits on a peer)
        error = e
    agree(doc, error)
    return plan, named, infos, ties, hf_source
