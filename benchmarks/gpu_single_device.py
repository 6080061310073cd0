"""One GPU: autopar's runtime on CUDA against plain training, and its step time and memory against the cost model.

Parts, each written to the JSON as soon as it is done (a cut-off run keeps what it measured):

1. ``ceilings``: a large bf16 matmul (8192^3) and a device-to-device copy, against the catalogue's
   peak and HBM bandwidth for the device.
2. ``agreement``: a tiny transformers Llama through ``autopar.wrap`` (NCCL, world size 1) under
   several plans (checkpointing none / full / op, two micro-batches), against the same model trained
   plainly on the same GPU with AdamW: the losses of 3 steps (fp32, TF32 off).
3. ``steps``: a 4-layer Llama 3 8B-width transformers model (vocab 128256, sequence 8192), bf16 compute
   on fp32 master weights (``MixedPrecisionPolicy``), under plans of micro-batch 1-2, gradient
   accumulation, checkpointing none / full / op, eager and ``compile=True``: median step time and peak
   memory (allocated and reserved), next to ``estimate_plan``'s prediction with the default cost
   parameters (fused kernels, act_traffic 3) and with the eager block's counted act_traffic
   (benchmarks/eager_traffic.py). Nothing is fitted: the prediction is made before and apart from
   the measurement.
4. ``gemms`` (parts 1, 4 and 5 in benchmarks/gpu_matmuls.py): the 8B block's matmuls (forward, input-gradient and weight-gradient shapes) at TP 1-8
   and 8192 / 16384 rows: measured TFLOP/s over the large-matmul ceiling, next to the wave model's
   utilisation (cost_models/gemm_shapes.py).
5. ``depth``: 8192 x 8192 outputs reduced over 128 .. 16384, and 256 .. 4096 rows of a 4096-wide product:
   the per-tile fixed cost of a shallow reduction (``gemm_shapes.depth_utilisation`` is fitted to it).
6. ``breakdown``: device time per kernel over two steps (micro-batch 1, eager and compiled), torch.profiler.
7. ``mask``: one decoder layer's forward + backward with an explicit additive causal mask (what autopar's HF
   units passed every block before ``hf_units.block_mask``), against SDPA's own causal path (no mask).

The committed ``results/gpu_single_device.json`` merges four runs on one H200 (its ``runs`` says which part
came from which): steps before the mask change, then every part with it, the kernel breakdown, and the
matmuls timed between CUDA events.

    python benchmarks/gpu_single_device.py -o results/gpu_single_device.json      # on a GPU machine
    python benchmarks/gpu_single_device.py --quick -o /tmp/x.json                  # CPU smoke (tiny shapes)
    python benchmarks/gpu_single_device.py --table results/gpu_single_device.json  # the steps table of a results file
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from gpu_matmuls import ceilings, depth_sweep, gemms, sync, timed  # noqa: E402

from autopar.cluster.cluster import Cluster  # noqa: E402
from autopar.cluster.parse import load_cluster  # noqa: E402
from autopar.estimate import estimate_plan  # noqa: E402
from autopar.modelspec.load import load_model  # noqa: E402
from autopar.plan.compact import cpu_cluster, make_plan  # noqa: E402
from autopar.plan.schema import ModelRef  # noqa: E402
from cost_models import CostParams  # noqa: E402

RESULTS = HERE / "results" / "gpu_single_device.json"
# Llama 3 8B's block (torchtitan/models/llama/__init__.py; the HF config's widths)
BIG = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
           vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
# name -> (micro-batch size, micro-batches, block checkpointing, compile)
STEP_PLANS = {
    "mb1": (1, 1, "none", False),
    "mb1-full": (1, 1, "full", False),
    "mb1-op": (1, 1, "op", False),
    "mb2": (2, 1, "none", False),
    "mb1-m2": (1, 2, "none", False),
    "mb2-full": (2, 1, "full", False),
    "mb4-full": (4, 1, "full", False),
    "mb1-compile": (1, 1, "none", True),
    "mb2-compile": (2, 1, "none", True),
    "mb1-op-compile": (1, 1, "op", True),
}
AGREE_PLANS = {"dp": (8, 1, "none"), "full": (8, 1, "full"), "op": (8, 1, "op"), "m2": (4, 2, "none"),
               "m2-full": (4, 2, "full")}


def hf_llama(width: dict, layers: int, seq: int, meta: bool):
    import transformers
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, max_position_embeddings=seq, attn_implementation="sdpa",
                                   tie_word_embeddings=False, **width)
    if meta:
        with torch.device("meta"):
            return transformers.LlamaForCausalLM(cfg)
    return transformers.LlamaForCausalLM(cfg)


def units(layers: int) -> list[str]:
    return ["embed", *[f"layers.{i}" for i in range(layers)], "head"]


def plan_for(layers: int, mb: int, m: int, ckpt: str, seq: int, source: str, cluster: Cluster):
    ly = [(u, {"ckpt": ckpt} if u.startswith("layers.") else {}) for u in units(layers)]
    plan = make_plan([(mb, m, [([0], ly)])])
    plan.cluster = cluster
    plan.model = ModelRef("llama3-8b-width", seq_len=seq, num_layers=layers + 2, source=source)
    return plan


AGREE_RTOL = 1e-5  # the runtime tests' bound on CPU (fp32); a plan further from the reference fails the run


def step_model(quick: bool) -> tuple[dict, int, int]:
    """(widths, layers, sequence length) of the model the steps and breakdown parts train."""
    return (TINY, 2, 64) if quick else (BIG, 4, 8192)


def device_cluster(dev: torch.device) -> Cluster:
    """A one-device cluster of this device's catalogue type (a CPU "device" on the CPU)."""
    return cpu_cluster(1) if dev.type == "cpu" else load_cluster(f"1x{gpu_name(dev)}")


def wrap_llama(dev: torch.device, plan, quick: bool, comp: bool):
    """``autopar.wrap`` of a fresh meta-built ``step_model`` under ``plan``: bf16 compute on fp32 master weights on a
    GPU (fp32 on the CPU), fused AdamW on a GPU, inductor under ``comp`` (aot_eager on the CPU)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import autopar
    width, layers, seq = step_model(quick)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32,
                                  output_dtype=torch.float32)
    compile_arg = ({"backend": "aot_eager"} if dev.type == "cpu" else True) if comp else False
    return autopar.wrap(hf_llama(width, layers, seq, meta=True), plan, mixed_precision=policy,
                        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-5, fused=dev.type == "cuda"),
                        compile=compile_arg)


def agreement(dev: torch.device, quick: bool) -> dict:
    """Losses of wrap against plain AdamW training of the same tiny model on the same device (fp32, TF32 off)."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        return _agreement(dev)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def _agreement(dev: torch.device) -> dict:
    import autopar
    from autopar.runtime.materialize import init_weights
    seq, layers, steps = 32, 2, 3
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, TINY["vocab_size"], (8, seq), generator=g).to(dev)
    y = torch.randint(0, TINY["vocab_size"], (8, seq), generator=g).to(dev)
    base = init_weights(hf_llama(TINY, layers, seq, meta=True), seed=3).to(dev)
    ref = copy.deepcopy(base)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    ref_losses = []
    for _ in range(steps):
        loss = F.cross_entropy(ref(x).logits.flatten(0, 1).float(), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    cluster = device_cluster(dev)
    out = {"reference": ref_losses, "plans": {}}
    for name, (mb, m, ckpt) in AGREE_PLANS.items():
        plan = plan_for(layers, mb, m, ckpt, seq, "", cluster)
        pm = autopar.wrap(copy.deepcopy(base), plan, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        losses = [float(pm.step(x, y)) for _ in range(steps)]
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        out["plans"][name] = {"losses": losses, "max_rel_diff": diff, "agrees": diff <= AGREE_RTOL}
        print(f"agreement {name:8s} losses {' '.join(f'{v:.6f}' for v in losses)}  max rel diff {diff:.2e}"
              f"{'' if diff <= AGREE_RTOL else '  DISAGREES'}")
        del pm
    return out


def gpu_name(dev: torch.device) -> str:
    """The catalogue's name for this device, from its CUDA name (an A100 by its memory)."""
    if dev.type == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name(dev)
    for key in ("GH200", "H200", "H100 PCIe", "H100", "B200", "A100", "L40S", "L4", "A10"):  # longer names first
        if key in name:
            if key == "A100":
                return "A100-80G" if torch.cuda.get_device_properties(dev).total_memory > 60e9 else "A100-40G"
            return "H100-PCIe" if key == "H100 PCIe" else key
    raise SystemExit(f"device {name!r}: add its catalogue name to gpu_name")


def predictions(plan, spec, eager_traffic: float) -> dict:
    fused = estimate_plan(plan, spec, CostParams())
    eager = estimate_plan(plan, spec, CostParams(act_traffic=eager_traffic))
    st = fused.pipelines[0][0]
    return {"step_s_fused": fused.step_time_s, "step_s_eager": eager.step_time_s,
            "memory_gib": st.memory_bytes / 2**30, "fits": fused.fits}


def steps(dev: torch.device, quick: bool, out: dict, save) -> None:
    from eager_traffic import hf_block, saved_bytes
    width, layers, seq = step_model(quick)
    w = width
    c = hf_block(w["hidden_size"], w["num_attention_heads"], w["num_key_value_heads"], w["intermediate_size"], seq)
    traffic = (c["fwd"] + c["bwd"]) / saved_bytes(w["hidden_size"], w["num_attention_heads"],
                                                  w["num_key_value_heads"], w["intermediate_size"], seq)
    cfg_path = Path(os.environ.get("TMPDIR", "/tmp")) / "autopar_gpu_llama.json"
    cfg_path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers, "max_position_embeddings": seq,
                                    "tie_word_embeddings": False, "attn_implementation": "sdpa", **width}))
    spec = load_model(str(cfg_path), seq_len=seq)
    gpu = gpu_name(dev)
    cluster = load_cluster("1xH100" if gpu == "cpu" else f"1x{gpu}")
    out["steps"] = {"model": {"layers": layers, "seq_len": seq, **width}, "predicted_on": cluster.nodes[0].gpu.name,
                    "eager_act_traffic": traffic, "plans": {}}
    for name, (mb, m, ckpt, comp) in STEP_PLANS.items():
        plan = plan_for(layers, mb, m, ckpt, seq, str(cfg_path), cluster)
        row = predictions(plan, spec, traffic)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, width["vocab_size"], (mb * m, seq), generator=g).to(dev)
        y = torch.randint(0, width["vocab_size"], (mb * m, seq), generator=g).to(dev)
        gc.collect()  # the previous plan's model and optimizer (autograd hooks hold reference cycles)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
            row["baseline_gib"] = torch.cuda.memory_allocated(dev) / 2**30
        t0 = time.perf_counter()
        try:
            pm = wrap_llama(dev, plan, quick, comp)
            losses: list[float] = []
            times = timed(lambda pm=pm, x=x, y=y, losses=losses: losses.append(float(pm.step(x, y))), dev, 3, 2 if quick else 6)
            row.update(step_s=statistics.median(times), step_s_all=times, losses=losses,
                       setup_and_warmup_s=time.perf_counter() - t0 - sum(times))
            if dev.type == "cuda":
                row.update(max_allocated_gib=torch.cuda.max_memory_allocated(dev) / 2**30,
                           max_reserved_gib=torch.cuda.max_memory_reserved(dev) / 2**30)
                torch.cuda.reset_peak_memory_stats(dev)  # one more step: its own peak, and what stays between steps
                pm.step(x, y)
                sync(dev)
                row.update(steady_peak_gib=torch.cuda.max_memory_allocated(dev) / 2**30,
                           between_steps_gib=torch.cuda.memory_allocated(dev) / 2**30)
            del pm
        except torch.OutOfMemoryError as e:
            row.update(error=f"out of memory: {str(e).splitlines()[0]}")
        except Exception as e:  # noqa: BLE001 - a failed plan is a result; the rest still run
            row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        out["steps"]["plans"][name] = row
        save()
        meas = row.get("step_s")
        print(f"step {name:12s} measured {meas if meas is None else round(meas, 4)}  predicted fused "
              f"{row['step_s_fused']:.4f} eager {row['step_s_eager']:.4f}  memory {row.get('max_allocated_gib', 0):.1f}"
              f" GiB (steady {row.get('steady_peak_gib', 0):.1f}, reserved {row.get('max_reserved_gib', 0):.1f}, predicted "
              f"{row['memory_gib']:.1f}) "
              f"{row.get('error', '')}")


def breakdown(dev: torch.device, quick: bool) -> dict:
    """Device time per kernel over two steps of the 4-layer model at micro-batch 1, eager and compiled."""
    from torch.profiler import ProfilerActivity, profile
    width, layers, seq = step_model(quick)
    cluster = device_cluster(dev)
    out = {}
    for comp in (False, True):
        gc.collect()
        pm = wrap_llama(dev, plan_for(layers, 1, 1, "none", seq, "", cluster), quick, comp)
        x = torch.randint(0, width["vocab_size"], (1, seq), device=dev)
        for _ in range(3):
            pm.step(x, x)
        sync(dev)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            t = time.perf_counter()
            for _ in range(2):
                pm.step(x, x)
            sync(dev)
            wall = (time.perf_counter() - t) / 2
        kernels = []
        for ev in prof.key_averages():
            dt_us = getattr(ev, "self_device_time_total", None)
            if dt_us is None:
                dt_us = getattr(ev, "self_cuda_time_total", 0.0)
            if dt_us and ev.key:  # kernels (device type CUDA); anything else with device time is kept, named
                kernels.append({"name": ev.key[:160], "s_per_step": dt_us / 2e6, "calls_per_step": ev.count / 2,
                                "device": str(getattr(ev, "device_type", ""))})
        kernels.sort(key=lambda k: -k["s_per_step"])
        name = "compile" if comp else "eager"
        out[name] = {"step_wall_s": wall, "kernel_s": sum(k["s_per_step"] for k in kernels),
                     "kernels": kernels[:60], "kernel_launches": sum(k["calls_per_step"] for k in kernels)}
        print(f"breakdown {name}: wall {wall * 1e3:.1f} ms, kernels {out[name]['kernel_s'] * 1e3:.1f} ms, "
              f"{out[name]['kernel_launches']:.0f} launches")
        for k in kernels[:12]:
            print(f"   {k['s_per_step'] * 1e3:8.2f} ms {k['calls_per_step']:6.0f}x  {k['name'][:100]}")
        del pm
    return out


def mask_cost(dev: torch.device, quick: bool) -> dict:
    """One decoder layer fwd + bwd with the units' explicit causal mask against SDPA's causal path."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    from autopar.models.hf_units import causal_mask
    w, seq = (TINY, 64) if quick else (BIG, 8192)
    cfg = transformers.LlamaConfig(num_hidden_layers=1, max_position_embeddings=seq, attn_implementation="sdpa", **w)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    layer = LlamaDecoderLayer(cfg, 0).to(dev, dt)
    rope = LlamaRotaryEmbedding(cfg).to(dev)
    x = torch.randn(1, seq, w["hidden_size"], device=dev, dtype=dt, requires_grad=True)
    pos = torch.arange(seq, device=dev)[None]
    cos, sin = rope(x, pos)
    out = {}
    for name, masked in (("explicit_mask", True), ("is_causal", False)):
        def run(masked=masked):
            mask = causal_mask(x) if masked else None
            o = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
            o = o[0] if isinstance(o, tuple) else o
            o.float().pow(2).mean().backward()
        with torch.no_grad():
            y = layer(x, attention_mask=causal_mask(x) if masked else None, position_ids=pos,
                      position_embeddings=(cos, sin))
        out[name] = {"fwd_bwd_s": statistics.median(timed(run, dev, 3, 10)),
                     "checksum": float((y[0] if isinstance(y, tuple) else y).float().abs().mean())}
    print(f"mask: explicit {out['explicit_mask']['fwd_bwd_s'] * 1e3:.2f} ms, is_causal "
          f"{out['is_causal']['fwd_bwd_s'] * 1e3:.2f} ms per layer fwd+bwd")
    return out


def step_table(out: dict) -> None:
    """The steps part as a table: measured step and peak memory, and the estimates over them."""
    plans = out.get("steps", {}).get("plans", {})
    if not plans:
        return
    print(f"{'plan':15s} {'step s':>8s} {'default/meas':>12s} {'eager/meas':>10s} {'peak GiB':>9s} {'est GiB':>8s}")
    for name, r in plans.items():
        if "step_s" not in r:
            print(f"{name:15s} {r.get('error', 'not measured')}")
            continue
        print(f"{name:15s} {r['step_s']:8.4f} {r['step_s_fused'] / r['step_s']:12.3f} {r['step_s_eager'] / r['step_s']:10.3f}"
              f" {r.get('max_allocated_gib', 0.0):9.1f} {r['memory_gib']:8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(RESULTS))
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a CPU smoke run of every part)")
    ap.add_argument("--table", metavar="RESULTS", help="print the steps table of a results file and exit (no GPU needed)")
    ap.add_argument("--parts", default="ceilings,agreement,mask,gemms,depth,breakdown,steps")
    args = ap.parse_args()
    if args.table:
        step_table(json.loads(Path(args.table).read_text()))
        return
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29533"}.items():
        os.environ.setdefault(k, v)
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    out = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "quick": args.quick}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        raise SystemExit("gpu_single_device needs transformers") from None
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        path.write_text(json.dumps(out, indent=1) + "\n")

    parts = {"ceilings": ceilings, "agreement": agreement, "mask": mask_cost, "gemms": gemms, "depth": depth_sweep,
             "breakdown": breakdown}  # name -> fn(device, quick): its JSON entry ("steps" saves as it goes)
    for name in args.parts.split(","):
        if name == "steps":
            steps(dev, args.quick, out, save)
        elif name in parts:
            out[name] = parts[name](dev, args.quick)
            save()
        else:
            raise SystemExit(f"--parts: unknown part {name!r}; use {', '.join([*parts, 'steps'])}")
    bad = [n for n, r in out.get("agreement", {}).get("plans", {}).items() if not r["agrees"]]
    if bad:
        raise SystemExit(f"agreement: {', '.join(bad)} differ from plain training by more than {AGREE_RTOL}")
    step_table(out)
    if "ceilings" in out:
        print(f"ceilings: matmul {out['ceilings']['matmul_tflops']:.0f} TFLOP/s, copy {out['ceilings']['copy_gbps']:.0f} GB/s")
    save()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
