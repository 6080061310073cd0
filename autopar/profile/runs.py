"""Run a plan with the real runtime (``autopar.wrap``) on local processes and measure what it does.

Used by the profiler's memory calibration and by the cost-model fidelity benchmark, so both measure
the same way:

* step time: every rank times ``pm.step`` between barriers; a step's time is the slowest rank's,
  and the result is the median over the steady steps (after ``warmup`` steps: lazy inits and the
  optimizer state's creation);
* model-state bytes per rank, at the optimizer step: the local tensors of every parameter the rank
  holds (TP / FSDP shards, and the ZeRO-1/2 ``master`` slices the optimizer steps), their gradients,
  and the optimizer's per-element state (Adam's ``exp_avg`` / ``exp_avg_sq``); per-tensor scalars
  (Adam's ``step`` counters) are reported apart, since no memory model counts them per parameter;
* saved activations per rank: every tensor autograd saves during a forward action of the stage
  (``saved_tensors_hooks``), each storage once, parameters and the step's input batch excluded, summed
  per micro-batch and per unit; the peak is the most bytes live at once under the stage's real
  action order (a micro-batch's tensors live from its forward to its backward).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.tensor import DTensor

from autopar.plan.schema import Plan
from autopar.runtime.local_ranks import run_distributed

OptimizerFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]


def adamw(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer profiles and benchmarks train with: AdamW, fp32 states (8 bytes per parameter)."""
    return torch.optim.AdamW(params, lr=1e-4)


@dataclass
class RankMeasure:
    """What one rank measured (bytes and seconds)."""

    rank: int
    step_s: list[float] = field(default_factory=list)
    param_bytes: int = 0
    grad_bytes: int = 0
    opt_bytes: int = 0  # per-element optimizer state
    opt_scalar_bytes: int = 0  # per-tensor optimizer scalars (Adam's step counters)
    dp_sharded_bytes: int = 0  # of param + grad + opt bytes: tensors sharded over the DP group (tp = 1 runs)
    saved_peak_bytes: int = 0
    saved_per_microbatch: list[int] = field(default_factory=list)
    saved_per_unit: dict[str, int] = field(default_factory=dict)  # micro-batch 0, per unit
    unit_params: dict[str, int] = field(default_factory=dict)  # local parameter elements per unit

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.opt_bytes


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _ptr(t: torch.Tensor) -> int:
    return _local(t).untyped_storage().data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def _dp_sharded(t: torch.Tensor, module_params: set[int]) -> bool:
    """Whether ``t`` is a slice over the DP group, assuming tp = 1: an FSDP shard (a DTensor sharded on
    its one mesh dimension) or a tensor only the optimizer knows (a ZeRO-1/2 master slice)."""
    if isinstance(t, DTensor):
        return any(pl.is_shard() for pl in t.placements)
    return id(t) not in module_params


class StateMeter:
    """Model-state bytes of a ParallelModel at its optimizer step (hooks on the optimizer)."""

    def __init__(self, pm) -> None:
        self.pm = pm
        self.params = self.grads = self.opt = self.scalars = 0
        self.sharded = 0
        pm.optimizer.register_step_pre_hook(self._before)
        pm.optimizer.register_step_post_hook(self._after)

    def _tensors(self) -> list[torch.Tensor]:
        """Every parameter tensor the rank holds: module parameters and optimizer-only tensors (masters)."""
        seen, out = set(), []
        mods = list(self.pm.local_units.values())
        stepped = [p for g in self.pm.optimizer.param_groups for p in g["params"]]
        for t in [p for m in mods for p in m.parameters()] + stepped:
            loc = _local(t)
            if loc.numel() == 0 or id(loc) in seen:
                continue
            key = (loc.untyped_storage().data_ptr(), loc.storage_offset(), loc.numel())
            if key in seen:
                continue
            seen.update((id(loc), key))
            out.append(t)
        return out

    def _before(self, opt, args, kwargs) -> None:
        ts = self._tensors()
        mine = {id(p) for m in self.pm.local_units.values() for p in m.parameters()}
        self.params = sum(_nbytes(t) for t in ts)
        self.sharded = sum(_nbytes(t) for t in ts if _dp_sharded(t, mine))
        # Every distinct gradient held: a module parameter's and its optimizer proxy's may differ (a
        # ZeRO master's slice, a TP shard cut from a replicated gradient); each storage region once.
        holders = [p for m in self.pm.local_units.values() for p in m.parameters()]
        holders += [p for g in self.pm.optimizer.param_groups for p in g["params"]]
        seen, total = set(), 0
        for t in holders:
            if t.grad is None:
                continue
            g = _local(t.grad)
            key = (g.untyped_storage().data_ptr(), g.storage_offset(), g.numel())
            if key not in seen and g.numel():
                seen.add(key)
                total += g.numel() * g.element_size()
                self.sharded += g.numel() * g.element_size() if _dp_sharded(t, mine) else 0
        self.grads = total

    def _after(self, opt, args, kwargs) -> None:
        self.opt = self.scalars = 0
        mine = {id(p) for m in self.pm.local_units.values() for p in m.parameters()}
        for p, st in opt.state.items():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    if _local(v).numel() == _local(p).numel() and v.dim() > 0:
                        self.opt += _nbytes(v)
                        self.sharded += _nbytes(v) if _dp_sharded(p, mine) else 0
                    else:
                        self.scalars += _nbytes(v)


class SavedMeter:
    """Saved-activation bytes per micro-batch and per unit during one step of a ParallelModel."""

    def __init__(self, pm, exclude: list[torch.Tensor]) -> None:
        self.pm = pm
        self.runner = pm.runner
        self.exclude = {_ptr(t) for t in exclude}
        self.current: tuple[int, int] | None = None  # (chunk, micro-batch) whose forward runs now
        self.unit: str | None = None
        self.per_mb: dict[tuple[int, int], dict[int, int]] = {}  # (chunk, micro-batch) -> storage -> bytes
        self.per_unit: dict[str, int] = {}
        self.order: list[tuple[str, tuple[int, int]]] = []
        # One stage's runner, or an interleaved stage's chunks (each its own micro-batches' activations).
        for c, runner in enumerate(getattr(self.runner, "chunks", [self.runner])):
            self._instrument(c, runner)
        self.handles = []
        for name, m in pm.local_units.items():
            self.handles.append(m.register_forward_pre_hook(lambda mod, args, n=name: self._enter(n)))

    def _instrument(self, c: int, runner) -> None:
        fwd, bwd = runner.forward, runner.backward

        def forward(k, *a, **kw):
            self.current = (c, k)
            self.order.append(("F", (c, k)))
            try:
                return fwd(k, *a, **kw)
            finally:
                self.current = None

        def backward(k, *a, **kw):
            self.order.append(("B", (c, k)))
            return bwd(k, *a, **kw)

        runner.forward, runner.backward = forward, backward

    def _enter(self, name: str) -> None:
        self.unit = name

    def _param_ptrs(self) -> set[int]:
        return {_ptr(p) for m in self.pm.local_units.values() for p in m.parameters()}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.current is None:  # recomputation in backward, optimizer, sync: not a saved activation
            return t
        loc = _local(t)
        ptr = loc.untyped_storage().data_ptr()
        if ptr in self.exclude or isinstance(t, nn.Parameter) or ptr in self._param_ptrs():
            return t
        mb = self.per_mb.setdefault(self.current, {})
        if ptr not in mb:
            mb[ptr] = loc.untyped_storage().nbytes()
            if self.current[1] == 0 and self.unit is not None:
                self.per_unit[self.unit] = self.per_unit.get(self.unit, 0) + mb[ptr]
        return t

    def peak(self) -> int:
        """Most bytes live at once: micro-batch k's tensors live from its forward to its backward."""
        live, worst = 0, 0
        for kind, k in self.order:
            b = sum(self.per_mb.get(k, {}).values())
            live += b if kind == "F" else -b
            worst = max(worst, live)
        return worst

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def measure_rank(pm, inputs: torch.Tensor, targets: torch.Tensor, steps: int, warmup: int,
                 memory: bool = True) -> RankMeasure:
    """Time ``steps`` steady steps after ``warmup``; then one instrumented step for the memory figures."""
    out = RankMeasure(dist.get_rank())
    for _ in range(warmup):
        pm.step(inputs, targets)
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        pm.step(inputs, targets)
        if pm.device.type == "cuda":
            torch.cuda.synchronize(pm.device)
        out.step_s.append(time.perf_counter() - t0)
    if memory:
        states = StateMeter(pm)
        saved = SavedMeter(pm, [inputs, targets])
        with saved_tensors_hooks(saved.pack, lambda t: t):
            pm.step(inputs, targets)
        saved.close()
        out.param_bytes, out.grad_bytes = states.params, states.grads
        out.opt_bytes, out.opt_scalar_bytes = states.opt, states.scalars
        out.dp_sharded_bytes = states.sharded
        out.saved_peak_bytes = saved.peak()
        per_k: dict[int, int] = {}
        for (_, k), tensors in saved.per_mb.items():
            per_k[k] = per_k.get(k, 0) + sum(tensors.values())
        out.saved_per_microbatch = [per_k[k] for k in sorted(per_k)]
        out.saved_per_unit = dict(saved.per_unit)
    out.unit_params = {n: sum(_local(p).numel() for p in m.parameters()) for n, m in pm.local_units.items()}
    return out


def fresh_store() -> str:
    """A path for a ``file://`` rendezvous that nothing has used yet."""
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="autopar-nccl-"), "store")


def rank_device(rank: int, world: int, device: str, store: str) -> torch.device:
    """This rank's device. On CUDA (one GPU per rank) the launcher's gloo group is replaced by an NCCL
    one, so the runtime's groups and collectives run where training would."""
    if device != "cuda":
        return torch.device("cpu")
    from datetime import timedelta

    torch.cuda.set_device(rank)
    dist.destroy_process_group()
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120), device_id=torch.device("cuda", rank))
    return torch.device("cuda", rank)


def _rank_job(rank: int, world: int, build: Callable[[], nn.Module], plan: Plan, batch: tuple, steps: int,
              warmup: int, memory: bool, optimizer: OptimizerFactory, seed: int, device: str,
              store: str) -> RankMeasure:
    from autopar.runtime.wrap import wrap

    with torch.device("meta"):
        model = build()
    dev = rank_device(rank, world, device, store)
    pm = wrap(model, plan, optimizer=optimizer, seed=seed, device=dev)
    inputs, targets = batch
    return measure_rank(pm, inputs.to(pm.device), targets.to(pm.device), steps, warmup, memory)


def step_time(per_rank: list[RankMeasure]) -> tuple[float, list[float]]:
    """(median over steps of the slowest rank's time, the per-step times)."""
    per_step = [max(r.step_s[i] for r in per_rank) for i in range(len(per_rank[0].step_s))]
    return (statistics.median(per_step) if per_step else float("nan")), per_step


def run_plan(build: Callable[[], nn.Module], plan: Plan, batch: tuple[torch.Tensor, torch.Tensor], steps: int = 5,
             warmup: int = 2, memory: bool = True, optimizer: OptimizerFactory = adamw, seed: int = 0,
             device: str = "cpu", timeout_s: float = 300.0) -> list[RankMeasure]:
    """Wrap ``build()`` (built on the meta device, materialised per unit by ``wrap``) under ``plan`` on
    ``plan.world_size`` fork-started local ranks and measure it; returns one RankMeasure per rank.

    ``device``: "cpu" (gloo), or "cuda" (rank r on GPU r, NCCL)."""
    return run_distributed(_rank_job, plan.world_size, build, plan, batch, steps, warmup, memory, optimizer, seed,
                           device, fresh_store(), timeout_s=timeout_s)
