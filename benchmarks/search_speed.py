"""Search speed: seconds and peak memory of `autopar search` vs model size and GPU count, one core.

Each case runs in a fresh subprocess pinned to one CPU core (numpy single-threaded) so its peak
RSS is its own. Targets (issue 2): llama2-7b on 8/16/32 GPUs < 2 s each; peak memory < 2 GiB.
Targets (issue 4, bounded work): llama2-70b on 1024 A100 <= 10 s and llama3-405b on 16384 H100
<= 60 s, search plus baselines. Issue 10: 100k devices (llama3-405b on 12500x8 H100) <= 30 s for the
whole `autopar search` command with its default baselines (its own process, one core); and
`--time-budget` overruns by at most 10% + 0.5 s (search plus baselines, 4096 nodes).

    python benchmarks/search_speed.py            # prints the tables, writes benchmarks/results/search_speed.json
    python benchmarks/search_speed.py --only 12500x8xH100   # the cases on that cluster (the file keeps the rest)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEARCH, TOTAL = "search", "search+baselines"  # what a target bounds
CASES = [
    # model, cluster, global batch, seq, target seconds, what it bounds
    ("llama2-7b", "1x8xA100-80G", 512, 4096, 2.0, SEARCH),
    ("llama2-7b", "2x8xA100-80G", 512, 4096, 2.0, SEARCH),
    ("llama2-7b", "4x8xA100-80G", 512, 4096, 2.0, SEARCH),
    ("llama2-13b", "8x8xA100-80G", 1024, 4096, None, SEARCH),
    ("gpt3-175b", "64x8xH100", 1536, 2048, None, SEARCH),
    ("llama2-70b", "128x8xA100-80G", 1024, 4096, 10.0, TOTAL),
    ("llama3-405b", "2048x8xH100", 2048, 8192, 60.0, TOTAL),
    ("llama3-405b", "12500x8xH100", 16000, 8192, 30.0, TOTAL),  # 100k devices (and CLI_CASES: the command)
]
# model, cluster, global batch, seq, target seconds for the whole `autopar search` command (baselines on)
CLI_CASES = [("llama3-405b", "12500x8xH100", 16000, 8192, 30.0)]
# model, cluster, global batch, seq, --time-budget seconds: search plus baselines within 110% + 0.5 s
BUDGET_CASES = [("llama2-70b", "4096x8xH100", 2048, 4096, 5.0), ("llama3-405b", "12500x8xH100", 16000, 8192, 6.0)]

CHILD = r"""
import json, os, resource, sys, time
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
from autopar.modelspec.zoo import from_zoo
from autopar.cluster.parse import load_cluster
from autopar.search import SearchOptions, search
model, cluster, B, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
budget = float(sys.argv[5]) if len(sys.argv) > 5 else None
m, c = from_zoo(model, seq), load_cluster(cluster)
if budget is not None:  # search plus baselines under --time-budget, as the CLI runs them
    t0 = time.perf_counter()
    r = search(m, c, B, SearchOptions(time_budget_s=budget))
    print(json.dumps({"wall_s": time.perf_counter() - t0, "search_s": r.seconds, "timed_out": r.timed_out,
                      "step_time_s": r.estimate.step_time_s}))
    sys.exit()
t0 = time.perf_counter()
r = search(m, c, B, SearchOptions(), with_baselines=False)
t1 = time.perf_counter()
search_s = r.seconds
t2 = time.perf_counter()
from autopar.search.baselines import baselines
base = baselines(m, c, B, SearchOptions())
t3 = time.perf_counter()
pipe = r.plan.pipelines[0]
tps = sorted({ly.strategy.tp for st in pipe.stages for ly in st.layers})
print(json.dumps({"search_s": search_s, "with_plan_s": t1 - t0, "baselines_s": t3 - t2,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "candidates": r.candidates, "configs": len(r.configs), "pp": len(pipe.stages), "tp": tps,
    "micro_batches": pipe.num_microbatches, "mfu": r.estimate.mfu, "step_time_s": r.estimate.step_time_s,
    "best_baseline_mfu": max([v[1].mfu for v in base.values() if v] or [0.0])}))
"""
ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def run_case(model: str, cluster: str, B: int, seq: int, budget: float | None = None) -> dict:
    extra = [str(budget)] if budget is not None else []
    out = subprocess.run([sys.executable, "-c", CHILD, model, cluster, str(B), str(seq), *extra], env=ENV, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_cli(model: str, cluster: str, B: int, seq: int) -> float:
    """Seconds of the whole `autopar search` command (default baselines, plan written) on one core."""
    core = sorted(os.sched_getaffinity(0))[0]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "autopar.cli", "search", "--model", model, "--cluster", cluster,
               "--global-batch-size", str(B), "--seq-len", str(seq), "-o", str(Path(tmp) / "plan.yaml")]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, check=True,
                       preexec_fn=lambda: os.sched_setaffinity(0, {core}))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only the cases on this cluster; the results file keeps the others")
    args = ap.parse_args()
    out = Path(__file__).resolve().parent / "results" / "search_speed.json"
    old = json.loads(out.read_text()) if args.only and out.exists() else {}

    def kept(section: str) -> list[dict]:  # with --only, the other clusters' rows of the results file
        return [r for r in old.get(section, []) if r["cluster"] != args.only]

    def chosen(cases: list[tuple]) -> list[tuple]:
        return [c for c in cases if args.only in (None, c[1])]

    rows = kept("cases")
    for model, cluster, B, seq, target, bounds in chosen(CASES):
        r = run_case(model, cluster, B, seq)
        took = r["search_s"] + (r["baselines_s"] if bounds == TOTAL else 0.0)
        r.update(model=model, cluster=cluster, global_batch_size=B, seq_len=seq, target_s=target, target_on=bounds,
                 meets_target=(target is None or took <= target) and r["peak_rss_mib"] < 2048)
        rows.append(r)
        print(f"{model:<11} {cluster:<15} B={B:<5} search {r['search_s']:7.2f} s  (+baselines {r['baselines_s']:6.2f} s)"
              f"  peak {r['peak_rss_mib']:6.0f} MiB  pp{r['pp']} tp{r['tp']} m{r['micro_batches']}"
              f"  MFU {r['mfu'] * 100:5.1f}% (best baseline {r['best_baseline_mfu'] * 100:5.1f}%)"
              f"  target {target or '-'} s ({bounds})  {'ok' if r['meets_target'] else 'MISSED'}", flush=True)
    cli_rows = kept("cli")
    for model, cluster, B, seq, target in chosen(CLI_CASES):
        secs = run_cli(model, cluster, B, seq)
        cli_rows.append({"model": model, "cluster": cluster, "global_batch_size": B, "seq_len": seq, "cli_s": secs,
                         "target_s": target, "meets_target": secs <= target})
        print(f"autopar search {model} {cluster} B={B} (baselines on, plan written): {secs:.2f} s"
              f"  target {target} s  {'ok' if secs <= target else 'MISSED'}", flush=True)
    budget_rows = kept("time_budget")
    for model, cluster, B, seq, budget in chosen(BUDGET_CASES):
        r = run_case(model, cluster, B, seq, budget)
        bound = 1.1 * budget + 0.5
        r.update(model=model, cluster=cluster, global_batch_size=B, seq_len=seq, time_budget_s=budget, bound_s=bound,
                 meets_target=r["wall_s"] <= bound)
        budget_rows.append(r)
        print(f"{model:<11} {cluster:<15} --time-budget {budget:g}: search+baselines {r['wall_s']:.2f} s "
              f"(search {r['search_s']:.2f} s, timed out {r['timed_out']})  bound {bound:.2f} s  "
              f"{'ok' if r['meets_target'] else 'MISSED'}", flush=True)
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"benchmark": "search_speed", "one_core": True, "cases": rows, "cli": cli_rows,
                               "time_budget": budget_rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
