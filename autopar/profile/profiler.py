"""``run_profile``: measure this machine for one model and return the profile document.

Three parts, each with the real runtime pieces (autopar/profile/*.py says how):
1. one job of ``nproc`` fork-started ranks times every layer unit inside real ``autopar.wrap`` steps
   at several rows per rank, under each checkpointing mode, each TP degree and ZeRO-3 (all ranks at
   once), the matmul peak, the copy bandwidth and the optimizer step, then every collective over
   message sizes for each group size 2 .. nproc;
2. ``autopar.wrap`` runs short calibration plans for the memory model (ZeRO stages, TP, SP);
3. fits: the compute curve per (layer kind, TP degree, ZeRO-3), alpha-beta per collective and group
   size, GenModel's extra terms across group sizes, the ZeRO state table, the per-unit activation
   split, and what a step costs beyond all that (``_step_overhead``).
Every timed point is taken again while other processes use the CPUs (``quiet.quietly``) and the
fastest of two sweeps is kept, so a shared machine bends the profile less.
"""

from __future__ import annotations

import datetime
import platform
import socket

import torch
import torch.distributed as dist

from autopar.cluster.catalogue import lookup
from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec
from autopar.profile import comm as comm_mod
from autopar.profile import compute as comp
from autopar.profile import fit
from autopar.profile.charged import MachineComm, comm_fields
from autopar.profile.io import PROFILE_VERSION, VERSION_KEY
from autopar.profile.memory import measure_memory, memory_runs, state_table, unit_calibration
from autopar.profile.reference import DEFAULT_MODEL, build_module
from autopar.profile.runs import fresh_store, rank_device
from autopar.runtime.local_ranks import run_distributed
from autopar.version import __version__

SIZES = [2**10, 2**12, 2**14, 2**16, 2**18, 2**20, 2**22, 2**24]
QUICK_SIZES = [2**10, 2**16, 2**20]
MBS = [1, 2, 4, 8]
QUICK_MBS = [1, 2]
CKPTS = ["none", "selective", "full"]


def pick_device(device: str | None, nproc: int) -> str:
    """"cuda" when asked or (by default) when there is a GPU per rank; else "cpu"."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "cpu"
    if device == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < nproc):
        raise AutoparError("device", f"cuda needs {nproc} GPUs, {torch.cuda.device_count()} visible",
                           "lower --nproc or use --device cpu")
    if device not in ("cpu", "cuda"):
        raise AutoparError("device", f"unknown device {device!r}", "use auto, cpu or cuda")
    return device


def device_identity(device: str) -> dict:
    """The device type as the cluster catalogue names it, and its own name."""
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        words = name.replace("NVIDIA", "").split()
        canon = lookup(name) or next((lookup(" ".join(words[:k])) for k in range(len(words), 0, -1)
                                      if lookup(" ".join(words[:k]))), None)
        return {"type": canon or name, "name": name, "backend": "nccl"}
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return {"type": "cpu", "name": name, "backend": "gloo"}


def _job(rank: int, world: int, module_fn, spec: ModelSpec, device: str, quick: bool, progress: bool,
         store: str) -> dict:
    """One rank of the compute + communication job."""
    dev = rank_device(rank, world, device, store)
    backend = None
    torch.manual_seed(0)
    model = module_fn().to(dev)
    mbs, sizes = (QUICK_MBS, QUICK_SIZES) if quick else (MBS, SIZES)
    reps = 3 if quick else 7
    sweeps = 1 if quick else 2
    tries = 1 if quick else 3  # quick (tests): no waiting for other processes to finish
    configs = comp.compute_configs(spec, world, mbs, CKPTS, tp_degrees(spec, world))
    total = sweeps * (len(configs) + len(sizes) * (world - 1))
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="profile: compute + comm", unit="pt", leave=False)
    # Sweeps run one after the other and each point keeps its fastest sweep: a burst of other work on
    # the machine slows one sweep, not the profile.
    samples, steps = None, None
    for _ in range(sweeps):
        got_steps: list[dict] = []
        got = comp.measure_units(module_fn, spec, configs, world, dev, reps, progress=bar, tries=tries,
                                 steps=got_steps)
        samples = got if samples is None else [a if a.fwd_s + a.bwd_s <= b.fwd_s + b.bwd_s else b
                                               for a, b in zip(samples, got)]
        steps = got_steps if steps is None else [a if a["step_s"] <= b["step_s"] else b
                                                 for a, b in zip(steps, got_steps)]
    dtype = next(model.parameters()).dtype
    out = {
        "samples": [s.to_dict() for s in samples],
        "steps": steps,
        "peak_flops": comp.measure_peak_flops(dev, dtype, quick),
        "copy_bw": comp.measure_copy_bandwidth(dev, quick),
        "optimizer": comp.measure_optimizer(model, dev, reps),
    }
    dist.barrier()
    out["comm"] = None
    for _ in range(sweeps):  # as for compute: each point keeps its fastest sweep
        got = comm_mod.measure_comm(rank, world, sizes, dev, reps, backend=backend, progress=bar, tries=tries)
        out["comm"] = got if out["comm"] is None else {
            n: {k: [min(a, b) if k != "others_share" else max(a or 0.0, b or 0.0) for a, b in zip(v, got[n][k])]
                for k, v in per.items()} for n, per in out["comm"].items()}
    if bar is not None:
        bar.close()
    return out


def tp_degrees(spec: ModelSpec, world: int) -> list[int]:
    """TP degrees > 1 the compute profile times: powers of two dividing ``world`` that some unit allows."""
    out, t = [], 2
    while t <= world:
        if world % t == 0 and any(ly.supports_tp and ly.tp_ok(t) for ly in spec.layers):
            out.append(t)
        t *= 2
    return out


def _median_over_ranks(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def _compute_part(per_rank: list[dict], spec: ModelSpec, comm: dict, dtype_bytes: int, device: str) -> dict:
    layers = {ly.name: ly for ly in spec.layers}
    peak = _median_over_ranks([r["peak_flops"] for r in per_rank])
    hbm = _median_over_ranks([r["copy_bw"] for r in per_rank])
    machine = MachineComm.of(comm, dtype_bytes, device, hbm, len(per_rank))

    def key(s: dict) -> tuple:
        return s["unit"], s["mbs"], s["ckpt"], s["tp"], s["zero"]

    by_key: dict[tuple, list[dict]] = {}
    for r in per_rank:
        for s in r["samples"]:
            by_key.setdefault(key(s), []).append(s)
    merged = []
    for rows in by_key.values():  # ranks run in lock step: the slowest one sets the pace
        row = dict(max(rows, key=lambda s: s["fwd_s"] + s["bwd_s"]))
        row["others_share"] = max((s["others_share"] or 0.0) for s in rows)
        ly = layers[row["unit"]]
        tp = row["tp"]
        row["recompute_flops"] = ly.recompute_flops(row["ckpt"]) * row["mbs"] / tp
        # what one rank computes, and the communication the model charges apart from compute, which the
        # fit takes off (TP collectives and exposed ZeRO traffic, under the file format's key)
        row["flops_per_rank"] = row["flops"] / tp
        row["tp_comm_s"] = machine.charged_s(ly, row)
        merged.append(row)
    tp1 = [s for s in merged if s["tp"] == 1 and s.get("zero", 0) == 0]
    fits = {"all": fit.fit_efficiency(tp1, peak), "by_kind": {}}
    for kind, tp, zero in sorted({(s["kind"], s["tp"], s.get("zero", 0)) for s in merged}):
        f = fit.fit_efficiency([s for s in merged if (s["kind"], s["tp"], s.get("zero", 0)) == (kind, tp, zero)], peak)
        if f is not None:
            label = kind + (f"@tp{tp}" if tp > 1 else "") + ("@zero3" if zero == 3 else "")
            fits["by_kind"][label] = {**f, "kind": kind, "tp": tp, "zero": zero}
    zero = {}
    for s in tp1:
        if s["flops"] <= 0 and s["ckpt"] == "none":
            zero.setdefault(s["unit"], []).append((s["fwd_s"] + s["bwd_s"]) / s["mbs"])
    opt = dict(per_rank[0]["optimizer"])
    opt["seconds"] = _median_over_ranks([r["optimizer"]["seconds"] for r in per_rank])
    opt["opt_bytes_touched"] = opt["seconds"] * hbm / opt["params"]
    return {"peak_tflops": peak / 1e12, "hbm_gbps": hbm / 1e9, "samples": merged, "fit": fits,
            "act_traffic": "0: the measured unit times already include their memory-bound kernels",
            "zero_flop_units": {u: {"seconds_per_sample": sum(v) / len(v), "modelled_as": 0.0}
                                for u, v in zero.items()},
            "optimizer": opt}


def _comm_part(per_rank: list[dict], sizes: list[int]) -> dict:
    measured = per_rank[0]["comm"]
    fits, points = {}, {}
    for n, per in measured.items():
        fits[n] = {c: fit.fit_alpha_beta(sizes, per[c]) for c in comm_mod.COLLECTIVES}
        for c in comm_mod.COLLECTIVES:
            points.setdefault(c, []).extend((n, s, t) for s, t in zip(sizes, per[c]))
    genmodel = {c: fit.fit_genmodel(c, pts) for c, pts in points.items()}
    out = {"sizes": sizes, "group_sizes": sorted(measured), "measured": measured, "fits": fits,
           "genmodel": genmodel}
    if fits:
        per = fits[min(fits)]
        p2p = per["p2p"]
        beta, src = p2p["beta_s_per_byte"], f"p2p between 2 ranks (rel_rms {p2p['rel_rms']:.3f})"
        if beta <= 0:  # no size slope in the p2p points (noise): the slowest collective's per-byte time
            beta = max(f["beta_s_per_byte"] for f in per.values())
            src += "; bandwidth from the slowest collective (p2p showed no size slope)"
        out["link"] = {"bw_gbps": 1.0 / max(beta, 1e-18) / 1e9, "lat_us": p2p["alpha_s"] * 1e6, "from": src}
    return out


def _cost_params(compute: dict, comm: dict, memory: dict, dtype_bytes: int, device: str) -> tuple[dict, dict]:
    """The CostParams fields the profile sets, and the assumptions (stated, not measured) among them."""
    fa = compute["fit"]["all"]
    table = memory["state_table"]
    comm_set = comm_fields(comm["fits"], dtype_bytes, device)  # as the compute fit's subtraction priced it
    params = {
        "eff_max": fa["eff_max"], "layer_overhead_s": fa["layer_overhead_s"],
        "eff_by_kind": [[f["kind"], f["tp"], f["zero"], f["eff_max"], f["layer_overhead_s"]]
                        for f in compute["fit"]["by_kind"].values()],
        "comm_fit": comm_set["comm_fit"],
        "state_table": [[table[f"zero{z}"]["a"], table[f"zero{z}"]["b"]] for z in range(4)],
        "param_bytes": comm_set["param_bytes"], "grad_comm_bytes": comm_set["grad_comm_bytes"],
        "state_bytes": table["zero0"]["a"] + table["zero0"]["b"],
        "opt_bytes_touched": compute["optimizer"]["opt_bytes_touched"],
        "overlap_sync": 0.0,
        "overlap_zero3": comm_set["overlap_zero3"],
        "link_efficiency": comm_set["link_efficiency"],
        "collective_call_s": comm_set["collective_call_s"],
        "act_traffic": 0.0,
    }
    assumptions = {
        "overlap_sync": "0: autopar.runtime sums each unit's gradients once, after the step's last backward "
                        "(runtime/grad_sync.py), so nothing of the sync hides behind compute",
        "overlap_zero3": ("0: on CPU the gloo collectives of FSDP2's prefetch run on the cores that compute"
                          if device == "cpu" else "1: FSDP2 prefetches on its own CUDA stream"),
        "act_traffic": "0: the measured unit times already include their memory-bound kernels",
        "link_efficiency": "1: the link is measured, so it is what the collectives reach, not a line rate",
        "collective_call_s": "0: the link's latency is a measured call's (p2p), its fixed cost included",
        "zero_flop_units": "units without FLOPs (embeddings) cost 0 in the model; their measured time is listed",
    }
    return params, assumptions


def _step_overhead(per_rank: list[dict], spec: ModelSpec, doc: dict, world: int) -> dict:
    """What a runtime step costs beyond its units and the model's step terms, per unit.

    For each compute config (a real single-stage step): the slowest rank's step time minus its units'
    forward + backward minus the cost model's own step-level terms (gradient sync not hidden, optimizer)
    under the profile's numbers. What is left (the loss all-reduce, flattening gradients for the sync,
    the runner between units, zeroing gradients) is spread over the units: ``step_overhead_per_unit_s``.
    """
    from dataclasses import replace

    from autopar.cluster.parse import load_cluster
    from autopar.estimate import CostCache, estimate_plan
    from autopar.profile.apply import apply_profile, apply_profile_model
    from autopar.profile.io import Profile
    from cost_models import CostParams

    prof = Profile(doc)
    model = apply_profile_model(spec, prof)
    try:
        cluster, params = apply_profile(load_cluster(f"{world}x{prof.device_type}"), CostParams(), prof)
    except AutoparError as err:  # a device the catalogue does not know: no cluster to estimate on
        return {"configs": [], "per_unit_s": 0.0, "note": f"not calibrated: {err}"}
    rows = []
    costs = CostCache()
    for i, cfg in enumerate(per_rank[0]["steps"]):
        worst = max((r["steps"][i] for r in per_rank), key=lambda c: c["step_s"])
        plan = replace(comp.config_plan(spec, cfg, world), cluster=cluster)
        est = estimate_plan(plan, model, params, costs)
        modelled = est.pipelines[0][0].step_s
        rows.append({**{k: cfg[k] for k in ("rows", "ckpt", "tp", "zero")}, "step_s": worst["step_s"],
                     "units_s": worst["units_s"], "model_step_terms_s": modelled,
                     "residual_s": worst["step_s"] - worst["units_s"] - modelled})
    res = sorted(r["residual_s"] for r in rows)
    median = res[len(res) // 2] if res else 0.0
    return {"configs": rows, "per_unit_s": max(0.0, median) / spec.num_layers}


def run_profile(model: str = DEFAULT_MODEL, nproc: int = 2, quick: bool = False, seq_len: int | None = None,
                device: str | None = None, progress: bool = False) -> dict:
    """Measure this machine with ``nproc`` local processes for ``model``; return the profile document."""
    from autopar.modelspec.load import load_model

    if nproc < 1:
        raise AutoparError("nproc", f"must be at least 1, got {nproc}", "pass --nproc 2 (or more)")
    dev = pick_device(device, nproc)
    dtype_bytes = 4  # the runtime trains in the model's own dtype: fp32 here
    spec = load_model(model, seq_len, dtype_bytes=dtype_bytes)
    build_module(model, spec.seq_len)  # fails early (one line) if the model cannot run here

    def module_fn():
        return build_module(model, spec.seq_len)

    sizes = QUICK_SIZES if quick else SIZES
    per_rank = run_distributed(_job, nproc, module_fn, spec, dev, quick, progress, fresh_store(), timeout_s=1800.0)
    comm = _comm_part(per_rank, sizes)
    compute = _compute_part(per_rank, spec, comm, dtype_bytes, dev)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(memory_runs(spec, nproc)), desc="profile: memory runs", unit="run", leave=False)
    runs = measure_memory(module_fn, spec, nproc, device=dev, progress=bar)
    if bar is not None:
        bar.close()
    memory = {"state_table": state_table(runs, spec.num_params, nproc),
              "units": unit_calibration(runs, spec, nproc),
              "runs": {k: {kk: vv for kk, vv in v.items() if kk != "unit_params"} for k, v in runs.items()}}
    params, assumptions = _cost_params(compute, comm, memory, dtype_bytes, dev)
    ident = device_identity(dev)
    doc = {
        VERSION_KEY: PROFILE_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "autopar": __version__,
        "quick": quick,
        "device": {**ident, "nproc": nproc, "threads_per_rank": torch.get_num_threads() if dev == "cpu" else 0},
        "model": {"name": spec.name, "source": spec.source or model, "seq_len": spec.seq_len,
                  "dtype_bytes": dtype_bytes, "units": [ly.name for ly in spec.layers]},
        "compute": compute,
        "communication": comm,
        "memory": memory,
        "cost_params": params,
        "assumptions": assumptions,
    }
    overhead = _step_overhead(per_rank, spec, doc, nproc)
    compute["step_overhead"] = overhead
    params["step_overhead_per_unit_s"] = overhead["per_unit_s"]
    return doc
