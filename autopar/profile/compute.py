"""Compute profile: forward and backward seconds of every layer unit, timed inside real runtime steps.

Every rank of the profiling job runs the same single-stage plan under ``autopar.wrap`` at once, so
each sees the machine as a training job of that many processes does (on a CPU they share cores,
caches and memory bandwidth; on GPUs each has its own), and each unit runs as training runs it: after
the previous units, with the runtime's checkpointing, TP and FSDP, the stage's last unit with the
default loss (token-mean cross entropy).

Also here: the dense matmul peak of one process (the device's FLOPS in the cluster), its copy
bandwidth (``hbm_gbps``: the cost model's memory-bound terms) and the optimizer step per parameter.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec
from autopar.profile.quiet import quietly
from autopar.units import selective_targets, units


@dataclass
class ComputeSample:
    """Median seconds of one unit call on ``mbs`` samples (flops: the spec's forward FLOPs of that call)."""

    unit: str
    kind: str
    mbs: int
    ckpt: str
    tp: int
    flops: float
    fwd_s: float
    bwd_s: float
    zero: int = 0  # 3: the unit ran under FSDP2 (ZeRO-3) over ``group`` ranks
    group: int = 1
    others_share: float | None = None  # CPU share other processes took while it was timed

    def to_dict(self) -> dict:
        return asdict(self)


def sync(device: torch.device) -> None:
    """Wait for queued kernels (CUDA runs asynchronously; timing must not stop early)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 1) -> float:
    """Median wall seconds of ``fn()`` over ``reps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def token_ids(model: nn.Module, batch: int, seq_len: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Random token ids sized for the model's first embedding (its vocabulary)."""
    emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if emb is None:
        raise AutoparError("model", f"{type(model).__name__} has no nn.Embedding to feed token ids to",
                           "profile a token model (embed / layers / head, like autopar.models)")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, emb.num_embeddings, (batch, seq_len), generator=g).to(device)


class _Clock:
    """Timestamps that mean the same on CPU (wall clock) and CUDA (events on the current stream)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


class UnitTimer:
    """Forward and backward seconds of every unit of a ParallelModel while ``pm.step`` runs (hooks).

    A unit's forward runs from its first forward pre-hook to its last forward hook (so TP's input and
    output redistribution and FSDP's gather and reshard count); its backward from the moment its
    output's gradient exists (a hook on that tensor) to the moment the previous unit's does (for the
    stage's first unit: the end of the backward action). The stage's last unit also gets the loss:
    its forward ends with the forward action, its backward starts with the backward action.
    """

    def __init__(self, pm, device: torch.device) -> None:
        self.names = list(pm.local_units)
        self.clock = _Clock(device)
        self.device = device
        self.marks: dict[str, object] = {}
        self.times: dict[str, list[tuple[float, float]]] = {n: [] for n in self.names}
        self.recording = False
        for name, m in pm.local_units.items():
            m.register_forward_pre_hook(lambda mod, args, n=name: self._mark(n, "f0"), prepend=True)
            m.register_forward_hook(lambda mod, args, out, n=name: self._after_forward(n, out))
        runner = pm.runner
        fwd, bwd = runner.forward, runner.backward
        last = self.names[-1]

        def forward(k, *a, **kw):
            out = fwd(k, *a, **kw)
            self._mark(last, "f1")
            return out

        def backward(k, *a, **kw):
            self._mark(last, "b0")
            out = bwd(k, *a, **kw)
            self._mark("", "end")
            self._collect()
            return out

        runner.forward, runner.backward = forward, backward

    def _mark(self, name: str, what: str) -> None:
        self.marks[f"{name}/{what}"] = self.clock.mark()

    def _after_forward(self, name: str, out) -> None:
        self._mark(name, "f1")
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g, n=name: self._mark(n, "b0"))

    def _collect(self) -> None:
        if not self.recording:
            return
        sync(self.device)
        m, names = self.marks, self.names
        for i, n in enumerate(names):
            b_end = m[f"{names[i - 1]}/b0"] if i > 0 else m["/end"]
            self.times[n].append((self.clock.seconds(m[f"{n}/f0"], m[f"{n}/f1"]),
                                  self.clock.seconds(m[f"{n}/b0"], b_end)))

    def medians(self) -> dict[str, tuple[float, float]]:
        return {n: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
                for n, ts in self.times.items() if ts}


def _one_config(build: Callable[[], nn.Module], spec: ModelSpec, plan, batch: tuple, device: torch.device,
                reps: int) -> dict[str, tuple[float, float]]:
    """Wrap the model under ``plan`` on all ranks, run 1 + ``reps`` steps, return the per-unit medians."""
    from autopar.runtime.wrap import wrap

    with torch.device("meta"):
        model = build()
    pm = wrap(model, plan, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-4), device=device)
    timer = UnitTimer(pm, device)
    inputs, targets = (t.to(device) for t in batch)
    pm.step(inputs, targets)  # warm-up: lazy inits, optimizer state
    timer.recording = True
    steps = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        pm.step(inputs, targets)
        sync(device)
        steps.append(time.perf_counter() - t0)
    return timer.medians(), statistics.median(steps)


def compute_configs(spec: ModelSpec, world: int, mbs_list: list[int], ckpts: list[str], tps: list[int]) -> list[dict]:
    """What the compute profile times: every rows-per-rank size under each checkpointing mode (tp 1,
    DDP over all ranks), each TP degree and ZeRO-3 over all ranks; one single-stage plan each."""
    out = []
    for b in mbs_list:
        out += [{"rows": b, "ckpt": c, "tp": 1, "zero": 0} for c in ckpts]
        out += [{"rows": b, "ckpt": "none", "tp": t, "zero": 0} for t in tps]
        if world > 1:
            out.append({"rows": b, "ckpt": "none", "tp": 1, "zero": 3})
    return out


def config_plan(spec: ModelSpec, cfg: dict, world: int):
    """The single-stage plan of a compute config: all ``world`` ranks, one micro-batch, ``rows`` per rank."""
    from autopar.plan.compact import make_plan
    from autopar.plan.schema import Strategy

    tp = cfg["tp"]
    layers = [(ly.name, Strategy(tp=tp if ly.tp_ok(tp) and ly.supports_tp else 1, zero=cfg["zero"], ckpt=cfg["ckpt"]))
              for ly in spec.layers]
    return make_plan([(cfg["rows"] * (world // tp), 1, [(list(range(world)), layers)])])


def measure_units(build: Callable[[], nn.Module], spec: ModelSpec, configs: list[dict], world: int,
                  device: torch.device, reps: int, progress=None, tries: int = 3,
                  steps: list[dict] | None = None) -> list[ComputeSample]:
    """Time every unit inside real runtime steps (``autopar.wrap``) for each config; collective.

    Each config is a single-stage plan over all ``world`` ranks with one micro-batch, ``rows`` rows per
    rank (a TP group shares its rows). Checkpointing applies to every unit it can (selective: the units
    with attention cores; the others are reported only under "none"). All ranks time at once, and
    again while other processes interfere (``quietly``). ``steps``, if given, gets each config's whole
    step time (this rank's median) appended.
    """
    with torch.device("meta"):
        model = build()
    out: list[ComputeSample] = []
    for cfg in configs:
        tp, zero, ckpt, b = cfg["tp"], cfg["zero"], cfg["ckpt"], cfg["rows"]
        plan = config_plan(spec, cfg, world)
        strat = {ly.name: ly.strategy for ly in plan.pipelines[0].stages[0].layers}
        batch = (token_ids(model, plan.global_batch_size, spec.seq_len, torch.device("cpu"), seed=b),
                 token_ids(model, plan.global_batch_size, spec.seq_len, torch.device("cpu"), seed=1000 + b))
        (times, step_s), others = quietly(partial(_one_config, build, spec, plan, batch, device, reps), tries=tries)
        if steps is not None:
            steps.append({**cfg, "step_s": step_s, "units_s": sum(f + b for f, b in times.values()),
                          "others_share": others})
        mods = dict(units(model))
        for ly in spec.layers:
            if ly.name not in times:
                continue
            s = strat[ly.name]
            if (tp > 1 and s.tp == 1) or (ckpt == "selective" and not selective_targets(mods[ly.name])):
                continue  # not what this config measures for that unit
            if zero == 3 and ly.params == 0:
                continue
            f, bw = times[ly.name]
            out.append(ComputeSample(ly.name, ly.kind, b, ckpt, s.tp, ly.flops * b, f, bw, zero=zero,
                                     group=world if zero == 3 else s.tp, others_share=others))
        if progress is not None:
            progress.update(1)
    return out


def measure_peak_flops(device: torch.device, dtype: torch.dtype, quick: bool) -> float:
    """Dense matmul FLOP/s of one process, the best over a few square sizes: the 'peak' the efficiency
    curve is relative to (on a CPU the best size is the one that fits its caches)."""
    sizes = ([256, 512, 1024] if quick else [256, 512, 1024, 2048]) if device.type == "cpu" else [4096, 8192]
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        reps = max(3, min(50, int(2e9 / n**3)))  # about the same time per size
        best = max(best, 2.0 * n**3 / median_time(lambda a=a, b=b: a @ b, device, reps=reps))
    return best


def measure_copy_bandwidth(device: torch.device, quick: bool) -> float:
    """Bytes/s of a large tensor copy (read + write counted): the memory-bound speed of the device."""
    n = (16 if quick else 64) * 2**20 if device.type == "cpu" else 2**30
    src = torch.ones(n // 4, device=device)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), device, reps=3 if quick else 5)
    return 2.0 * n / t


def measure_optimizer(model: nn.Module, device: torch.device, reps: int,
                      factory: Callable | None = None) -> dict:
    """Seconds per parameter of one optimizer step (default AdamW) over the model's tensors."""
    params = [torch.zeros_like(p, device=device, requires_grad=True) for p in model.parameters()]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = (factory or (lambda ps: torch.optim.AdamW(ps, lr=1e-4)))(params)
    t = median_time(opt.step, device, reps=reps, warmup=2)
    numel = sum(p.numel() for p in params)
    return {"name": type(opt).__name__, "seconds": t, "params": numel, "tensors": len(params)}
