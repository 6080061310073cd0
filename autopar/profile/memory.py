"""Memory profile: what the runtime really holds per rank, measured with ``autopar.wrap`` on real plans.

Two calibrations of the memory model come out of it:

* model states by ZeRO stage. The cost model charges ``params x (a_z + b_z / d)`` bytes on a rank of
  a DP group of d for ZeRO stage z (Rajbhandari et al.'s 16 / 4+12/d / 2+14/d / 16/d are one such
  table). Each stage runs sharded over all ranks (d = world); at its optimizer step the rank's
  parameters, gradients and optimizer state are split into what it holds whole (a_z) and what it
  holds as a 1/d slice (b_z: FSDP shards, ZeRO-1/2 master slices and their gradients and states).
  The runtime's ZeRO-1/2 step an fp32 ``master`` slice with its own gradient and keep the full
  gradients until the step, so in fp32 its table is 16 / 8+16/d / 8+16/d / 16/d, not the
  mixed-precision textbook one.
* saved activations per unit and per sample, as ``LayerSpec`` splits them. From four runs of every
  unit: M_none, M_selective, M_full at tp = 1 and M_none at tp = 2:
      act_attn = M_none - M_selective            (what selective recomputation drops)
      act_tp + act_attn = 2 (M_none - M_none@tp2) (what TP halves)
      act_seq = M_none - act_tp - act_attn        (what TP leaves whole)
  and a fifth run (tp = 2 with sequence parallelism) checks the model's prediction (reported next
  to it). Full checkpointing keeps the unit's input; for the last unit that is its
  ``boundary_bytes`` plus what the loss saves, so its boundary becomes M_full (the last unit's
  boundary is never sent to another stage). The unit's TP-sharded parameter count comes from its
  local parameters at tp = 2 (the runtime shards column-parallel biases too).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from autopar.modelspec.spec import ModelSpec
from autopar.plan.compact import make_plan
from autopar.plan.schema import Strategy
from autopar.profile.runs import RankMeasure, run_plan


def _batch(build: Callable[[], nn.Module], spec: ModelSpec, gbs: int) -> tuple[torch.Tensor, torch.Tensor]:
    from autopar.profile.compute import token_ids

    with torch.device("meta"):
        model = build()
    return token_ids(model, gbs, spec.seq_len, torch.device("cpu"), 1), \
        token_ids(model, gbs, spec.seq_len, torch.device("cpu"), 2)


def _tp_of(spec: ModelSpec, tp: int) -> dict[str, int]:
    return {ly.name: tp if ly.tp_ok(tp) else 1 for ly in spec.layers}


def memory_runs(spec: ModelSpec, world: int) -> list[dict]:
    """The calibration runs: label, ZeRO stage, DP degree, checkpointing, TP degree, sequence parallel."""
    runs = [{"label": f"zero{z}-d{world}", "zero": z, "d": world, "ckpt": c, "tp": 1, "sp": False,
             "pipelines": False} for z, c in ((0, "none"), (1, "selective"), (2, "full"), (3, "none"))]
    if world > 1:
        if any(ly.tp_ok(2) and ly.supports_tp for ly in spec.layers) and world % 2 == 0:
            runs += [{"label": "tp2", "zero": 0, "d": world // 2, "ckpt": "none", "tp": 2, "sp": False,
                      "pipelines": False},
                     {"label": "tp2-sp", "zero": 0, "d": world // 2, "ckpt": "none", "tp": 2, "sp": True,
                      "pipelines": False}]
    return runs


def _plan(spec: ModelSpec, run: dict, world: int, mbs_per_rank: int):
    tps = _tp_of(spec, run["tp"])
    layers = [(ly.name, Strategy(tp=tps[ly.name], zero=run["zero"], ckpt=run["ckpt"],
                                 sp=run["sp"] and tps[ly.name] > 1)) for ly in spec.layers]
    if run["pipelines"]:  # one single-device pipeline per rank: nothing sharded
        return make_plan([(mbs_per_rank, 1, [([r], layers)]) for r in range(world)])
    return make_plan([(mbs_per_rank * world, 1, [(list(range(world)), layers)])])


def measure_memory(build: Callable[[], nn.Module], spec: ModelSpec, world: int, device: str = "cpu",
                   mbs_per_rank: int = 2, progress=None) -> dict:
    """Run every calibration run; return the raw per-run measurements of rank 0 (all ranks alike here)."""
    out = {}
    for run in memory_runs(spec, world):
        plan = _plan(spec, run, world, mbs_per_rank)
        batch = _batch(build, spec, plan.global_batch_size)
        ranks: list[RankMeasure] = run_plan(build, plan, batch, steps=0, warmup=1, memory=True, device=device)
        r = ranks[0]
        out[run["label"]] = {**run, "param_bytes": r.param_bytes, "grad_bytes": r.grad_bytes, "opt_bytes": r.opt_bytes,
                             "opt_scalar_bytes": r.opt_scalar_bytes, "saved_per_unit": r.saved_per_unit,
                             "unit_params": r.unit_params, "mbs_per_rank": mbs_per_rank,
                             "dp_sharded_bytes": r.dp_sharded_bytes}
        if progress is not None:
            progress.update(1)
    return out


def state_table(runs: dict, num_params: int, world: int) -> dict:
    """Per ZeRO stage: bytes per parameter ``a + b / d`` on a DP group of d > 1 (d = 1 holds a + b of
    stage 0: nothing to shard), split by what the rank holds whole (a) and as a 1/d slice (b)."""
    table = {}
    for z in range(4):
        r = next(r for r in runs.values() if r["zero"] == z and r["tp"] == 1 and not r["pipelines"])
        total = r["param_bytes"] + r["grad_bytes"] + r["opt_bytes"]
        d = r["d"]
        sharded = r["dp_sharded_bytes"] if d > 1 else 0
        table[f"zero{z}"] = {"a": (total - sharded) / num_params, "b": sharded * d / num_params,
                             "measured_bytes_per_param": total / num_params, "d": d}
    return table


def _per_sample(run: dict, unit: str, spec: ModelSpec, world: int) -> float:
    """Saved bytes per sample of one unit in one run (its rows per rank: micro-batch / DP degree)."""
    tp = _tp_of(spec, run["tp"])[unit]
    samples = run["mbs_per_rank"] if run["pipelines"] else run["mbs_per_rank"] * tp
    return run["saved_per_unit"].get(unit, 0) / samples


def unit_calibration(runs: dict, spec: ModelSpec, world: int) -> dict:
    """Per unit: measured TP-sharded parameters and saved bytes per sample split as LayerSpec does."""
    base = next(r for r in runs.values() if r["zero"] == 0 and r["d"] == world and r["tp"] == 1)
    sel = next(r for r in runs.values() if r["ckpt"] == "selective")
    full = next(r for r in runs.values() if r["ckpt"] == "full")
    tp2 = runs.get("tp2")
    tp2sp = runs.get("tp2-sp")
    last = spec.layers[-1].name
    out = {}
    for ly in spec.layers:
        n = ly.name
        m_none = _per_sample(base, n, spec, world)
        m_sel = _per_sample(sel, n, spec, world)
        m_full = _per_sample(full, n, spec, world)
        attn = max(0.0, m_none - m_sel)
        row = {"measured": {"none": m_none, "selective": m_sel, "full": m_full}, "params": ly.params}
        if tp2 is not None and ly.tp_ok(2) and ly.supports_tp:
            m_tp2 = _per_sample(tp2, n, spec, world)
            row["measured"]["none_tp2"] = m_tp2
            sharded = min(m_none, max(attn, 2.0 * (m_none - m_tp2)))
            tp_b = max(0.0, sharded - attn)
            seq_b = max(0.0, m_none - sharded)
            local = tp2["unit_params"].get(n)
            # local = (tp_params + tied copy) / 2 + the replicated rest: the runtime's head holds the copy, sharded
            row["tp_params"] = int(2 * (ly.params - local) + ly.tied_params) if local is not None else ly.tp_params
            if tp2sp is not None:
                row["measured"]["none_tp2_sp"] = _per_sample(tp2sp, n, spec, world)
                row["predicted_tp2_sp"] = (tp_b + attn) / 2 + seq_b / 2
        else:
            seq_b = min(ly.act_seq_bytes, m_sel)
            tp_b = max(0.0, m_sel - seq_b)
            row["tp_params"] = ly.tp_params
        # the last unit's full-checkpoint run keeps its input and the loss's logits, which LayerSpec.saved_bytes
        # adds back from loss_bytes
        row.update(act_tp_bytes=tp_b, act_seq_bytes=seq_b, act_attn_bytes=attn,
                   boundary_bytes=max(0.0, m_full - ly.loss_bytes) if n == last else ly.boundary_bytes)
        out[n] = row
    return out
