"""``wrap(model, plan)``: the parallel model a plan describes, on this rank, ready to ``step``."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.plan.schema import Plan, StageLayer
from autopar.runtime.agreement import agreed_start
from autopar.runtime.checkpointing import apply_checkpointing
from autopar.runtime.chunks import ChunkedRunner, build_runner, rank_chunks
from autopar.runtime.env import ensure_process_group, runtime_device
from autopar.runtime.grad_sync import UnitGradSync
from autopar.runtime.groups import Groups, unit_rank_sets
from autopar.runtime.guards import check_same_batch, finite_step
from autopar.runtime.layout import Placement, placements
from autopar.runtime.materialize import materialize_unit
from autopar.runtime.p2p import Mailbox
from autopar.runtime.sharding import FlatShard, Zero2Reducer, apply_fsdp
from autopar.runtime.stage import LocalUnit, StageRunner, cross_entropy
from autopar.runtime.tensor_parallel import apply_tp
from autopar.units import UnitTPInfo

OptimizerFactory = Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
NONFINITE = ("raise", "skip")
log = logging.getLogger(__name__)


def _local(p: torch.Tensor) -> torch.Tensor:
    """A plain tensor sharing storage with this rank's part of ``p`` (in-place updates reach ``p``)."""
    return p.to_local().detach() if isinstance(p, DTensor) else p


@dataclass
class _UnitState:
    unit: LocalUnit
    place: Placement
    sync: UnitGradSync
    proxies: list[torch.Tensor]  # what the optimizer steps for this unit
    shard: FlatShard | None  # ZeRO-1/2
    zero2: Zero2Reducer | None  # ZeRO-2 whose sync group is its shard group: reduce-scatters in backward


class ParallelModel:
    """This rank's share of a model trained as a plan says. Build it with ``wrap``.

    ``step(inputs, targets)`` runs one optimizer step over the whole global batch; every rank passes
    the same full global-batch tensors (batch dimension first) and gets the global mean loss back.
    ``full_state_dict()`` returns every unsharded parameter on every rank (a collective).
    ``optimizer`` is the optimizer the factory built over this rank's tensors. ``skipped_steps``
    lists the steps (numbered from 1 by ``step`` call) skipped under ``on_nonfinite="skip"``.
    """

    def __init__(self, plan: Plan, device: torch.device, runner: StageRunner | ChunkedRunner, states: list[_UnitState],
                 optimizer: torch.optim.Optimizer, mailbox: Mailbox, shapes: dict, places: dict,
                 on_nonfinite: str) -> None:
        self.plan, self.device, self.runner, self.optimizer = plan, device, runner, optimizer
        self._states, self._mailbox, self._shapes, self._places = states, mailbox, shapes, places
        self.rank = dist.get_rank()
        self.pipeline, self.stage = runner.spec.pipeline, runner.spec.stage
        self.on_nonfinite, self.skipped_steps, self._calls = on_nonfinite, [], 0

    @property
    def local_units(self) -> dict[str, nn.Module]:
        """The units this rank runs (TP / FSDP-wrapped modules), by name."""
        return {s.unit.name: s.unit.module for s in self._states}

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One optimizer step over the global batch; returns the global mean loss (same on every rank).

        Raises AutoparError, the same on every rank, if the ranks passed different batches, or (with
        ``on_nonfinite="raise"``) if the loss or a gradient is NaN/inf; ``"skip"`` leaves the
        parameters and optimizer state untouched for that step instead and returns the loss.
        """
        self._calls += 1
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        check_same_batch(inputs, targets, self._calls)
        gbs = self.plan.global_batch_size
        if inputs.shape[0] != gbs or targets.shape[0] != gbs:
            raise AutoparError("step inputs", f"batch dimensions {inputs.shape[0]} / {targets.shape[0]} differ "
                               f"from the plan's global_batch_size {gbs}", "pass the whole global batch on every rank")
        loss_sum = self.runner.run(inputs, targets)
        self._mailbox.flush()
        for st in self._states:
            if st.zero2 is not None:  # already reduce-scattered during backward
                st.zero2.flush()
                continue
            synced = st.sync.sync()
            if st.shard is not None:
                st.shard.set_grad_from_full(synced)
            else:
                for proxy, g in zip(st.proxies, synced):
                    proxy.grad = g
            self._free_accumulated_grads(st)
        grads = [g for st in self._states for g in ([st.shard.master.grad] if st.shard is not None
                                                     else [p.grad for p in st.proxies]) if g is not None]
        loss, problem = finite_step(loss_sum, grads, self._calls)
        if problem is None:
            self.optimizer.step()
        for st in self._states:
            if st.shard is not None and problem is None:
                st.shard.all_gather_params()
            for p in st.unit.module.parameters():
                p.grad = None
        self.optimizer.zero_grad(set_to_none=True)
        if problem is not None:
            if self.on_nonfinite == "raise":
                raise AutoparError("step", problem, "check this step's batch and the learning rate, or pass "
                                   "wrap(..., on_nonfinite='skip') to skip such steps")
            self.skipped_steps.append(self._calls)
            if self.rank == 0:
                log.warning("autopar: %s: optimizer step skipped (on_nonfinite='skip')", problem)
        return loss

    @staticmethod
    def _free_accumulated_grads(st: _UnitState) -> None:
        """Drop the unit's accumulated gradients once the optimizer's copies are set.

        The optimizer reads the synced gradients from the proxies (or the ZeRO-1/2 shard); the
        module's own ``.grad`` (a DTensor wrapper under TP, the full gradient under ZeRO-1/2) would
        otherwise stay alive beside them through the optimizer step. A plain parameter that is its
        own proxy keeps its gradient (the proxies share storage with what they were given).
        """
        proxies = {id(t) for t in st.proxies}
        for p in st.unit.module.parameters():
            if id(p) not in proxies:
                p.grad = None

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model, unsharded, on the CPU of every rank (call on all ranks).

        Each unit is taken from its first placement (pipeline 0) and broadcast from that stage's
        first device.
        """
        local = {s.unit.name: s for s in self._states}
        out: dict[str, torch.Tensor] = {}
        # Gathering FSDP x TP parameters takes two all-gathers and torch logs a warning per parameter
        # about it; this runs once per export, so keep the log readable.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        for name, shapes in self._shapes.items():
            if not shapes:
                continue
            owner = self._places[name][0]
            flat = None
            if name in local and self.runner.spec.pipeline == owner.pipeline:
                fulls = [p.full_tensor() if isinstance(p, DTensor) else p.detach()
                         for p in local[name].unit.module.parameters()]
                flat = torch.cat([f.reshape(-1) for f in fulls]).to(self.device)
            numel = sum(torch.Size(s).numel() for _, s, _ in shapes)
            if self.rank != owner.devices[0]:
                flat = torch.empty(numel, dtype=shapes[0][2], device=self.device)
            dist.broadcast(flat, src=owner.devices[0])
            offset = 0
            for fqn, shape, _ in shapes:
                n = torch.Size(shape).numel()
                out[f"{name}.{fqn}"] = flat[offset:offset + n].view(shape).cpu().clone()
                offset += n
        return out


def wrap(model: nn.Module, plan: Plan | str | os.PathLike, optimizer: OptimizerFactory | None = None,
         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None, *, seed: int = 0,
         device: torch.device | None = None, loss_parallel: bool = True, timeout_s: float = 600.0,
         on_nonfinite: str = "raise") -> ParallelModel:
    """Place ``model`` on this rank as ``plan`` says; call on every rank with the same arguments.

    model:      an ``nn.Sequential`` or a model with ``embed`` / ``layers`` / ``head`` children
                (autopar.models). Real weights (same seed on every rank) are used as given; a model
                on the meta device is materialised per unit from ``seed`` (autopar.runtime.materialize:
                ``init_weights(model, seed)`` is the single-device equivalent). ``wrap`` takes the
                model over: units this rank does not hold are moved to the meta device.
    plan:       a Plan, or a path to a plan YAML file.
    optimizer:  a factory ``params -> torch.optim.Optimizer``, e.g.
                ``lambda params: torch.optim.AdamW(params, lr=3e-4)``; each rank calls it once over
                the plain tensors it updates (its TP / FSDP shards, or its ZeRO-1/2 slices), so
                element-wise optimizers behave exactly as on one device.
    loss_fn:    ``(output rows, target rows) -> mean loss over those rows``; default token-mean
                cross entropy. With the default and a TP head, the loss runs under
                ``loss_parallel`` on vocabulary-sharded logits (``loss_parallel=False`` gathers them).
    device:     default: this rank's CUDA device under nccl, else the CPU.
    timeout_s:  collective timeout (default 10 minutes) when ``wrap`` initialises the process group
                from torchrun variables; a group you initialised keeps its own timeout.
    on_nonfinite: ``"raise"`` (default): a NaN/inf loss or gradient makes ``step`` raise on every
                rank, naming the step; ``"skip"``: that step's optimizer update is skipped (logged
                on rank 0, recorded in ``skipped_steps``) and training goes on.

    Raises AutoparError, the same on every rank, if the plan does not fit the model or the world,
    or if the ranks' plans, model structures or these settings differ (checked in wrap's first
    collective: one line naming the first differing field and the ranks on each side).
    """
    if optimizer is None:
        raise AutoparError("optimizer", "no optimizer factory given",
                           "pass optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4)")
    if on_nonfinite not in NONFINITE:
        raise AutoparError("on_nonfinite", f"unknown value {on_nonfinite!r}", "use 'raise' or 'skip'")
    ensure_process_group(timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    settings = {"seed": seed, "loss_parallel": loss_parallel, "on_nonfinite": on_nonfinite}
    plan, named, infos = agreed_start(model, plan, world, settings)
    names = [n for n, _ in named]
    modules = dict(named)

    places = placements(plan)
    device = device or runtime_device()
    groups = Groups([s for n in names for s in unit_rank_sets(places[n])], device.type)
    pi, chunk_ids = rank_chunks(plan, rank)  # one stage, or an interleaved stage's chunks
    pipe = plan.pipelines[pi]
    mine = [ly for si in chunk_ids for ly in pipe.stages[si].layers]
    shapes = {n: [(fqn, tuple(p.shape), p.dtype) for fqn, p in m.named_parameters()] for n, m in named}
    last = mine[-1]
    logits_sharded = (loss_parallel and loss_fn is None and chunk_ids[-1] == len(pipe.stages) - 1
                      and last.strategy.tp > 1 and "logits" in infos[last.name].plan.values())
    states = [_build_unit(ly, modules[ly.name], infos[ly.name], places[ly.name], pi, rank, groups, seed, device,
                          logits_sharded and ly is last) for ly in mine]
    mine_names = {ly.name for ly in mine}
    for n, m in named:
        if n not in mine_names:
            m.to_empty(device="meta")  # this rank never runs it: free its memory

    mailbox = Mailbox(device)
    runner = build_runner(rank, plan, pi, chunk_ids, [s.unit for s in states], mailbox, loss_fn or cross_entropy,
                          logits_sharded)
    tensors = [t for s in states for t in s.proxies]
    # A rank whose units have no parameters still gets a real optimizer (torch refuses empty lists).
    opt = optimizer(tensors or [torch.zeros(0, device=device, requires_grad=True)])
    # Every rank takes part in one collective on the default group before any subset uses it for
    # batched point-to-point (NCCL requires it; it also means every rank finished wrap()).
    dist.barrier()
    return ParallelModel(plan, device, runner, states, opt, mailbox, shapes, places, on_nonfinite)


def _build_unit(ly: StageLayer, module: nn.Module, info: UnitTPInfo, places: list[Placement], pipeline: int,
                rank: int, groups: Groups, seed: int, device: torch.device, logits_sharded: bool) -> _UnitState:
    """Materialise one unit of this rank's stage and apply TP, checkpointing, ZeRO; set up its sync."""
    mine = next(p for p in places if p.pipeline == pipeline)
    lay, strat = mine.layout, ly.strategy
    module = materialize_unit(module, ly.name, seed, device)
    tp_mesh = fsdp_mesh = None
    if mine.fsdp and lay.tp > 1:  # FSDP x TP: one 2-D mesh, TP inner (torchtitan's layout)
        mesh2 = groups.mesh_fsdp_tp(lay)
        tp_mesh, fsdp_mesh = mesh2["tp"], mesh2["dp"]
    else:
        if lay.tp > 1:
            tp_mesh = groups.mesh_1d(lay.tp_group(rank))
        if mine.fsdp:
            fsdp_mesh = groups.mesh_1d(tuple(sorted(mine.devices)))
    if tp_mesh is not None:
        apply_tp(module, info.plan, tp_mesh, strat.sp, logits_sharded=logits_sharded)
    apply_checkpointing(module, strat.ckpt, info.selective)
    params = list(module.parameters())
    if fsdp_mesh is not None and params:
        apply_fsdp(module, fsdp_mesh)
        params = list(module.parameters())
    sync = UnitGradSync(module, places, mine, rank, groups)
    shard, proxies, zero2 = None, [_local(p) for p in params], None
    if mine.zero in (1, 2) and params:
        shard = FlatShard(proxies, groups.get(lay.dp_group(rank)))
        # ZeRO-2 reduce-scatters straight into the shard, micro-batch by micro-batch, when its sync
        # group is exactly its DP group. Otherwise (TP, or the unit also lives in other pipelines,
        # which run other micro-batch counts) the step-end sync all-reduces and the shard slices.
        if (mine.zero == 2 and sync.mode == "aligned" and lay.tp == 1
                and set(sync.rep_ranks) == set(lay.dp_group(rank))):
            zero2 = Zero2Reducer(shard, params)
        proxies = [shard.master]
    return _UnitState(LocalUnit(ly.name, module, lay, strat), mine, sync, proxies, shard, zero2)
