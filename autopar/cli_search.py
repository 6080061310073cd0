"""``autopar search``: its flags and its handler, beside ``autopar.cli`` (the other commands) at the top of
the architecture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autopar.argparsing import fraction, positive_float
from autopar.errors import AutoparError
from autopar.fields import int_at_least
from cost_models.precision import NAMES as PRECISIONS

DEFAULT_PLAN = "plan.yaml"  # where search writes without -o (it must not exist yet)


def add_parser(sub) -> None:
    """The ``search`` sub-command on ``sub`` (argparse sub-parsers)."""
    s = sub.add_parser("search", help="search the fastest plan that fits and write it")
    s.add_argument("--model", required=True, help="zoo name (autopar list models), HF config.json, or "
                   "pkg.module:factory")
    s.add_argument("--trace", action="store_true", help="with a HF config.json: trace its transformers model (what "
                   "autopar.wrap runs: HF's own norms and kernels) where formulas would count fused kernels (the "
                   "frameworks autopar export writes for); needs transformers")
    s.add_argument("--cluster", required=True, help="preset (autopar list clusters), inline spec like 2x8xA100-80G, "
                   "or a YAML file")
    s.add_argument("--global-batch-size", required=True, type=int_at_least("--global-batch-size"),
                   help="samples per optimizer step, over all devices")
    s.add_argument("--seq-len", type=int_at_least("--seq-len"), help="tokens per sample (default: the model's)")
    s.add_argument("--memory-budget", type=positive_float("--memory-budget"),
                   help="GiB per device (default: each GPU's memory)")
    s.add_argument("--memory-margin", type=fraction("--memory-margin"), default=0.0,
                   help="share of each GPU's memory plans keep free, e.g. 0.1 (a safety margin)")
    s.add_argument("--time-budget", type=positive_float("--time-budget"),
                   help="stop after this many seconds with the best plan so far (default: search to the end)")
    s.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b", help="pipeline schedule")
    s.add_argument("--max-tp", type=int_at_least("--max-tp"), metavar="N",
                   help="largest TP degree to try (default: as the nodes allow; 1: no tensor parallelism, e.g. for a "
                   "family wrap runs with tp 1, docs/models.md)")
    s.add_argument("-o", "--output", metavar="PLAN", help=f"write the plan here, replacing an existing file "
                   f"(default: {DEFAULT_PLAN}, which must not exist yet)")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")
    s.add_argument("--explain", action="store_true", help="show the pruning rules and the configurations")
    s.add_argument("--no-baselines", action="store_true", help="skip the baseline plans (DDP, ZeRO-3, Megatron)")
    s.add_argument("--profile", metavar="FILE", help="measured numbers from `autopar profile` (or a calibration) "
                   "instead of catalogue ones")
    s.add_argument("--precision", choices=PRECISIONS, default="bf16", help="training precision")
    s.add_argument("--report", metavar="FILE.html", help="also write a report page: plan, why it won, pictures "
                   "(needs matplotlib)")
    s.set_defaults(func=cmd_search)


def cmd_search(args) -> int:
    """``autopar search``: load, search, validate, write the plan, print (or ``--json``) why it won."""
    from autopar.cluster.parse import load_cluster
    from autopar.modelspec.hf import counts_fused_kernels
    from autopar.modelspec.load import load_model
    from autopar.plan.io import save_plan
    from autopar.plan.precision import activation_bytes, at_precision
    from autopar.plan.validate import validate_plan
    from autopar.profile import load_profile
    from autopar.report import baseline_table, figures_line, param_count, plan_shape, plan_table
    from autopar.search import SearchOptions, search
    from autopar.show.command import check_report

    check_report(args.report)  # a bad --report path or no matplotlib: refused before the search
    out = _search_output(args.output)
    profile = load_profile(args.profile) if args.profile else None
    measured = profile is not None and profile.kind == "profile"  # a calibration goes with any precision
    model = load_model(args.model, args.seq_len, trace=args.trace,
                       dtype_bytes=profile.dtype_bytes if measured else activation_bytes(args.precision))
    opts = SearchOptions(memory_budget_gib=args.memory_budget, time_budget_s=args.time_budget,
                         schedule=args.schedule, progress=not args.json and sys.stderr.isatty(), max_tp=args.max_tp)
    cluster, opts.params = at_precision(load_cluster(args.cluster), opts.params, args.precision, profiled=measured)
    cluster = cluster.with_memory_margin(args.memory_margin)
    if profile is not None:  # measured numbers in place of catalogue figures (autopar/profile/apply.py)
        from autopar.profile import apply_profile, apply_profile_model

        model = apply_profile_model(model, profile)
        cluster, opts.params = apply_profile(cluster, opts.params, profile)
    res = search(model, cluster, args.global_batch_size, opts, with_baselines=not args.no_baselines)
    if profile is not None:
        from autopar.profile import profile_record

        res.plan.search["profile"] = profile_record(profile)
    est = res.estimate
    validate_plan(res.plan, model, est.memory_gib)
    save_plan(res.plan, out)
    base = {k: (v[1].predicted() if v else None) for k, v in res.baselines.items()}
    active = f", {param_count(model.active_params)} active" if model.num_experts else ""  # MoE: total and active
    summary = (f"autopar: {model.name} (seq {model.seq_len}, {param_count(model.num_params)} params{active}, "
               f"{model.num_layers} units) on {cluster.describe()} ({cluster.num_devices} devices), "
               f"global batch {args.global_batch_size}, {res.plan.precision}")
    seconds = f"search: {res.seconds:.1f} s (plan)" + (f" + {res.baseline_seconds:.1f} s (baselines)"
                                                        if res.baselines else "")
    if args.report:
        from autopar.show.command import write_report

        report = write_report(args.report, res, model, opts.params, summary, seconds)
    if args.json:
        print(json.dumps({
            "plan": str(out),
            "predicted": {k: res.plan.predicted[k] for k in ("step_time_s", "tokens_per_s", "tps", "tflops",
                                                               "mfu", "max_memory_gib")},
            "search": {"seconds": res.seconds, "baseline_seconds": res.baseline_seconds,
                       "candidates": res.candidates, "pruned": res.pruned,
                       "planner": res.planner, "timed_out": res.timed_out,
                       **{k: res.plan.search[k] for k in ("partitioner",) if k in res.plan.search}},
            "baselines": base,
        }))
        return 0
    print(summary)
    if counts_fused_kernels(model):
        print("activations and TP: as fused kernels and Megatron run them (Megatron-core, torchtitan, autopar "
              "export); for autopar.wrap on the transformers model, search with --trace (docs/models.md)")
    print(f"plan: {plan_shape(res.plan)}")
    print(plan_table(res.plan, est))
    print(f"predicted: {figures_line(est)}")
    pruned = sum(res.pruned.values())
    note = " (time budget hit: best found so far)" if res.timed_out else ""
    print(f"{seconds}, {res.candidates:,} candidates scored, {pruned:,} pruned{note}")
    if args.explain:
        _explain(res)
    if res.baselines:
        print("baselines (same cost model):")
        print(baseline_table(est, res.baselines))
        fitting = [v[1] for v in res.baselines.values() if v]
        if fitting:
            b = min(fitting, key=lambda e: e.step_time_s)
            print(f"why it won: {b.step_time_s / est.step_time_s:.2f}x the throughput of the best baseline "
                  f"under the cost model, within {est.max_memory_gib:.1f} GiB per device")
    print(f"wrote {out}")
    if args.report:
        print(f"wrote {report}")
    return 0


def _search_output(output: str | None) -> Path:
    """Where ``search`` writes its plan. ``-o PATH`` names the file to write (an existing one is replaced);
    without ``-o`` it is ``plan.yaml`` here, which must not exist yet: an earlier plan is never replaced
    silently. Checked before the search runs."""
    if output is not None:
        return Path(output)
    out = Path(DEFAULT_PLAN)
    if out.exists() or out.is_symlink():
        raise AutoparError("search -o", f"{DEFAULT_PLAN} already exists here and -o was not given",
                           f"pass -o {DEFAULT_PLAN} to replace it, or -o another path")
    return out


def _explain(res) -> None:
    """``--explain``: the planner, every pruning count with its rule's description, the configurations."""
    from autopar.search.rules import describe

    print(f"planner: {res.planner}")
    if "partitioner" in res.plan.search:  # the heterogeneous planner's pipeline grouping (METIS or greedy)
        print(f"partitioner: {res.plan.search['partitioner']}")
    if "cp" in res.plan.search:  # the context-parallel degrees searched (autopar/search/context_parallel.py)
        tried = ", ".join(f"cp{c} {v if isinstance(v, str) else f'{v:.4g} s'}" for c, v in res.plan.search["cp"].items())
        print(f"context parallel (one search per degree, step time or why none): {tried}")
    print("pruning rules (count: rule):")
    for rule, count in sorted(res.pruned.items(), key=lambda kv: -kv[1]):
        print(f"  {count:>9,}  {rule}: {describe(rule)}")
    if res.configs:
        print("configurations (pp, micro-batches, virtual stages v > 1: interleaved, zb-h1: a 1F1B setting re-run "
              "under the zero-bubble schedule): lower bound -> result")
    for c in sorted(res.configs, key=lambda c: c.step_time)[:20]:
        r = f"{c.step_time:.4g} s" if c.stages else (c.note or "-")
        v = (f" v={c.virtual_stages}" if c.virtual_stages > 1 else "") + (f" {c.schedule}" if c.schedule else "")
        print(f"  pp={c.pp:<3} m={c.num_microbatches:<5} mbs={c.micro_batch_size:<5} "
              f"bound {c.lower_bound:.4g} s -> {r}{v}")
    if res.configs:
        print(f"schedule: {res.plan.schedule} (the fastest fitting configuration above)")
