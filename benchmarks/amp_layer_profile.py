"""AMP's published per-layer profile against the cost model: one GPT-2 medium block's forward, per GPU and TP degree.

AMP (DachengLi1/AMP) timed every pipeline layer's forward on the clusters its step times come from
(``benchmarks/data/layer_profiles/amp_gpt2_medium.yaml``: T4 and V100, TP 1, 2, 4, micro-batch 1). The cost
model prices the same block with its defaults (``cost_models.layer``: compute at the catalogue's sustained peak
times ``eff_max``, the memory-bound kernels, the TP all-reduces over the file's own node links, the per-call
``layer_overhead_s``). The gap, measured minus predicted, is what the defaults do not know about that software
stack: it is close to one figure per block across GPUs and TP degrees, a per-layer cost of the framework (Megatron
1.1.5 in AMP's DeepSpeed fork), not of the hardware. Nothing here is fitted.

Then the AMP step times are scored three ways: the defaults; the defaults plus the profile (each TP degree's gap as
the block's per-call overhead, ``CostParams.eff_by_kind``, as an ``autopar profile`` of that stack would record it:
the GPU's own gaps on the homogeneous T4 cluster, AMP's own 0.75 V100 + 0.25 T4 weighting on the mixed one); and
AMP's own cost model (``source_predicted_s``), which reads the same profile. No step time enters any of them.

    python benchmarks/amp_layer_profile.py    # prints the table, writes results/amp_layer_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from autopar.calibrate import scores
from autopar.calibrate.score import predicted_under
from autopar.estimate import plan_cost_params
from autopar.estimate.context import StageContext
from autopar.measured import load_runs
from autopar.plan.schema import Strategy
from cost_models.layer import one_layer_cost

HERE = Path(__file__).resolve().parent
PROFILE = HERE / "data" / "layer_profiles" / "amp_gpt2_medium.yaml"
# The measured files whose clusters and model the profiles were taken on (T4: the homogeneous cluster; V100: the
# p3.8xlarge nodes of the heterogeneous one).
RUNS = {"T4": HERE.parents[1] / "shared" / "measured" / "amp_homogeneous.yaml",
        "V100-16G": HERE / "data" / "amp_het_cluster.yaml"}


def predicted_block_forward(gpu: str, tp: int) -> float:
    """The cost model's forward seconds of one block at micro-batch 1 on ``tp`` GPUs of one ``gpu`` node."""
    path = RUNS[gpu] if RUNS[gpu].exists() else HERE / "data" / "amp_het_cluster.yaml"
    run = load_runs(path).runs[0]
    cluster = run.plan.cluster
    node = next(i for i, nd in enumerate(cluster.nodes) if nd.gpu.name == gpu)
    devices = tuple(cluster.node_devices(node))[:tp]
    block = next(layer for layer in run.model.layers if layer.kind == "block")
    ctx = StageContext(cluster, devices, micro_batch_size=1, num_microbatches=1, params=plan_cost_params(run.plan))
    return one_layer_cost(block, Strategy(tp=tp), ctx).fwd


def rows() -> list[dict]:
    doc = yaml.safe_load(PROFILE.read_text())
    first, last = doc["blocks"]
    out = []
    for p in doc["profiles"]:
        measured = statistics.fmean(p["forward_s"][first:last + 1])
        pred = predicted_block_forward(p["gpu"], p["tp"])
        out.append({"gpu": p["gpu"], "tp": p["tp"], "measured_ms": 1e3 * measured, "predicted_ms": 1e3 * pred,
                    "ratio": pred / measured, "gap_ms": 1e3 * (measured - pred)})
    return out


def _weights(gpu: str) -> dict[str, float]:
    return {"T4": 1.0} if gpu == "T4" else {"V100-16G": 0.75, "T4": 0.25}  # src/cost_het_cluster.py's weighting


def step_scores(table: list[dict]) -> list[dict]:
    """Per AMP source: MAPE, Spearman, regret with the defaults, with the profile's per-block overhead, and AMP's."""
    gap = {(r["gpu"], r["tp"]): r["gap_ms"] * 1e-3 for r in table}
    out = []
    for gpu, path in RUNS.items():
        if not path.exists():
            continue
        runs = [r for r in load_runs(path).runs if r.measured_s is not None]
        rows = tuple(("block", t, 0, None, sum(w * gap[(g, t)] for g, w in _weights(gpu).items())) for t in (1, 2, 4))
        groups, measured = [r.group for r in runs], [r.measured_s for r in runs]
        figures = {}
        for how, change in (("defaults", lambda p: p),
                            ("with the layer profile", lambda p, rows=rows: replace(
                                p, eff_by_kind=tuple((k, t, z, p.eff_max, o) for k, t, z, _, o in rows)))):
            figures[how] = scores(groups, predicted_under(runs, change), measured)
        amp = [(r.source_predicted_s, r.measured_s, r.group) for r in runs if r.source_predicted_s]
        figures["AMP's own model"] = scores([a[2] for a in amp], [a[0] for a in amp], [a[1] for a in amp])
        out.append({"source": path.stem, "runs": len(runs), "figures": figures})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "results" / "amp_layer_profile.json"))
    args = ap.parse_args()
    table = rows()
    print(f"{'gpu':10s} {'tp':>3s} {'measured ms':>12s} {'predicted ms':>13s} {'pred/meas':>10s} {'gap ms':>8s}")
    for r in table:
        print(f"{r['gpu']:10s} {r['tp']:3d} {r['measured_ms']:12.3f} {r['predicted_ms']:13.3f} {r['ratio']:10.2f} "
              f"{r['gap_ms']:8.3f}")
    gaps = [r["gap_ms"] for r in table]
    print(f"gap per block forward: {min(gaps):.2f} to {max(gaps):.2f} ms (median {statistics.median(gaps):.2f})")
    steps = step_scores(table)
    print(f"\n{'source':22s} {'runs':>5s} {'cost model':24s} {'MAPE%':>6s} {'rho':>6s} {'regret':>7s}")
    for src in steps:
        for how, f in src["figures"].items():
            print(f"{src['source']:22s} {src['runs']:5d} {how:24s} {100 * f['mape']:6.1f} {f['spearman']:6.2f} "
                  f"{f['regret']:7.3f}")
    out = {"what": __doc__.splitlines()[0], "source": str(PROFILE.relative_to(HERE.parent)), "rows": table,
           "gap_ms": {"min": min(gaps), "max": max(gaps), "median": statistics.median(gaps)}, "step_times": steps}
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
