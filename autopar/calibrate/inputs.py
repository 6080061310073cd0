"""What ``autopar calibrate`` fits to: measured runs from ``autopar-measured/1`` files and plan files
with a measured step time (``autopar-runs/1``), each a plan, its model and the seconds per step.

``autopar-runs/1`` (plan paths relative to the file)::

    format: autopar-runs/1
    runs:
      - {id: a, plan: plan_a.yaml, measured_s: 1.23}    # id optional: the plan's file name

A plan is loaded with ``autopar.planned.load_planned`` (checked: its stored cost parameters must be
this autopar's defaults, its figures what it estimates to) and must be searched without ``--profile``
(a calibration fits the default cost parameters) and pass the plan rules for its model.

Nothing is dropped silently: a measured case that cannot be estimated (inexpressible, suspect,
unpublished, failed) is returned as skipped with its reason; an unknown GPU or a plan the rules refuse,
a missing field, a time that is not a positive number is an AutoparError naming the case and field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autopar.errors import AutoparError
from autopar.estimate import plan_cost_params
from autopar.fields import Fields, as_list, as_str
from autopar.measured import load_runs
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from autopar.plan.validate import plan_problems
from autopar.planned import load_planned
from cost_models import CostParams

MEASURED_FORMAT = "autopar-measured/1"
RUNS_FORMAT = "autopar-runs/1"
HARD_SKIPS = ("unknown GPU", "refused")  # bad input, not a limitation of autopar: refused, never skipped


@dataclass(frozen=True)
class CalRun:
    """One run to fit to: ``group`` names the runs that did the same work on the same cluster; ``base``:
    the cost parameters the run is estimated with (the plan's own: the defaults at its precision), which
    the fitted fields replace."""

    case_id: str
    plan: Plan
    model: ModelSpec
    measured_s: float
    group: str
    source: str
    base: CostParams
    measured_memory_gib: float | None = None  # the published peak per GPU, where there is one

    @property
    def gpus(self) -> list[str]:
        return list(dict.fromkeys(nd.gpu.name for nd in self.plan.cluster.nodes))


@dataclass
class Inputs:
    """The runs to fit and every case left out, as ``{id, source, reason, detail}``."""

    runs: list[CalRun] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    @property
    def gpus(self) -> list[str]:
        return sorted({g for r in self.runs for g in r.gpus})


def _format(path: Path) -> str:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise AutoparError(str(path), f"cannot be read ({' '.join(str(err).split())[:120]})",
                           f"give {MEASURED_FORMAT} or {RUNS_FORMAT} YAML files") from err
    return Fields(doc, f"{path.name}:").req_str("format", choices=(MEASURED_FORMAT, RUNS_FORMAT))


def _measured(path: Path, out: Inputs) -> None:
    rs = load_runs(path)
    for run in rs.runs:
        out.runs.append(CalRun(run.case_id, run.plan, run.model, float(run.measured_s), run.group, rs.name,
                               plan_cost_params(run.plan), run.measured_memory_gib))
    for run in rs.failed:
        out.skipped.append({"id": run.case_id, "source": rs.name, "reason": "failed",
                            "detail": "did not run (no step time to fit)"})
    for s in rs.skipped:
        out.skipped.append({"id": s.case_id, "source": rs.name, "reason": s.reason, "detail": s.detail})


def _planned(path: Path, out: Inputs) -> None:
    top = Fields(yaml.safe_load(path.read_text()), f"{path.name}:", keys=("format", "runs"))
    for i, raw in enumerate(as_list(top.raw("runs", what="a list of {plan, measured_s}"), top.at("runs"),
                                    nonempty=True)):
        c = Fields(raw, f"{top.at('runs')}[{i}]", kind="run", keys=("id", "plan", "measured_s"))
        rel = as_str(c.raw("plan", what="a plan file"), c.at("plan"))
        case = c.opt_str("id", None) or Path(rel).stem
        c = Fields(raw, f"{path.name}:run {case}", kind="run", keys=("id", "plan", "measured_s"))
        measured = c.req_num("measured_s", gt=0, fix="give the measured seconds per step (> 0)")
        try:
            planned = load_planned(path.parent / rel, check=True)
        except AutoparError as err:
            raise AutoparError(f"{c.at('plan')} ({rel})", f"{err.field}: {err.problem}", err.fix) from err
        plan, model = planned.plan, planned.model
        if plan.search.get("profile") is not None:
            raise AutoparError(c.at("plan"), f"{rel} was searched with --profile: a calibration fits the default "
                               "cost parameters", "search the plan again without --profile")
        problems = plan_problems(plan, model)
        if problems:
            raise AutoparError(c.at("plan"), f"{rel} does not match its model: {problems[0]}",
                               "give the plan autopar search wrote for this model")
        group = f"{model.name} s{model.seq_len} gbs{plan.global_batch_size} on {plan.cluster.describe()}"
        out.runs.append(CalRun(case, plan, model, measured, group, path.name, planned.params))


def _select(found: Inputs, cases: list[str] | None, group: str | None) -> Inputs:
    """The runs of ``cases`` / ``group`` (every one named must exist); hard skips among them are refused."""
    ids = [r.case_id for r in found.runs] + [s["id"] for s in found.skipped]
    for cid in cases or ():
        if cid not in ids:
            raise AutoparError("--cases", f"no case {cid!r} in the runs given", "name case ids from the files")
    groups = list(dict.fromkeys(r.group for r in found.runs))
    if group is not None and group not in groups:
        raise AutoparError("--group", f"no group {group!r} in the runs given", f"pick one of: {'; '.join(groups[:6])}")
    out = Inputs([r for r in found.runs if (cases is None or r.case_id in cases) and group in (None, r.group)],
                 [s for s in found.skipped if cases is None or s["id"] in cases])
    for s in out.skipped:
        if s["reason"] in HARD_SKIPS:
            detail = s["detail"] if s["reason"] == "unknown GPU" else f"{s['source']}:case {s['id']}: " \
                f"the plan rules refuse the plan: {s['detail']}"
            raise AutoparError("RUNS", detail, "fix the case, or leave it out with --cases")
    return out


def load_inputs(paths: list[str], cases: list[str] | None = None, group: str | None = None) -> Inputs:
    """Every run of the files at ``paths`` (see the module docstring), restricted to ``cases`` (case ids)
    or ``group`` (a group name) when given; AutoparError (one line) for bad input or no run left."""
    found = Inputs()
    for p in paths:
        path = Path(p)
        (_measured if _format(path) == MEASURED_FORMAT else _planned)(path, found)
    seen: dict[str, str] = {}
    for r in found.runs:
        if r.case_id in seen:
            raise AutoparError("RUNS", f"case id {r.case_id!r} is in both {seen[r.case_id]} and {r.source}",
                               "give every run its own id")
        seen[r.case_id] = r.source
    out = _select(found, cases, group)
    if len(out.runs) < 2:
        raise AutoparError("RUNS", f"{len(out.runs)} usable run(s) ({len(out.skipped)} skipped): a fit and its "
                           "cross-validation need at least 2", "give more measured runs")
    return out
