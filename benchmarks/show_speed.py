"""Speed of `autopar show`: the whole command (interpreter start, plan checks, estimate, drawing, writing)
for plans of 8, 64 and 1024 devices, as PNG and as HTML. Target (issue 13): under 3 s for a 1024-device plan.

Plans come from `autopar search` (zoo models on inline clusters; not timed) and, for a pipelined
1024-device plan, from the library with the pipeline degree fixed (the CLI search picks one stage
there). Each `show` runs in its own process, 3 times; the table gives the least wall time and that
run's CPU time (user + sys of the child), since this machine is shared and wall time includes waiting.

    python benchmarks/show_speed.py     # prints the table, writes benchmarks/results/show_speed.json
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 3.0
# name, model, cluster, global batch, seq, fixed pipeline degree (None: the CLI's own search)
CASES = [
    ("8 devices", "gpt3-1.3b", "8xA100-80G", 64, 2048, None),
    ("24 devices, mixed", "llama2-7b", "8x3090+8x4090+8xA100", 256, 4096, None),
    ("64 devices", "llama2-70b", "8x8xA100-80G", 256, 4096, None),
    ("1024 devices", "llama2-70b", "128x8xA100-80G", 1024, 4096, None),
    ("1024 devices, pp16", "llama2-70b", "128x8xA100-80G", 1024, 4096, 16),
]
FIXED_PP = r"""
import sys
from autopar.cluster import load_cluster
from autopar.modelspec.load import load_model
from autopar.plan import save_plan
from autopar.search import SearchOptions, search
model, cluster, B, seq, pp, out = sys.argv[1:]
res = search(load_model(model, int(seq)), load_cluster(cluster), int(B), SearchOptions(pp_degrees=[int(pp)]),
             with_baselines=False)
save_plan(res.plan, out)
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def make_plan(case: tuple, out: Path) -> None:
    _, model, cluster, B, seq, pp = case
    if pp is None:
        cmd = [sys.executable, "-m", "autopar.cli", "search", "--model", model, "--cluster", cluster,
               "--global-batch-size", str(B), "--seq-len", str(seq), "--no-baselines", "--json", "-o", str(out)]
    else:
        cmd = [sys.executable, "-c", FIXED_PP, model, cluster, str(B), str(seq), str(pp), str(out)]
    subprocess.run(cmd, check=True, env=_env(), stdout=subprocess.DEVNULL)


def time_show(plan: Path, out: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one `autopar show` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autopar.cli", "show", str(plan), "-o", str(out)], check=True, env=_env(),
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            plan = Path(tmp) / "plan.yaml"
            make_plan(case, plan)
            for ext in ("png", "html"):
                out = Path(tmp) / f"plan.{ext}"
                runs = [time_show(plan, out) for _ in range(3)]
                wall, cpu = min(runs)
                rows.append({"case": case[0], "model": case[1], "cluster": case[2], "format": ext,
                             "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "bytes": out.stat().st_size})
    load = os.getloadavg()[0]
    print(f"autopar show, whole command, least wall of 3 (load average {load:.1f} on {os.cpu_count()} cores)")
    print(f"{'case':<20} {'format':<6} {'wall s':>7} {'CPU s':>6} {'KiB':>6}")
    for r in rows:
        print(f"{r['case']:<20} {r['format']:<6} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} {r['bytes'] / 1024:>6.0f}")
    big = [r for r in rows if r["case"].startswith("1024")]
    met = all(r["cpu_s"] < TARGET_S for r in big)
    print(f"target: 1024 devices under {TARGET_S} s: CPU {'met' if met else 'NOT met'} "
          f"(max {max(r['cpu_s'] for r in big):.2f} s); wall max {max(r['wall_s'] for r in big):.2f} s")
    out = ROOT / "benchmarks" / "results" / "show_speed.json"
    out.write_text(json.dumps({"target_s": TARGET_S, "load_average": round(load, 2), "cores": os.cpu_count(),
                               "rows": rows}, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
