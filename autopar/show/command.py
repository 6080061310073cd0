"""``autopar show PLAN -o plan.png|.svg|.html`` and the search's ``--report``: arguments and what they do
(cli.py wires them in). Every refusal (an unknown extension, no matplotlib, a bad plan) comes before
anything is drawn or written: one line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

from autopar.fileio import write_text_atomic

FIELD = "autopar show"


def add_parser(sub) -> None:
    """The ``show`` sub-command on the CLI's sub-parsers."""
    s = sub.add_parser("show", help="draw a plan: pipeline schedule, memory per device, cluster map",
                       description="Draw a plan with the figures of `autopar estimate`: the pipeline schedule per "
                       "stage, memory per device by part against its budget, and the cluster map. "
                       "Needs matplotlib (pip install 'autopar[show]').")
    s.add_argument("plan", help="a plan file (autopar search -o)")
    s.add_argument("-o", "--output", default="plan.png", help="plan.png, plan.svg (the pictures stacked) or "
                   "plan.html (one self-contained page, the pictures inline as SVG); default plan.png")
    s.add_argument("--profile", metavar="FILE", help="draw with this profile's measured numbers (as estimate --profile)")
    s.set_defaults(func=cmd_show)


def cmd_show(args) -> int:
    """Run ``autopar show``: load and check the plan as ``estimate`` does, draw, write the file."""
    import sys

    from autopar.errors import AutoparError
    from autopar.estimate import estimate_plan
    from autopar.plan.validate import validate_plan
    from autopar.planned import check_predicted, load_planned
    from autopar.show.render import need_matplotlib, output_format, plan_pictures, stacked, undrawable

    fmt = output_format(args.output)
    need_matplotlib(FIELD)
    planned = load_planned(args.plan, args.profile, check=True)
    plan, model, params = planned
    validate_plan(plan, model)
    est = estimate_plan(plan, model, params)
    if args.profile is None:
        check_predicted(plan, est)
    for note in planned.notes:
        print(f"autopar: {note}", file=sys.stderr)
    problem = undrawable(plan)
    if problem is not None:
        raise AutoparError("plan.schedule", problem, "`autopar estimate PLAN` prints its figures; show draws 1f1b "
                           "and gpipe plans")
    pictures = plan_pictures(plan, model, est, params)
    if fmt == ".html":
        from autopar.show.page import plan_page

        data: str | bytes = plan_page(plan, est, pictures, f"autopar plan: {model.name} on {plan.cluster.describe()}")
    else:
        data = stacked(pictures, fmt[1:])
    out = write_text_atomic(args.output, data, "-o")
    print(f"wrote {out}")
    return 0


def check_report(path: str | None) -> None:
    """``search --report``: refuse a path that is not .html, a directory, one under a file or an unwritable
    directory, or a missing matplotlib, before searching (the plan is written before the report)."""
    if path is None:
        return
    from autopar.errors import AutoparError
    from autopar.show.render import need_matplotlib, output_format

    if output_format(path, "--report") != ".html":
        raise AutoparError("--report", f"the report is an HTML page, got {path!r}", "give a file ending in .html")
    target = Path(path).resolve()
    if target.is_dir():
        raise AutoparError("--report", f"{path} is a directory; only regular files are written",
                           "give the path of a file to create or replace")
    parent = next(p for p in target.parents if p.exists())  # the writer creates the missing ones
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise AutoparError("--report", f"cannot write {path}: {parent} is not a writable directory",
                           "choose a writable path")
    need_matplotlib("--report")


def write_report(path: str, res, model, params, summary: str, seconds_line: str) -> str:
    """Write the search report of ``res`` (a SearchResult for ``model`` scored with ``params``) to ``path``."""
    from autopar.search.rules import describe
    from autopar.show.page import report_page
    from autopar.show.render import baselines_picture, plan_pictures

    title = f"{model.name} on {res.plan.world_size} devices"
    pictures = plan_pictures(res.plan, model, res.estimate, params, title)
    base = baselines_picture(res.estimate, res.baselines, title)
    if base is not None:
        pictures.append(base)
    return str(write_text_atomic(path, report_page(res, summary, seconds_line, pictures, describe), "--report"))
