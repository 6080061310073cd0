"""Every figure the planner produces on a fixed set of cases, to full precision: a refactoring guard.

Runs homogeneous and heterogeneous searches (with baselines), estimates of hand-written plans that
mix every strategy, and searches under a synthetic measured profile (compute curves, collective fits,
ZeRO state table), then writes the predicted step times, memory, candidate and pruning counts and
the chosen strategies. ``--compare OLD.json`` reports every figure that moved by more than 1e-9
relative (exit 1 when any did): a change that only moves code must leave them all equal.

    python benchmarks/figures_snapshot.py -o /tmp/after.json --compare benchmarks/results/figures_snapshot.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from autopar.cluster.parse import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.io import plan_to_dict
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.search import SearchOptions, search
from cost_models import CostParams

# (id, model, seq_len, cluster, global batch, options)
SEARCHES = [
    ("llama2-7b/2x8xA100/B512", "llama2-7b", 4096, "2x8xA100-80G", 512, {}),
    ("llama2-13b/8xA100/B64/30GiB", "llama2-13b", 4096, "8xA100-80G", 64, {"memory_budget_gib": 30}),
    ("gpt3-1.3b/2x8xV100/B128/gpipe", "gpt3-1.3b", 2048, "2x8xV100", 128, {"schedule": "gpipe"}),
    ("llama2-70b/4x8xA100/B128", "llama2-70b", 4096, "4x8xA100-80G", 128, {}),
    ("bert-large/4xA100/B64", "bert-large", 512, "4xA100-80G", 64, {}),
    ("gpt-tiny/4xcpu/B8", "gpt-tiny", None, "4xcpu", 8, {}),
    ("llama2-7b/3090+4090+A100/B64", "llama2-7b", 4096, "8x3090+8x4090+8xA100", 64, {}),
    ("llama2-7b/geo-us-3region/B64", "llama2-7b", 4096, "geo-us-3region", 64, {}),
    ("mixtral-8x7b/4x8xH100/B64", "mixtral-8x7b", 4096, "4x8xH100", 64, {}),  # expert parallel
    ("llama3-8b/2x8xH100/B4/64K", "llama3-8b", 65536, "2x8xH100", 4, {}),  # context parallel
]

# A synthetic measured profile: every measured code path of the cost model, deterministic.
PROFILED = CostParams(
    eff_by_kind=(("block", 1, 0, 0.31, 2e-4), ("block", 2, 0, 0.22, 3e-4), ("block", 1, 3, 0.27, 4e-4),
                 ("embed", 1, 0, 0.05, 1e-4), ("head", 1, 0, 0.40, 1.5e-4)),
    comm_fit=(("allreduce", 2, 3e-5, 2e-10), ("allgather", 2, 2e-5, 1e-10), ("reduce_scatter", 2, 2.5e-5, 1.2e-10),
              ("allreduce", 4, 6e-5, 3e-10), ("allgather", 4, 4e-5, 1.5e-10), ("reduce_scatter", 4, 5e-5, 1.7e-10)),
    state_table=((16.0, 0.0), (4.0, 12.0), (2.0, 14.0), (0.0, 16.0)),
    step_overhead_per_unit_s=3e-4, overlap_sync=0.5, overlap_zero3=0.7,
)
PROFILED_SEARCHES = [
    ("profiled gpt-tiny/4xcpu/B8", "gpt-tiny", None, "4xcpu", 8, {"params": PROFILED}),
    ("profiled gpt-tiny/2xcpu/B8", "gpt-tiny", None, "2xcpu", 8, {"params": PROFILED}),
]


def _strategies(plan: Plan) -> list:
    return [[[f"{ly.name}:{ly.strategy.short()}" for ly in st.layers] for st in p.stages] for p in plan.pipelines]


def _shape(plan: Plan) -> list:
    return [{"share": p.batch_share, "mbs": p.micro_batch_size, "m": p.num_microbatches, "schedule": plan.schedule,
             "v": p.virtual_stages, "stages": [list(st.devices) for st in p.stages]} for p in plan.pipelines]


def _search_figures(case) -> dict:
    _, model_name, seq, cluster_spec, B, opts = case
    model = load_model(model_name, seq)
    cluster = load_cluster(cluster_spec)
    res = search(model, cluster, B, SearchOptions(**opts))
    est = res.estimate
    out = {
        "step_time_s": est.step_time_s, "mfu": est.mfu, "max_memory_gib": est.max_memory_gib,
        "pipeline_times_s": list(est.pipeline_times_s),
        "memory_gib": [est.memory_gib[d] for d in sorted(est.memory_gib)],
        "candidates": int(res.candidates), "pruned": dict(sorted(res.pruned.items())),
        "shape": _shape(res.plan), "strategies": _strategies(res.plan),
        "baselines": {k: (None if v is None else {"step_time_s": v[1].step_time_s, "max_memory_gib":
                                                   v[1].max_memory_gib, "shape": _shape(v[0])})
                      for k, v in sorted(res.baselines.items())},
    }
    again = estimate_plan(res.plan, model, opts.get("params"))
    out["estimate_again_s"] = again.step_time_s
    out["plan_predicted"] = plan_to_dict(res.plan)["predicted"]
    return out


def _layers(names: list[str], s: Strategy) -> list[StageLayer]:
    return [StageLayer(n, s) for n in names]


def _hand_plans() -> list[tuple[str, str, int | None, str, Plan]]:
    """Plans no search would pick, mixing every strategy and schedule the schema has."""
    out = []
    model = load_model("llama2-7b", 4096)
    names = [ly.name for ly in model.layers]
    cluster = load_cluster("2x8xA100-80G")
    ref = ModelRef(model.name, model.seq_len, model.num_layers, model.source)
    st0 = Stage(list(range(8)), _layers(names[:1], Strategy(1, 3, "none")) + _layers(names[1:9], Strategy(2, 1, "selective", True))
                + _layers(names[9:17], Strategy(8, 0, "full", True)))
    st1 = Stage(list(range(8, 16)), _layers(names[17:25], Strategy(4, 2, "none", False))
                + _layers(names[25:], Strategy(1, 3, "full")))
    for sched in ("1f1b", "gpipe"):
        plan = Plan(ref, cluster, 64, [Pipeline(64, 8, 8, [st0, st1])], schedule=sched)
        out.append((f"llama2-7b mixed pp2 {sched}", "llama2-7b", 4096, plan))
    hcl = load_cluster("8x3090+8x4090+8xA100")
    a = Stage(list(range(0, 8)), _layers(names[:12], Strategy(2, 1, "full")))
    b = Stage(list(range(8, 16)), _layers(names[12:], Strategy(4, 0, "selective", True)))
    c = Stage(list(range(16, 24)), _layers(names[:20], Strategy(1, 2, "full")) + _layers(names[20:], Strategy(2, 3, "none")))
    plan = Plan(ref, hcl, 64, [Pipeline(32, 4, 8, [a, b]), Pipeline(32, 8, 4, [c])])
    out.append(("llama2-7b asymmetric 3090+4090 | A100", "llama2-7b", 4096, plan))
    return out


def snapshot() -> dict:
    figures: dict = {}
    for case in SEARCHES + PROFILED_SEARCHES:
        t = time.perf_counter()
        figures[case[0]] = _search_figures(case)
        print(f"{case[0]:<40} step {figures[case[0]]['step_time_s']:.6g} s  ({time.perf_counter() - t:.1f} s)",
              file=sys.stderr)
    for name, model_name, seq, plan in _hand_plans():
        model = load_model(model_name, seq)
        for pname, params in (("default", None), ("profiled", PROFILED)):
            est = estimate_plan(plan, model, params)
            figures[f"{name} [{pname}]"] = {
                "step_time_s": est.step_time_s, "pipeline_times_s": list(est.pipeline_times_s),
                "memory_gib": [est.memory_gib[d] for d in sorted(est.memory_gib)],
                "stages": [[(s.cost_per_microbatch_s, s.fwd_s, s.bwd_s, s.step_s, s.p2p_s, s.memory_bytes)
                            for s in p] for p in est.pipelines]}
    return figures


def _diff(old, new, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if k not in old or k not in new:
                out.append(f"{path}.{k}: only in {'new' if k in new else 'old'}")
            else:
                _diff(old[k], new[k], f"{path}.{k}", out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(a, b, f"{path}[{i}]", out)
    elif isinstance(old, float) and isinstance(new, (int, float)):
        if not math.isclose(old, new, rel_tol=1e-9, abs_tol=1e-15):
            out.append(f"{path}: {old!r} -> {new!r}")
    elif old != new:
        out.append(f"{path}: {old!r} -> {new!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "figures_snapshot.json"))
    ap.add_argument("--compare", metavar="OLD.json", help="report figures that differ from this snapshot")
    args = ap.parse_args()
    figures = json.loads(json.dumps(snapshot()))  # tuples -> lists, as read back from a file
    Path(args.output).write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.output}: {len(figures)} cases")
    if args.compare:
        diffs: list[str] = []
        _diff(json.loads(Path(args.compare).read_text()), figures, "", diffs)
        for d in diffs:
            print(d)
        print(f"compared with {args.compare}: {len(diffs)} figures differ")
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
