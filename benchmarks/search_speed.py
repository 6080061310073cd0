"""Search speed: seconds and peak memory of `autopar search` vs model size and GPU count, one core.

Each case runs in a fresh subprocess pinned to one CPU core (numpy single-threaded) so its peak
RSS is its own. Targets (issue 2): llama2-7b on 8/16/32 GPUs < 2 s each; peak memory < 2 GiB.
Targets (issue 4, bounded work): llama2-70b on 1024 A100 <= 10 s and llama3-405b on 16384 H100
<= 60 s, search plus baselines; 100k devices answered (the search's plan) <= 30 s.

    python benchmarks/search_speed.py            # prints the table, writes benchmarks/results/search_speed.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    ("llama3-405b", "12500x8xH100", 16000, 8192, 30.0, SEARCH),  # 100k devices
]

CHILD = r"""
import json, os, resource, sys, time
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
from autopar.modelspec.zoo import from_zoo
from autopar.cluster.parse import load_cluster
from autopar.search import SearchOptions, search
model, cluster, B, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m, c = from_zoo(model, seq), load_cluster(cluster)
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


def run_case(model: str, cluster: str, B: int, seq: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", CHILD, model, cluster, str(B), str(seq)], env=env, cwd=root,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    rows = []
    for model, cluster, B, seq, target, bounds in CASES:
        r = run_case(model, cluster, B, seq)
        took = r["search_s"] + (r["baselines_s"] if bounds == TOTAL else 0.0)
        r.update(model=model, cluster=cluster, global_batch_size=B, seq_len=seq, target_s=target, target_on=bounds,
                 meets_target=(target is None or took <= target) and r["peak_rss_mib"] < 2048)
        rows.append(r)
        print(f"{model:<11} {cluster:<15} B={B:<5} search {r['search_s']:7.2f} s  (+baselines {r['baselines_s']:6.2f} s)"
              f"  peak {r['peak_rss_mib']:6.0f} MiB  pp{r['pp']} tp{r['tp']} m{r['micro_batches']}"
              f"  MFU {r['mfu'] * 100:5.1f}% (best baseline {r['best_baseline_mfu'] * 100:5.1f}%)"
              f"  target {target or '-'} s ({bounds})  {'ok' if r['meets_target'] else 'MISSED'}", flush=True)
    out = Path(__file__).resolve().parent / "results" / "search_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"benchmark": "search_speed", "one_core": True, "cases": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
