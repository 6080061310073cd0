"""Sailor's published per-layer profiles against the cost model: one block's forward and backward per GPU, TP degree
and micro-batch size, in Megatron-DeepSpeed at fp32.

Sailor (eth-easl/sailor) timed every pipeline layer of OPT-350M, GPT-Neo-2.7B and OPT-30B with CUDA events on seven
GPU types, TP 1-8 on one node, micro-batch 1-128 (``benchmarks/data/layer_profiles/sailor_megatron_deepspeed.yaml``);
its GH200 figures come from the cluster and framework of ``benchmarks/data/sailor_gh200_opt350_clariden.yaml``. The
cost model prices the same block with its defaults (``cost_models.layer.one_layer_cost``: compute at the catalogue's
peak for the precision, the memory-bound kernels, the TP all-reduces over the catalogue's node links, the per-call
overhead). Nothing here is fitted.

Two readings come out of the table:

* which precision the matmuls ran at: a block's forward at a rate above the GPU's FP32 peak (model FLOPs over the
  measured time) ran its matmuls as TF32, whatever the launch flags say (``achieved`` below);
* how the gap moves with the micro-batch and the TP degree: a ratio that falls at small micro-batches under TP is a
  per-call cost the GPU time does not hold (the host launching kernels, the collectives' latency).

The OPT rows are priced a second time with the memory-bound traffic counted from Megatron-DeepSpeed's fp32 OPT block
(``benchmarks/megatron_opt_traffic.py``: its softmax path is unfused at fp32), the ``act_traffic`` the step-time
file of these runs states for its framework.

Last, Sailor's 15 GH200 step times (``benchmarks/data/sailor_gh200_opt350_clariden.yaml``) are priced twice: as the
file stands, and with the GH200 OPT-350 profile fitted into per-unit compute curves the way ``autopar profile`` fits
its own timings (``CostParams.eff_by_kind``; TP collectives, pipeline, data parallelism and the optimizer stay the
model's). No step time enters either; the gap between the two is what the per-layer compute model misses.

    python benchmarks/sailor_layer_profile.py    # prints the tables, writes results/sailor_layer_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import megatron_opt_traffic
import numpy as np
import yaml

from autopar.calibrate import scores
from autopar.calibrate.score import predicted_under
from autopar.cluster.catalogue import gpu as gpu_type
from autopar.cluster.parse import load_cluster
from autopar.estimate import plan_cost_params
from autopar.estimate.context import StageContext
from autopar.measured import load_runs
from autopar.modelspec.spec import LayerSpec
from autopar.plan.schema import Strategy
from autopar.profile.fit import fit_efficiency
from cost_models.layer import one_layer_cost, tp_comm_times
from cost_models.params import CostParams

HERE = Path(__file__).resolve().parent
PROFILE = HERE / "data" / "layer_profiles" / "sailor_megatron_deepspeed.yaml"
RUNS = HERE / "data" / "sailor_gh200_opt350_clariden.yaml"  # the step times of OPT-350 on these GH200 nodes
UNIT_TIMES = {"embedding": "embed_s", "block": "block_s", "head": "head_s"}  # the profile's figure of each unit kind
NVLINK = ("GH200", "A100-40G", "A100-80G", "V100-16G")  # the profiled nodes whose GPUs talk over NVLink
# Megatron on DeepSpeed's pipeline engine, as the Sailor runs: where the profile's per-call cost is tried held out
# (the shared AMP file is read when it is beside the repository)
TRANSFER = (HERE / "data" / "bloom_a100_topology_sweep.yaml", HERE / "data" / "bloom_176b_a100_training.yaml",
            HERE / "data" / "amp_het_cluster.yaml", HERE.parents[1] / "shared" / "measured" / "amp_homogeneous.yaml")


def block_of(shape: dict, cache: dict) -> LayerSpec:
    """The cost model's block of a profiled shape (``megatron_opt_traffic.block_spec``: fp32, eager attention)."""
    return megatron_opt_traffic.block_spec(shape["hidden"], shape["heads"], shape["ffn"], shape["seq_len"], cache)


def predicted(block: LayerSpec, gpu: str, node_gpus: int, tp: int, mbs: int, precision: str,
              params: CostParams) -> tuple[float, float]:
    """(forward, backward) seconds ``params`` give one block on ``tp`` GPUs of one ``gpu`` node."""
    cluster = load_cluster(f"1x{node_gpus}x{gpu}").at_precision(precision)
    ctx = StageContext(cluster, tuple(cluster.node_devices(0))[:tp], micro_batch_size=mbs, num_microbatches=1,
                       params=params)
    cost = one_layer_cost(block, Strategy(tp=tp), ctx)
    return cost.fwd, cost.bwd


def counted_traffic() -> dict[str, float]:
    """The counted ``act_traffic`` of each model whose block ``megatron_opt_traffic.py`` transcribes."""
    return {r["model"]: r["act_traffic"] for r in megatron_opt_traffic.rows()}


def rows(doc: dict) -> list[dict]:
    cache: dict = {}
    traffic = counted_traffic()
    out = []
    for prof in doc["profiles"]:
        block = block_of(doc["models"][prof["model"]], cache)
        framework = CostParams(act_traffic=traffic[prof["model"]]) if prof["model"] in traffic else None
        for r in prof["rows"]:
            precision = "tf32" if r["gpu"] in doc["tf32"][prof["model"]] else "fp32"
            where = (block, r["gpu"], doc["node_gpus"][r["gpu"]], r["tp"], r["mbs"], precision)
            fwd, bwd = predicted(*where, CostParams())
            counted = sum(predicted(*where, framework)) if framework else None
            mf, mb = r["block_s"]
            out.append({"model": prof["model"], "gpu": r["gpu"], "tp": r["tp"], "mbs": r["mbs"], "precision": precision,
                        "measured_ms": [1e3 * mf, 1e3 * mb], "predicted_ms": [1e3 * fwd, 1e3 * bwd],
                        "ratio": [fwd / mf, bwd / mb],
                        # forward + backward with the framework's counted act_traffic (the OPT blocks)
                        "ratio_counted": counted / (mf + mb) if counted else None,
                        # model FLOPs of the measured forward, per GPU (TP splits them)
                        "fwd_tflops": block.flops * r["mbs"] / r["tp"] / mf / 1e12})
    return out


def achieved(table: list[dict]) -> list[dict]:
    """Per model and GPU: the fastest measured forward against the GPU's FP32 and TF32 peaks."""
    out = []
    for key in sorted({(r["model"], r["gpu"]) for r in table}):
        best = max((r for r in table if (r["model"], r["gpu"]) == key), key=lambda r: r["fwd_tflops"])
        g = gpu_type(key[1])
        out.append({"model": key[0], "gpu": key[1], "tp": best["tp"], "mbs": best["mbs"],
                    "fwd_tflops": best["fwd_tflops"], "fp32_peak": g.tflops_fp32, "tf32_peak": g.tflops_tf32,
                    "above_fp32_peak": best["fwd_tflops"] > g.tflops_fp32, "read_as": best["precision"]})
    return out


def by_gpu(table: list[dict]) -> list[dict]:
    """Per model, GPU and TP degree: predicted / measured (forward + backward) at the smallest and the largest
    micro-batch profiled, and the median over all."""
    out = []
    for key in sorted({(r["model"], r["gpu"], r["tp"]) for r in table}):
        rs = sorted((r for r in table if (r["model"], r["gpu"], r["tp"]) == key), key=lambda r: r["mbs"])
        both = [sum(r["predicted_ms"]) / sum(r["measured_ms"]) for r in rs]
        counted = [r["ratio_counted"] for r in rs if r["ratio_counted"] is not None]
        out.append({"model": key[0], "gpu": key[1], "tp": key[2], "mbs": [rs[0]["mbs"], rs[-1]["mbs"]],
                    "ratio_small": both[0], "ratio_large": both[-1], "ratio_median": statistics.median(both),
                    "counted_median": statistics.median(counted) if counted else None})
    return out


def unit_curve(rows: list[dict], layer: LayerSpec, field: str, cluster, params: CostParams, tp: int) -> dict | None:
    """One unit kind's compute curve at one TP degree, fitted to the profile's ``rows`` of it as ``autopar profile``
    fits its own timings (``autopar.profile.fit.fit_efficiency``: forward + backward minus the TP collectives the
    model charges, linear in the unit's FLOPs with a per-call cost)."""
    # the links, collectives and peak of ``tp`` GPUs of one node (the micro-batch enters through b_local below)
    ctx = StageContext(cluster, tuple(cluster.node_devices(0))[:tp], micro_batch_size=1, num_microbatches=1,
                       params=params)
    samples = []
    for r in rows:
        comm = tp_comm_times(layer, np.array([float(tp)]), np.array([False]), np.array([0]), np.array([float(r["mbs"])]),
                             ctx.tp_links, ctx.collectives)
        samples.append({"flops": layer.flops * r["mbs"], "flops_per_rank": layer.flops * r["mbs"] / tp,
                        "fwd_s": r[field][0], "bwd_s": r[field][1], "tp_comm_s": float(comm[0][0] + comm[1][0])})
    return fit_efficiency(samples, ctx.peak_flops) if samples else None


def profile_curves(doc: dict, run) -> tuple:
    """``CostParams.eff_by_kind`` rows of the GH200 OPT-350 profile, one per unit kind and TP degree profiled."""
    params = plan_cost_params(run.plan)
    rows = next(p["rows"] for p in doc["profiles"] if p["model"] == "OPT-350")
    out = []
    for tp in sorted({r["tp"] for r in rows if r["gpu"] == "GH200"}):
        for kind, field in UNIT_TIMES.items():
            layer = next(u for u in run.model.layers if u.kind == kind)
            mine = [r for r in rows if r["gpu"] == "GH200" and r["tp"] == tp]
            fit = unit_curve(mine, layer, field, run.plan.cluster, params, tp)
            if fit:
                out.append((kind, tp, 0, fit["eff_max"], fit["layer_overhead_s"]))
    return tuple(out)


def call_costs(doc: dict) -> list[dict]:
    """What each TP collective call costs beyond the model's collective time, read from the block curves: the
    per-call cost a TP degree adds over TP 1's, over the block's calls (its ``tp_collectives`` all-reduces in forward
    and again in backward; the curve charges its per-call cost once in forward and twice in backward)."""
    cache: dict = {}
    out = []
    for prof in doc["profiles"]:
        block = block_of(doc["models"][prof["model"]], cache)
        for gpu in dict.fromkeys(r["gpu"] for r in prof["rows"]):
            precision = "tf32" if gpu in doc["tf32"][prof["model"]] else "fp32"
            cluster = load_cluster(f"1x{doc['node_gpus'][gpu]}x{gpu}").at_precision(precision)
            curves = {}
            for tp in sorted({r["tp"] for r in prof["rows"] if r["gpu"] == gpu}):
                mine = [r for r in prof["rows"] if r["gpu"] == gpu and r["tp"] == tp]
                curves[tp] = unit_curve(mine, block, "block_s", cluster, CostParams(), tp)
            if not curves.get(1):
                continue
            for tp, fit in curves.items():
                if tp > 1 and fit:
                    extra = 3 * (fit["layer_overhead_s"] - curves[1]["layer_overhead_s"])
                    out.append({"model": prof["model"], "gpu": gpu, "tp": tp, "eff_max": fit["eff_max"],
                                "call_overhead_s": fit["layer_overhead_s"],
                                "per_collective_s": extra / (2 * block.tp_collectives)})
    return out


def variant_figures(runs: list, variants: dict) -> dict:
    """Per variant (name -> a change of each run's own cost parameters): MAPE, Spearman, regret and the range of
    predicted / measured over ``runs``."""
    groups, measured = [r.group for r in runs], [r.measured_s for r in runs]
    figures = {}
    for how, change in variants.items():
        pred = predicted_under(runs, change)
        ratios = [a / b for a, b in zip(pred, measured)]
        figures[how] = {**scores(groups, pred, measured), "ratio_range": [min(ratios), max(ratios)]}
    return figures


def step_scores(doc: dict) -> dict:
    """Sailor's GH200 step times as the file states them (TF32, its framework's counted traffic and per-call cost),
    and with the profile's fitted unit curves in place of the compute model (no step time enters the fit)."""
    runs = [r for r in load_runs(RUNS).runs if r.measured_s is not None]
    curves = profile_curves(doc, runs[0])
    figures = variant_figures(runs, {"the file's framework": lambda p: p,
                                     "with the layer profile": lambda p: replace(p, eff_by_kind=curves,
                                                                                 act_traffic=0.0)})
    return {"runs": len(runs), "curves": [list(c) for c in curves], "figures": figures}


def transfer_scores(per_call: float) -> list[dict]:
    """The other Megatron-DeepSpeed sources at their files' parameters, and with ``per_call`` seconds more a
    collective call (``CostParams.collective_call_s``): what the profile's per-call cost would do to stacks it was
    not measured on. Reported, not adopted: each file states what its own stack measured."""
    out = []
    for path in (p for p in TRANSFER if p.exists()):
        runs = [r for r in load_runs(path).runs if r.measured_s is not None]
        figures = variant_figures(runs, {"as the file states": lambda p: p,
                                         "with the per-call cost": lambda p: replace(p, collective_call_s=per_call)})
        out.append({"source": path.stem, "runs": len(runs), "figures": figures})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "results" / "sailor_layer_profile.json"))
    args = ap.parse_args()
    doc = yaml.safe_load(PROFILE.read_text())
    table = rows(doc)
    reads = achieved(table)
    print(f"{'model':12s} {'gpu':9s} {'best fwd TFLOP/s':>17s} {'FP32 peak':>10s} {'TF32 peak':>10s}  read as")
    for a in reads:
        print(f"{a['model']:12s} {a['gpu']:9s} {a['fwd_tflops']:17.1f} {a['fp32_peak']:10.1f} {a['tf32_peak']:10.1f}  "
              f"{a['read_as']}{'  (above the FP32 peak)' if a['above_fp32_peak'] else ''}")
    summary = by_gpu(table)
    print(f"\n{'model':12s} {'gpu':9s} {'tp':>3s} {'mbs':>8s} {'pred/meas small':>16s} {'large':>7s} {'median':>7s} "
          f"{'counted traffic':>16s}")
    for s in summary:
        counted = f"{s['counted_median']:16.2f}" if s["counted_median"] is not None else f"{'-':>16s}"
        print(f"{s['model']:12s} {s['gpu']:9s} {s['tp']:3d} {s['mbs'][0]:3d}-{s['mbs'][1]:<4d} {s['ratio_small']:16.2f} "
              f"{s['ratio_large']:7.2f} {s['ratio_median']:7.2f} {counted}")
    ratios = [sum(r["predicted_ms"]) / sum(r["measured_ms"]) for r in table]
    print(f"\n{len(table)} rows: predicted / measured block forward + backward {min(ratios):.2f}-{max(ratios):.2f}, "
          f"median {statistics.median(ratios):.2f}")
    for model in sorted({r["model"] for r in table if r["ratio_counted"] is not None}):
        gpus = {}
        for r in table:
            if r["model"] == model:
                gpus.setdefault(r["gpu"], []).append(r["ratio_counted"])
        print(f"{model} with its counted act_traffic, median per GPU: "
              + ", ".join(f"{g} {statistics.median(v):.2f}" for g, v in gpus.items()))
    calls = call_costs(doc)
    print("\nper TP all-reduce call beyond the modelled collective, from the block curves (ms):")
    for c in calls:
        print(f"  {c['model']:12s} {c['gpu']:9s} tp {c['tp']}: {1e3 * c['per_collective_s']:6.3f}")
    nvlink = [c["per_collective_s"] for c in calls if c["gpu"] in NVLINK]
    per_call = statistics.median(nvlink)
    print(f"NVLink nodes: {1e3 * min(nvlink):.2f}-{1e3 * max(nvlink):.2f} ms a call, median {1e3 * per_call:.2f}")
    transfer = transfer_scores(per_call)
    print(f"\nother Megatron-DeepSpeed sources with {1e3 * per_call:.2f} ms a collective call (held out, not adopted):")
    for src in transfer:
        for how, f in src["figures"].items():
            rho = "-" if f["spearman"] is None else f"{f['spearman']:.2f}"
            regret = "-" if f["regret"] is None else f"{f['regret']:.3f}"
            print(f"  {src['source']:28s} {how:24s} MAPE {100 * f['mape']:5.1f}%  rho {rho:>5s}  regret {regret}")
    steps = step_scores(doc)
    print(f"\nSailor's {steps['runs']} GH200 step times: {'cost model':26s} {'MAPE%':>6s} {'rho':>5s} {'regret':>7s} "
          f"{'pred/meas':>10s}")
    for how, f in steps["figures"].items():
        lo, hi = f["ratio_range"]
        print(f"{'':31s}{how:26s} {100 * f['mape']:6.1f} {f['spearman']:5.2f} {f['regret']:7.3f} {lo:5.2f}-{hi:.2f}")
    print("  profile curves (kind, tp, zero, eff_max, overhead s): "
          + "; ".join(f"{k} tp{t} {e:.3f} {1e3 * o:.2f} ms" for k, t, _, e, o in steps["curves"]))
    out = {"what": __doc__.splitlines()[0], "source": str(PROFILE.relative_to(HERE.parent)), "precision": reads,
           "rows": table, "summary": summary, "median_ratio": statistics.median(ratios), "step_times": steps,
           "call_costs": calls, "nvlink_per_call_s": per_call, "transfer": transfer}
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
