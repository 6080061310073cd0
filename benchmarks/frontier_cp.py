"""Llama 3 405B at 128K sequence with context parallel 16 as an autopar plan, estimated.

Meta's long-context layout ("The Llama 3 Herd of Models", arXiv 2407.21783, Table 4, section 3.3.2):
16384 H100, TP 8, CP 16, PP 16, sequence 131072, 16M tokens per batch, 380 TFLOPs/GPU measured (38%
BF16 MFU). The table prints DP 4, but 8 x 16 x 16 x 4 = 8192 GPUs, not 16384, and 16 sequences per DP
rank x 4 x 131072 = 8M tokens, not 16M; DP 8 makes both the GPU count and the token count hold, so the
plan here uses DP 8 (``dp=4`` gives the table's literal reading on 8192 GPUs).

Layout as ``benchmarks/frontier_plans.py`` writes Meta's 8K plans: 126 blocks + embedding + head = 128
units = 16 stages x 8, one sequence per micro-batch per DP replica, ZeRO-1 (FSDP without resharding:
parameters gathered once per step), interleaved stages where v cuts the layers evenly. Inside a stage
of 1024 devices: tp 8 x cp 16 x dp 8 (Megatron's tp-cp-dp order, autopar/plan/cp_rules.py), so each
rank holds 8192 tokens of one sequence. Sequence parallel is off: autopar's runtime does not combine
it with context parallel and the validator refuses the pair. The paper does not publish v or what was
recomputed: ``main`` tries each v and the least recompute that fits and prints them all.

Then the search on the same problem (llama3-405b, seq 131072, 16384 H100, 128 sequences): it tries
cp 1, 2, 4, 8 and 16 (autopar/search/context_parallel.py) and prints what each gives and its plan.

    python benchmarks/frontier_cp.py      # prints the variants, the fastest fitting one, the search
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from autopar.cluster.parse import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.zoo import from_zoo
from autopar.plan.schema import Plan, Strategy
from autopar.plan.validate import validate_plan
from autopar.search import SearchOptions, search

sys.path.insert(0, str(Path(__file__).resolve().parent))  # frontier_plans beside this file, however it is loaded
from frontier_plans import layout_plan  # noqa: E402  (Meta's layout, one builder for the 8K and 128K plans)

SEQ, TP, CP, PP = 131072, 8, 16, 16
SEQS_PER_DP = 16  # sequences per DP replica per step (Table 4's batch size / DP)
MEASURED_TFLOPS, MEASURED_MFU = 380.0, 0.38
CKPT_ORDER = ("none", "selective", "op", "full")  # least recompute first


def llama3_405b_128k_plan(v: int = 1, ckpt: str = "selective", dp: int = 8) -> Plan:
    """Meta's 128K layout of llama3-405b as a Plan: pp 16 x v chunks, tp 8 x cp 16 x ``dp`` per stage."""
    return layout_plan(from_zoo("llama3-405b", SEQ), PP, dp, SEQS_PER_DP, v, Strategy(tp=TP, cp=CP, zero=1, ckpt=ckpt))


def variants() -> list[dict]:
    """Every v (1, 2, 4, 8) with the least recompute that fits (or all modes when none fits)."""
    model = from_zoo("llama3-405b", SEQ)
    rows = []
    for v in (1, 2, 4, 8):
        for ckpt in CKPT_ORDER:
            plan = llama3_405b_128k_plan(v, ckpt)
            validate_plan(plan, model)
            est = estimate_plan(plan, model)
            rows.append({"virtual_stages": v, "ckpt": ckpt, "step_time_s": est.step_time_s,
                         "tflops_per_gpu": est.tflops, "mfu": est.mfu, "memory_gib": est.max_memory_gib,
                         "fits": est.fits})
            if est.fits:
                break
    return rows


def main() -> None:
    rows = variants()
    print(f"llama3-405b seq {SEQ} on 16384 H100, Meta: tp{TP} cp{CP} pp{PP} (dp 8; table: dp 4), "
          f"measured {MEASURED_TFLOPS:.0f} TFLOPs/GPU, MFU {MEASURED_MFU * 100:.0f}%")
    for r in rows:
        print(f"  v={r['virtual_stages']} ckpt={r['ckpt']:<9} {r['step_time_s']:7.2f} s/step  "
              f"{r['tflops_per_gpu']:5.0f} TFLOPs/GPU  MFU {r['mfu'] * 100:4.1f}%  {r['memory_gib']:6.1f} GiB  "
              f"{'fits' if r['fits'] else 'does not fit'}")
    fit = [r for r in rows if r["fits"]]
    if fit:
        best = min(fit, key=lambda r: r["step_time_s"])
        print(f"fastest fitting: v={best['virtual_stages']} ckpt={best['ckpt']}: {best['step_time_s']:.2f} s/step, "
              f"{best['tflops_per_gpu']:.0f} TFLOPs/GPU predicted (measured {MEASURED_TFLOPS:.0f})")
    s = search_128k()
    print(f"search ({s['seconds']:.1f} s): {s['step_time_s']:.2f} s/step, {s['tflops_per_gpu']:.0f} TFLOPs/GPU, "
          f"{s['memory_gib']:.1f} GiB, pp{s['pp']} v{s['virtual_stages']} m{s['micro_batches']} {s['strategies']}; "
          f"per cp: {s['cp_step_times']}")


def search_128k() -> dict:
    """The search on Meta's 128K problem: its plan's shape, figures, seconds and each cp degree's step time."""
    t0 = time.perf_counter()
    res = search(from_zoo("llama3-405b", SEQ), load_cluster("2048x8xH100"), 8 * SEQS_PER_DP, SearchOptions(),
                 with_baselines=False)
    pipe = res.plan.pipelines[0]
    return {"seconds": time.perf_counter() - t0, "step_time_s": res.estimate.step_time_s,
            "tflops_per_gpu": res.estimate.tflops, "memory_gib": res.estimate.max_memory_gib, "pp": pipe.num_stages,
            "virtual_stages": pipe.virtual_stages, "micro_batches": pipe.num_microbatches,
            "strategies": sorted({ly.strategy.short() for st in pipe.stages for ly in st.layers}),
            "cp_step_times": res.plan.search["cp"]}


if __name__ == "__main__":
    main()
