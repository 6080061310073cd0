"""Cost-model fidelity: predicted against measured step time and per-rank memory of real plans.

On this machine: profile it (``autopar profile``, 2 and 4 processes), predict every plan below with
the profile (``estimate_plan`` on the profiled cluster and cost parameters, the profile's model
numbers), run each plan with ``autopar.wrap`` on fork-started local processes (median of the steady
steps, slowest rank per step), and compare. The searched plan (``autopar search --profile``) joins
each set. Memory: model-state bytes (parameters + gradients + per-element optimizer state at the
optimizer step) must match to the byte; saved-activation bytes at the stage's peak within 10%.

Targets (issue 5): step-time MAPE <= 15% and Spearman >= 0.9 on the 2-process set; the model's first
choice within 5% of the measured fastest. The plans run in ``--repeats`` rounds (fresh processes
each time, all plans per round, so a slow spell of a shared host hits a round rather than a plan);
a run starts only once the CPUs are idle and is run again (up to ``--attempts``) when other processes
took more than ``--quiet`` of the CPUs meanwhile. The run-to-run spread stands next to each error.

    python benchmarks/cost_model_fidelity.py                 # both sets; writes results/cost_model_fidelity.json
    python benchmarks/cost_model_fidelity.py --sets 2 --profile2 profile.yaml --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from autopar.cluster.parse import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.plan.validate import validate_plan
from autopar.profile import apply_profile, apply_profile_model, load_profile, run_profile, save_profile
from autopar.profile.fidelity import compare, predicted_memory
from autopar.profile.quiet import OthersMeter, wait_for_quiet
from autopar.profile.reference import DEFAULT_MODEL, GPT_CPU, gpt_cpu
from autopar.profile.report import summary_dict
from autopar.profile.runs import run_plan, step_time
from autopar.search import SearchOptions, search
from cost_models import CostParams

RESULTS = Path(__file__).with_name("results") / "cost_model_fidelity.json"
GBS = 8
EMBED, HEAD = "embed", "head"
BLOCKS = [f"layers.{i}" for i in range(GPT_CPU.n_layers)]
UNITS = [EMBED, *BLOCKS, HEAD]


def S(**kw) -> Strategy:
    return Strategy(**kw)


def every(units, **kw):
    return [(u, S(**kw)) for u in units]


# name -> (schedule, [(micro_batch_size, num_microbatches, [(devices, [(unit, Strategy), ...]), ...])])
PLANS_2 = {
    "ddp": ("1f1b", [(8, 1, [([0, 1], every(UNITS))])]),
    "ddp-m2": ("1f1b", [(4, 2, [([0, 1], every(UNITS))])]),
    "zero1": ("1f1b", [(8, 1, [([0, 1], every(UNITS, zero=1))])]),
    "zero2": ("1f1b", [(8, 1, [([0, 1], every(UNITS, zero=2))])]),
    "zero2-sel-m2": ("1f1b", [(4, 2, [([0, 1], every([EMBED], zero=2) + every(BLOCKS, zero=2, ckpt="selective")
                                       + every([HEAD], zero=2))])]),
    "zero3": ("1f1b", [(8, 1, [([0, 1], every(UNITS, zero=3))])]),
    "zero3-m2": ("1f1b", [(4, 2, [([0, 1], every(UNITS, zero=3))])]),
    "tp2": ("1f1b", [(8, 1, [([0, 1], every(UNITS, tp=2))])]),
    "tp2-sp": ("1f1b", [(8, 1, [([0, 1], every(UNITS, tp=2, sp=True))])]),
    "ddp-full": ("1f1b", [(8, 1, [([0, 1], every([EMBED]) + every(BLOCKS + [HEAD], ckpt="full"))])]),
    "ddp-selective": ("1f1b", [(8, 1, [([0, 1], every([EMBED]) + every(BLOCKS, ckpt="selective") + every([HEAD]))])]),
    "pp-1f1b": ("1f1b", [(2, 4, [([0], every(UNITS[:4])), ([1], every(UNITS[4:]))])]),
    "pp-gpipe": ("gpipe", [(2, 4, [([0], every(UNITS[:4])), ([1], every(UNITS[4:]))])]),
    "pp-1f1b-m8-full": ("1f1b", [(1, 8, [([0], every([EMBED]) + every(BLOCKS[:2], ckpt="full")),
                                         ([1], every(BLOCKS[2:], ckpt="full") + every([HEAD]))])]),
    "mix-tp-zero": ("1f1b", [(8, 1, [([0, 1], every([EMBED], zero=1) + every(BLOCKS, tp=2) + every([HEAD], zero=3))])]),
}
PLANS_4 = {
    "ddp4": ("1f1b", [(8, 1, [([0, 1, 2, 3], every(UNITS))])]),
    "zero3-4": ("1f1b", [(8, 1, [([0, 1, 2, 3], every(UNITS, zero=3))])]),
    "zero1-4-full": ("1f1b", [(8, 1, [([0, 1, 2, 3], every([EMBED], zero=1) + every(BLOCKS + [HEAD], zero=1,
                                                                                     ckpt="full"))])]),
    "tp2dp2": ("1f1b", [(8, 1, [([0, 1, 2, 3], every(UNITS, tp=2))])]),
    "tp4": ("1f1b", [(8, 1, [([0, 1, 2, 3], every(UNITS, tp=4))])]),
    "pp2dp2-1f1b": ("1f1b", [(4, 2, [([0, 1], every(UNITS[:3])), ([2, 3], every(UNITS[3:]))])]),
    "pp4-1f1b": ("1f1b", [(2, 4, [([0], every(UNITS[:2])), ([1], every(UNITS[2:3])), ([2], every(UNITS[3:4])),
                                  ([3], every(UNITS[4:]))])]),
    "pp2tp2-gpipe": ("gpipe", [(4, 2, [([0, 1], every(UNITS[:3], tp=2)), ([2, 3], every(UNITS[3:], tp=2))])]),
}


def build_plan(spec, cluster, model) -> Plan:
    schedule, pipes = spec
    pipelines = [Pipeline(batch_share=mbs * m, micro_batch_size=mbs, num_microbatches=m,
                          stages=[Stage(list(devs), [StageLayer(n, s) for n, s in layers]) for devs, layers in stages])
                 for mbs, m, stages in pipes]
    return Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), cluster, GBS, pipelines,
                schedule=schedule)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, GPT_CPU.vocab_size, (GBS, GPT_CPU.seq_len), generator=g)
    return x, torch.randint(0, GPT_CPU.vocab_size, (GBS, GPT_CPU.seq_len), generator=g)


def measure_once(plan: Plan, steps: int, warmup: int, memory: bool, args) -> dict:
    """One run in fresh processes, started on quiet CPUs and retried while other processes got in the way."""
    attempts = []
    for _ in range(args.attempts):
        quiet = wait_for_quiet(args.quiet, args.max_wait)
        with OthersMeter() as others:
            ranks = run_plan(gpt_cpu, plan, batch(), steps=steps, warmup=warmup, memory=memory)
        med, per = step_time(ranks)
        attempts.append({"step_s": med, "steps_s": per, "others_share": others.share, "waited_s": quiet["waited_s"],
                         "load_1min": os.getloadavg()[0], "ranks": ranks})
        if others.share is None or others.share <= args.quiet:
            break
    best = min(attempts, key=lambda a: (a["others_share"] or 0.0, a["step_s"]))  # the least disturbed attempt
    best["attempts"] = len(attempts)
    return best


def memory_of(ranks) -> dict:
    return {m.rank: {"states": m.state_bytes, "params": m.param_bytes, "grads": m.grad_bytes, "opt": m.opt_bytes,
                     "opt_scalars": m.opt_scalar_bytes, "saved": m.saved_peak_bytes} for m in ranks}


def run_set(nproc: int, profile_path: str | None, args) -> dict:
    profile_quiet = None
    if profile_path is None:
        print(f"[{nproc} processes] profiling this machine ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        wait_for_quiet(args.quiet, args.max_wait)
        with OthersMeter() as others:
            doc = run_profile(DEFAULT_MODEL, nproc, quick=args.quick, progress=sys.stderr.isatty())
        profile_quiet = others.share
        profile_path = os.path.join(tempfile.mkdtemp(prefix="autopar-fidelity-"), f"profile_{nproc}.yaml")
        save_profile(doc, profile_path)
        print(f"[{nproc} processes] profile done in {time.perf_counter() - t0:.0f} s: {profile_path}",
              file=sys.stderr, flush=True)
    profile = load_profile(profile_path)
    model = apply_profile_model(load_model(DEFAULT_MODEL, dtype_bytes=profile.dtype_bytes), profile)
    cluster, params = apply_profile(load_cluster(f"{nproc}xcpu"), CostParams(), profile)
    plans = {name: build_plan(spec, cluster, model) for name, spec in (PLANS_2 if nproc == 2 else PLANS_4).items()}
    found = search(model, cluster, GBS, SearchOptions(params=params), with_baselines=False)
    plans["searched"] = found.plan
    preds = {}
    for name, plan in plans.items():
        validate_plan(plan, model)
        preds[name] = (estimate_plan(plan, model, params), predicted_memory(plan, model, params))
    runs: dict[str, list[dict]] = {name: [] for name in plans}
    for r in range(args.repeats):  # rounds over all plans: a slow spell of the host hits one round, not one plan
        for name, plan in plans.items():
            print(f"[{nproc} processes] round {r + 1}/{args.repeats} {name}: predicted "
                  f"{preds[name][0].step_time_s * 1e3:.0f} ms ...", file=sys.stderr, flush=True)
            runs[name].append(measure_once(plan, args.steps, args.warmup, r == 0, args))
    rows = []
    for name, plan in plans.items():
        est, pred_mem = preds[name]
        got = runs[name]
        meas_mem = memory_of(got[0]["ranks"])
        state_diff = max(abs(meas_mem[d]["states"] - pred_mem[d]["states"]) for d in pred_mem)
        saved_err = max(abs(meas_mem[d]["saved"] - pred_mem[d]["saved"]) / max(meas_mem[d]["saved"], 1)
                        for d in pred_mem)
        med = [g["step_s"] for g in got]
        measured = statistics.median(med)
        rows.append({
            "plan": name, "shape": plan_label(plan), "predicted_step_s": est.step_time_s, "measured_step_s": measured,
            "error": (est.step_time_s - measured) / measured,
            "spread": (max(med) - min(med)) / measured if len(med) > 1 else 0.0,
            "repeat_medians_s": med, "steps_s": [g["steps_s"] for g in got],
            "others_share": [g["others_share"] for g in got], "attempts": [g["attempts"] for g in got],
            "load_1min": [g["load_1min"] for g in got],
            "predicted_stage_costs_s": [[st.cost_per_microbatch_s for st in p] for p in est.pipelines],
            "memory": {"state_bytes_max_abs_diff": state_diff, "saved_max_rel_err": saved_err,
                       "per_rank": {d: {"predicted": pred_mem[d], "measured": meas_mem[d]} for d in sorted(pred_mem)}},
        })
    summary = compare([r["predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows])
    summary["first_choice"] = rows[summary["first_choice"]]["plan"]
    summary["measured_fastest"] = rows[summary["measured_fastest"]]["plan"]
    summary["median_spread"] = statistics.median(r["spread"] for r in rows)
    summary["state_bytes_exact"] = all(r["memory"]["state_bytes_max_abs_diff"] == 0 for r in rows)
    summary["saved_within_10pct"] = sum(r["memory"]["saved_max_rel_err"] <= 0.10 for r in rows)
    summary["plans"] = len(rows)
    summary["others_share_max"] = max(x or 0.0 for r in rows for x in r["others_share"])
    summary["targets"] = {"mape_le_15pct": summary["mape"] <= 0.15, "spearman_ge_0.9": summary["spearman"] >= 0.9,
                          "first_choice_within_5pct": summary["first_choice_gap"] <= 0.05}
    return {"nproc": nproc, "profile": summary_dict(dict(profile)), "profile_path": profile_path,
            "profile_others_share": profile_quiet,
            "cost_params": params.to_dict(), "plans": rows, "summary": summary}


def plan_label(plan: Plan) -> str:
    pipe = plan.pipelines[0]
    strat = sorted({ly.strategy.short() for st in pipe.stages for ly in st.layers})
    return f"pp{len(pipe.stages)} m{pipe.num_microbatches} {plan.schedule} [{', '.join(strat)}]"


def print_set(res: dict) -> None:
    print(f"\n== {res['nproc']} processes (profile {res['profile_path']})")
    print(f"{'plan':<17} {'shape':<44} {'pred ms':>8} {'meas ms':>8} {'error':>7} {'spread':>7} "
          f"{'states dB':>9} {'saved err':>9}")
    for r in res["plans"]:
        print(f"{r['plan']:<17} {r['shape'][:44]:<44} {r['predicted_step_s'] * 1e3:>8.1f} "
              f"{r['measured_step_s'] * 1e3:>8.1f} {r['error'] * 100:>6.1f}% {r['spread'] * 100:>6.1f}% "
              f"{r['memory']['state_bytes_max_abs_diff']:>9.0f} {r['memory']['saved_max_rel_err'] * 100:>8.1f}%")
    s = res["summary"]
    print(f"step time: MAPE {s['mape'] * 100:.1f}% (max {s['max_ape'] * 100:.1f}%), Spearman {s['spearman']:.3f}, "
          f"median run-to-run spread {s['median_spread'] * 100:.1f}%; other processes took at most "
          f"{s['others_share_max'] * 100:.0f}% of the CPUs during a kept run")
    print(f"first choice {s['first_choice']} vs measured fastest {s['measured_fastest']}: "
          f"{s['first_choice_gap'] * 100:.1f}% slower")
    exact = sum(r["memory"]["state_bytes_max_abs_diff"] == 0 for r in res["plans"])
    print(f"memory: model states exact to the byte on every rank in {exact}/{s['plans']} plans; saved activations "
          f"within 10% in {s['saved_within_10pct']}/{s['plans']} plans")
    print("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in s["targets"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="2,4", help="process counts, e.g. 2,4")
    ap.add_argument("--profile2", help="use this 2-process profile instead of measuring one")
    ap.add_argument("--profile4", help="use this 4-process profile instead of measuring one")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="quick profiles (for smoke tests; noisier)")
    ap.add_argument("--quiet", type=float, default=0.1,
                    help="CPU share other processes may use during a kept run (and before one starts)")
    ap.add_argument("--attempts", type=int, default=3, help="runs per measurement while others disturb it")
    ap.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for quiet CPUs before a run")
    ap.add_argument("-o", "--output", default=str(RESULTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "torch": torch.__version__},
           "model": {"source": DEFAULT_MODEL, "config": vars(GPT_CPU), "global_batch_size": GBS},
           "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "sets": []}
    for n in (int(x) for x in args.sets.split(",")):
        res = run_set(n, getattr(args, f"profile{n}", None), args)
        print_set(res)
        out["sets"].append(res)
    out["machine"]["load_after"] = os.getloadavg()
    print(f"\nhost load average (1, 5, 15 min): before {tuple(round(x, 2) for x in out['machine']['load_before'])}, "
          f"after {tuple(round(x, 2) for x in out['machine']['load_after'])} on {os.cpu_count()} CPUs")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1, default=float))
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
