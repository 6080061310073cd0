"""The `autopar` command line: parse, call the library, print. Errors: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from autopar.argparsing import Parser, fraction
from autopar.errors import AutoparError
from autopar.fields import int_at_least
from cost_models.precision import NAMES as PRECISIONS

EXIT_BAD_INPUT = 2


# -- estimate / validate ------------------------------------------------------------------------
def cmd_estimate(args) -> int:
    from autopar.estimate import estimate_plan
    from autopar.plan.validate import validate_plan
    from autopar.planned import check_predicted, load_planned
    from autopar.report import figures_line, plan_shape, plan_table

    planned = load_planned(args.plan, args.profile, check=True, precision=args.precision, trace=args.trace)
    plan, model, params = planned
    if args.memory_margin is not None:  # budgets only: the figures stay the plan's
        plan.cluster = plan.cluster.with_memory_margin(args.memory_margin)
    validate_plan(plan, model)  # structure only: an over-budget plan is still estimated (and flagged)
    est = estimate_plan(plan, model, params)
    if args.profile is None and args.precision is None and not args.trace:  # re-based figures differ from the stored ones
        check_predicted(plan, est)
    for note in planned.notes:  # stderr: --json keeps one object on stdout
        print(f"autopar: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"plan": args.plan, "predicted": est.predicted(), "fits": est.fits}))
        return 0
    print(f"autopar estimate: {model.name} on {plan.cluster.describe()}: {plan_shape(plan)}, {plan.precision}")
    print(plan_table(plan, est))
    print(f"predicted: {figures_line(est)}")
    if not est.fits:
        over = [d for d in est.memory_gib if est.memory_gib[d] > est.budget_gib[d]]
        print(f"warning: devices {over[:8]} exceed their memory budget")
    return 0


def _checked(path: str, memory: bool = True, force_hint: bool = False):
    """The plan at ``path`` after the plan rules: structure first (the estimate needs a well-formed plan:
    devices in range, TP dividing its stage), then, with ``memory``, every device's predicted peak
    against its budget (``force_hint``: that refusal mentions ``--force``).
    Returns (plan, estimate or None, notes to print)."""
    from autopar.estimate import estimate_plan
    from autopar.plan.rules import memory_rules
    from autopar.plan.validate import validate_plan
    from autopar.planned import check_predicted, check_stored_params, load_planned

    if not memory:
        from autopar.plan.io import load_plan

        plan = load_plan(path)
        note = check_stored_params(plan)
        validate_plan(plan)
        return plan, None, [note] if note else []
    planned = load_planned(path, check=True)
    plan, model, params = planned
    validate_plan(plan, model)
    est = estimate_plan(plan, model, params)
    check_predicted(plan, est)  # the stored figures must be what the plan estimates to now
    over = next(memory_rules(plan, est.memory_gib), None)  # structure passed above: memory alone is left
    if over is not None:
        field, problem, fix = over
        raise AutoparError(field, problem, f"{fix}; or pass --force to write the scripts anyway" if force_hint else fix)
    return plan, est, planned.notes


def cmd_validate(args) -> int:
    plan, est, notes = _checked(args.plan)
    print(f"{args.plan}: valid ({plan.world_size} devices, {len(plan.pipelines)} pipeline(s), "
          f"{sum(p.num_stages for p in plan.pipelines)} stage(s), peak {est.max_memory_gib:.1f} GiB recomputed from the model)")
    for note in notes:
        print(note)
    return 0


# -- profile ------------------------------------------------------------------------------------
def cmd_profile(args) -> int:
    from autopar.profile import save_profile
    from autopar.profile.profiler import run_profile
    from autopar.profile.reference import DEFAULT_MODEL
    from autopar.profile.report import profile_summary, summary_dict

    doc = run_profile(args.model or DEFAULT_MODEL, args.nproc, quick=args.quick, seq_len=args.seq_len,
                      device=args.device, progress=not args.json and sys.stderr.isatty())
    out = save_profile(doc, args.output)
    if args.json:
        print(json.dumps({"profile": str(out), **summary_dict(doc)}))
        return 0
    print(profile_summary(doc))
    print(f"wrote {out}")
    return 0


# -- launch / list ------------------------------------------------------------------------------
def cmd_launch(args) -> int:
    from autopar.launch import write_launch_scripts
    from autopar.launch.arguments import options_from

    plan, _, notes = _checked(args.plan, memory=not args.force, force_hint=True)
    for note in notes:
        print(f"autopar: {note}", file=sys.stderr)
    paths = write_launch_scripts(plan, args.script, args.output, scheduler=args.scheduler,
                                 script_args=args.script_args, options=options_from(args))
    for p in paths:
        print(p)
    return 0


def cmd_list(args) -> int:
    if args.what == "models":
        from autopar.modelspec.zoo import from_zoo, zoo_names
        from autopar.report import param_count

        for name in zoo_names():
            m = from_zoo(name)
            print(f"{name:<14} {param_count(m.num_params):>7} params  {m.num_layers:4d} units  hidden {m.hidden:<6} "
                  f"heads {m.num_heads}/{m.num_kv_heads or m.num_heads}  seq {m.seq_len}")
    elif args.what == "gpus":
        from autopar.cluster.catalogue import describe_gpu, gpu_names

        for name in gpu_names():
            print(describe_gpu(name))
    else:
        from autopar.cluster.parse import preset_description, preset_names

        names = preset_names()
        width = max(map(len, names))
        for name in names:  # the name is what --cluster takes
            print(f"{name:<{width}}  {preset_description(name)}")
        print("inline specs: 8xA100-80G, 2x8xH100, 4xcpu, 8x3090+8x4090+8xA100 ([nodes x] gpus x TYPE, '+' joins)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from autopar.version import __version__

    ap = Parser(prog="autopar", description="Search, estimate and launch hybrid-parallel training plans.")
    ap.add_argument("--version", action="version", version=f"autopar {__version__}", help="print the version and exit")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    from autopar.cli_search import add_parser as add_search  # parser and handler live there
    add_search(sub)

    e = sub.add_parser("estimate", help="predicted figures of a plan")
    e.add_argument("plan", help="a plan file written by autopar search")
    e.add_argument("--json", action="store_true", help="one JSON object on stdout")
    e.add_argument("--profile", metavar="FILE", help="estimate with this profile's measured numbers")
    e.add_argument("--precision", choices=PRECISIONS, help="estimate at this precision (default: the plan's)")
    e.add_argument("--trace", action="store_true", help="a plan searched on a HF config's formulas, estimated on its "
                   "traced transformers model: what autopar.wrap needs to run it")
    e.add_argument("--memory-margin", type=fraction("--memory-margin"),
                   help="hold the plan to this share of free memory per GPU (default: the plan's memory_margin)")
    e.set_defaults(func=cmd_estimate)

    pr = sub.add_parser("profile", help="measure this machine (compute, communication, memory) for a model")
    pr.add_argument("--model", default=None, help="zoo name or pkg.module:factory (default: the reference GPT, "
                    "autopar.profile.reference:gpt_cpu)")
    pr.add_argument("--nproc", type=int_at_least("--nproc"), default=2, help="local processes (group sizes 2..N)")
    pr.add_argument("--seq-len", type=int_at_least("--seq-len"), help="tokens per sample (default: the model's)")
    pr.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where to measure (auto: CUDA if visible)")
    pr.add_argument("--quick", action="store_true", help="fewer sizes and repeats (seconds, for tests)")
    pr.add_argument("-o", "--output", default="profile.yaml", help="write the profile here")
    pr.add_argument("--json", action="store_true", help="one JSON summary object on stdout")
    pr.set_defaults(func=cmd_profile)

    v = sub.add_parser("validate", help="check a plan against its model and cluster")
    v.add_argument("plan", help="a plan file written by autopar search")
    v.set_defaults(func=cmd_validate)

    from autopar.launch.arguments import add_parser as add_launch  # its flags live beside the scripts
    add_launch(sub, cmd_launch)

    li = sub.add_parser("list", help="list zoo models, GPUs or cluster presets")
    li.add_argument("what", choices=["models", "gpus", "clusters"],
                    help="models: the zoo names --model takes; gpus: the GPU catalogue with per-precision peaks; "
                    "clusters: the preset names --cluster takes, and the inline spec syntax")
    li.set_defaults(func=cmd_list)

    from autopar.calibrate.command import add_parser as add_calibrate  # parser and handler live there
    add_calibrate(sub)
    from autopar.show.command import add_parser as add_show  # parser and handler live there
    add_show(sub)
    __import__("autopar.export.command").export.command.add_parser(sub)  # parser and handler live there
    return ap


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like an error: the file writer removes its temporary file


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every refusal (bad flags included) is one stderr line ``autopar: error: ...``, exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare "--" goes to the training script (autopar launch PLAN ... -- --lr 3e-4).
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    main_thread = threading.current_thread() is threading.main_thread()
    caught = (signal.SIGTERM, signal.SIGHUP)  # a kill or a closed terminal: unwind, leave no temp file
    old = {s: signal.signal(s, _on_signal) for s in caught} if main_thread else {}
    try:
        args = build_parser().parse_args(argv)
        args.script_args = extra
        rc = args.func(args)
        sys.stdout.flush()
        return rc
    except AutoparError as e:
        print(f"autopar: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("autopar: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `autopar list gpus | head -1`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        return 141
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
