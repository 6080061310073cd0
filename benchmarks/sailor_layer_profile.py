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

    python benchmarks/sailor_layer_profile.py    # prints the tables, writes results/sailor_layer_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from autopar.cluster.catalogue import gpu as gpu_type
from autopar.cluster.parse import load_cluster
from autopar.estimate.context import StageContext
from autopar.measured.model import model_from_config
from autopar.modelspec.spec import LayerSpec
from autopar.plan.schema import Strategy
from cost_models.layer import one_layer_cost
from cost_models.params import CostParams

HERE = Path(__file__).resolve().parent
PROFILE = HERE / "data" / "layer_profiles" / "sailor_megatron_deepspeed.yaml"
FP32_BYTES = 4


def block_of(shape: dict, cache: dict) -> LayerSpec:
    """The cost model's block of a profiled shape: a GPT block (learned positions, LayerNorm, 4h MLP), fp32
    activations, eager attention."""
    cfg = {"model_type": "gpt2", "n_layer": shape["layers"], "n_embd": shape["hidden"], "n_head": shape["heads"],
           "n_inner": shape["ffn"], "vocab_size": 50304, "n_positions": shape["seq_len"],
           "tie_word_embeddings": False, "attn_implementation": "eager"}
    model, _ = model_from_config(cfg, shape["seq_len"], "profile", cache, dtype_bytes=FP32_BYTES)
    return next(layer for layer in model.layers if layer.kind == "block")


def predicted(block: LayerSpec, gpu: str, node_gpus: int, tp: int, mbs: int, precision: str) -> tuple[float, float]:
    """(forward, backward) seconds the defaults give one block on ``tp`` GPUs of one ``gpu`` node."""
    cluster = load_cluster(f"1x{node_gpus}x{gpu}").at_precision(precision)
    ctx = StageContext(cluster, tuple(cluster.node_devices(0))[:tp], micro_batch_size=mbs, num_microbatches=1,
                       params=CostParams())
    cost = one_layer_cost(block, Strategy(tp=tp), ctx)
    return cost.fwd, cost.bwd


def rows(doc: dict) -> list[dict]:
    cache: dict = {}
    out = []
    for prof in doc["profiles"]:
        block = block_of(doc["models"][prof["model"]], cache)
        for r in prof["rows"]:
            precision = "tf32" if r["gpu"] in doc["tf32"][prof["model"]] else "fp32"
            fwd, bwd = predicted(block, r["gpu"], doc["node_gpus"][r["gpu"]], r["tp"], r["mbs"], precision)
            mf, mb = r["block_s"]
            out.append({"model": prof["model"], "gpu": r["gpu"], "tp": r["tp"], "mbs": r["mbs"], "precision": precision,
                        "measured_ms": [1e3 * mf, 1e3 * mb], "predicted_ms": [1e3 * fwd, 1e3 * bwd],
                        "ratio": [fwd / mf, bwd / mb],
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
        out.append({"model": key[0], "gpu": key[1], "tp": key[2], "mbs": [rs[0]["mbs"], rs[-1]["mbs"]],
                    "ratio_small": both[0], "ratio_large": both[-1], "ratio_median": statistics.median(both)})
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
    print(f"\n{'model':12s} {'gpu':9s} {'tp':>3s} {'mbs':>8s} {'pred/meas small':>16s} {'large':>7s} {'median':>7s}")
    for s in summary:
        print(f"{s['model']:12s} {s['gpu']:9s} {s['tp']:3d} {s['mbs'][0]:3d}-{s['mbs'][1]:<4d} {s['ratio_small']:16.2f} "
              f"{s['ratio_large']:7.2f} {s['ratio_median']:7.2f}")
    ratios = [sum(r["predicted_ms"]) / sum(r["measured_ms"]) for r in table]
    print(f"\n{len(table)} rows: predicted / measured block forward + backward {min(ratios):.2f}-{max(ratios):.2f}, "
          f"median {statistics.median(ratios):.2f}")
    out = {"what": __doc__.splitlines()[0], "source": str(PROFILE.relative_to(HERE.parent)), "precision": reads,
           "rows": table, "summary": summary, "median_ratio": statistics.median(ratios)}
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
