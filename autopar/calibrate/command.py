"""``autopar calibrate RUNS... -o calibration.yaml``: its arguments and what it does (cli.py wires it in).

Load the runs (``inputs.load_inputs``), choose the fields (``table.choose``), refuse fields the runs
cannot identify, fit, cross-validate, then write the calibration whole and print (or ``--json``) its
figures. Every refusal comes before anything is written. ``--nccl-tests FILE...`` (``nccl_doc``): the
measured collectives and links, alone (a calibration of those only) or applied to the runs before the
fit and kept beside the fitted fields.
"""

from __future__ import annotations

import json

from autopar.calibrate.table import DEFAULT_FIT, FITTABLE, choose
from autopar.errors import AutoparError
from autopar.fields import int_at_least


def add_parser(sub) -> None:
    """The ``calibrate`` sub-command on the CLI's sub-parsers."""
    c = sub.add_parser("calibrate", help="fit cost parameters to measured step times (use with --profile)",
                       description="Fit cost parameters to measured runs and/or collectives measured by "
                       "nccl-tests; write a calibration that search/estimate accept with --profile.")
    c.add_argument("runs", nargs="*", metavar="RUNS", help="autopar-measured/1 files, or autopar-runs/1 files "
                   "(a list of {plan, measured_s})")
    c.add_argument("--nccl-tests", nargs="+", default=[], metavar="FILE", help="nccl-tests outputs (all_reduce_perf, "
                   "all_gather_perf, reduce_scatter_perf, alltoall_perf, sendrecv_perf; all_reduce=FILE etc. where the "
                   "output does not name it): measured collectives and links into the calibration")
    c.add_argument("--cluster", help="with --nccl-tests: the cluster (preset, inline spec or file) whose links the "
                   "measurements are compared with (default: the catalogue's for the GPU they ran on)")
    c.add_argument("--gpu", help="with --nccl-tests: the catalogue GPU the tables measured, where nccl-tests' device "
                   "name is not one")
    c.add_argument("-o", "--output", default="calibration.yaml", help="write the calibration here")
    c.add_argument("--cases", help="only these case ids (comma-separated)")
    c.add_argument("--group", help="only the runs of this group (same model, batch and cluster)")
    c.add_argument("--fit", help=f"fields to fit, comma-separated (default {','.join(DEFAULT_FIT)}; "
                   f"fittable: {', '.join(r.name for r in FITTABLE)}), or 'auto': those of them the runs identify "
                   "that forward selection keeps (each must lower the leave-one-out error)")
    c.add_argument("--folds", type=int_at_least("--folds", 2), default=5, help="cross-validation folds (leave-one-out up to 8 runs)")
    c.add_argument("--json", action="store_true", help="one JSON object on stdout")
    c.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    """Run ``autopar calibrate`` (see the module docstring); 0 on success, AutoparError on bad input."""
    # Imported here: every other command builds this parser, and the fit pulls in scipy and the estimate.
    from autopar.calibrate.document import calibration_doc, summary
    from autopar.calibrate.fit import fit, jacobian, predict, refusals
    from autopar.calibrate.inputs import load_inputs
    from autopar.calibrate.nccl_doc import nccl_calibration, nccl_summary
    from autopar.calibrate.score import cross_validate, identifiable, scores
    from autopar.calibrate.select import select_rows
    from autopar.profile.io import save_profile
    from cost_models import CostParams

    if not args.runs and not args.nccl_tests:
        raise AutoparError("calibrate", "has nothing to fit", "give RUNS (measured step times), --nccl-tests FILE "
                           "(measured collectives), or both")
    if (args.cluster or args.gpu) and not args.nccl_tests:
        raise AutoparError("--cluster" if args.cluster else "--gpu", "only applies to --nccl-tests",
                           "give --nccl-tests FILE, or leave it out")
    nccl = nccl_calibration(args.nccl_tests, args.cluster, args.gpu)[0] if args.nccl_tests else None
    if not args.runs:
        return _nccl_only(nccl, args)
    auto = args.fit == "auto"
    rows = list(FITTABLE) if auto else choose(args.fit)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()] if args.cases else None
    inputs = load_inputs(args.runs, cases, args.group)
    if nccl is not None:  # the runs are estimated with the measured collectives and links
        inputs = with_measured_comm(inputs, nccl)
    runs, start = inputs.runs, CostParams()  # the fitted fields start at the defaults (or their row's start)
    selection = None
    if auto:  # the fields the runs identify, then those that predict held-out runs (calibrate.select)
        ok, _ = identifiable(runs, rows, start)
        selection = select_rows(runs, ok, start) if ok else None
        if selection is None or not selection.rows:
            raise AutoparError("--fit auto", "no field lowers these runs' leave-one-out error",
                               "add runs that differ in what the fields price (see --help), or name fields")
        chosen = selection.rows
    else:
        bad = refusals(jacobian(runs, rows, start), rows)
        if bad:
            raise bad[0]
        chosen = rows
    done = fit(runs, chosen, start)
    cv = cross_validate(runs, rows, start, args.folds, auto=auto)  # auto: selection again inside every fold
    default_s = [float(x) for x in predict(runs, {})]
    groups, measured = [r.group for r in runs], [r.measured_s for r in runs]
    figures = {"default": scores(groups, default_s, measured), "in_sample": scores(groups, done.predicted_s, measured),
               "cv": scores(groups, cv.predicted_s, measured)}
    doc = calibration_doc(inputs, chosen, start, default_s, done, cv, figures)
    if selection is not None:
        doc["selection"] = {"chosen": [r.name for r in selection.rows], "press": selection.press,
                            "stopped": selection.stopped}
    text = summary(doc)
    if nccl is not None:
        text += "\n" + nccl_summary(nccl)
        doc = merged(doc, nccl)
    out = save_profile(doc, args.output)
    if args.json:
        print(json.dumps({"calibration": str(out), "cost_params": doc["cost_params"], "figures": figures,
                          "used": len(runs), "skipped": inputs.skipped, "fit": doc["fit"],
                          "communication": doc.get("communication", {})}))
        return 0
    print(text)
    print(f"wrote {out}")
    return 0


def _nccl_only(nccl: dict, args) -> int:
    """``autopar calibrate --nccl-tests FILE... -o OUT`` without runs: a calibration of the measured
    collectives and links alone."""
    from autopar.calibrate.nccl_doc import nccl_summary
    from autopar.profile.io import save_profile

    doc = {**_header(), **nccl}
    out = save_profile(doc, args.output)
    if args.json:
        print(json.dumps({"calibration": str(out), "cost_params": doc["cost_params"],
                          "communication": doc["communication"], "nccl_tests": doc["nccl_tests"]}))
        return 0
    print(nccl_summary(doc))
    print(f"wrote {out}")
    return 0


def _header() -> dict:
    import datetime

    from autopar.profile.io import CALIBRATION_FORMAT
    from autopar.version import __version__

    return {"format": CALIBRATION_FORMAT, "autopar": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def with_measured_comm(inputs, nccl: dict):
    """``inputs`` with every run estimated with the nccl-tests calibration (its ``comm_fit`` rows in the
    run's cost parameters, its links on the run's cluster), through ``apply_profile`` as ``--profile``
    would; a run on a GPU the tables did not measure is refused there."""
    from dataclasses import replace

    from autopar.profile.apply import apply_profile
    from autopar.profile.io import Profile, check_profile

    doc = {**_header(), **nccl}
    check_profile(doc)
    prof = Profile(doc)
    runs = []
    for r in inputs.runs:
        cluster, base = apply_profile(r.plan.cluster, r.base, prof)
        runs.append(replace(r, plan=replace(r.plan, cluster=cluster), base=base))
    return replace(inputs, runs=runs)


def merged(doc: dict, nccl: dict) -> dict:
    """The runs' calibration ``doc`` with the nccl-tests part: its comm_fit rows beside the fitted fields,
    its links, tables and reference; GPUs of both."""
    out = {**doc, **{k: v for k, v in nccl.items() if k not in ("gpus", "cost_params")}}
    out["gpus"] = sorted(set(doc["gpus"]) | set(nccl["gpus"]))
    out["cost_params"] = {**nccl["cost_params"], **doc["cost_params"]}
    return out
