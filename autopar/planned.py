"""One path from a plan file to everything its estimate needs: the plan, its model and its cost parameters.

A plan is self-contained: it embeds its cluster and the cost parameters the search used
(``plan.search["cost_params"]``), and a plan searched with ``--profile`` also keeps the profile's
per-unit model numbers (``plan.search["profile"]``). ``load_planned`` rebuilds all of them, so
``estimate_plan(*load_planned(path))`` gives the very figures the search optimised and wrote into
the plan, and ``autopar estimate`` / ``autopar validate`` use this same function.

With ``profile=`` (a path or a loaded Profile) the plan is re-based on that profile instead: the
measured device figures replace the plan cluster's, the measured cost parameters replace the plan's,
and the model gets the profile's unit numbers (as ``autopar estimate --profile`` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from autopar.estimate.plan_cost import plan_cost_params
from autopar.modelspec.load import load_model
from autopar.modelspec.spec import ModelSpec
from autopar.plan.io import load_plan
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

    def __iter__(self):
        """``plan, model, params = load_planned(path)``: the arguments of ``estimate_plan`` in order."""
        return iter((self.plan, self.model, self.params))


def load_planned(path: str | os.PathLike, profile: str | os.PathLike | Profile | None = None) -> Planned:
    """The plan at ``path``, its model spec and cost parameters; re-based on ``profile`` when given.

    Raises AutoparError (one line) for a plan, model or profile that cannot be read or does not match.
    """
    plan = load_plan(path)
    source = plan.model.source or plan.model.name
    if profile is None:
        record = plan.search.get("profile")
        dtype = record.get("model", {}).get("dtype_bytes") if isinstance(record, dict) else None
        model = load_model(source, plan.model.seq_len, dtype_bytes=dtype)
        if record is not None:
            model = model_from_record(model, record)
        return Planned(plan, model, plan_cost_params(plan))
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    model = apply_profile_model(load_model(source, plan.model.seq_len, dtype_bytes=prof.dtype_bytes), prof)
    cluster, params = apply_profile(plan.cluster, plan_cost_params(plan), prof)
    plan = replace(plan, cluster=cluster, search={**plan.search, "profile": profile_record(prof)})
    return Planned(plan, model, params)
