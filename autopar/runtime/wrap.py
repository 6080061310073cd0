"""``wrap(model, plan)``: the parallel model a plan describes, on this rank, ready to ``step``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.models.tp_plans import entries, splits_sequence
from autopar.plan.schema import Plan, StageLayer
from autopar.runtime.agreement import agreed_start
from autopar.runtime.async_tp import enable_symmetric_memory, prepare_async_tp
from autopar.runtime.boundaries import BoundaryCheck
from autopar.runtime.checkpointing import apply_checkpointing
from autopar.runtime.chunks import build_runner, rank_chunks
from autopar.runtime.context_parallel import CPGroup, apply_cp, check_cp_settings
from autopar.runtime.env import ensure_process_group, runtime_device
from autopar.runtime.expert_parallel import (
    ExpertGradSync,
    apply_expert_parallel,
    check_ep_settings,
    ep_rank_sets,
    fsdp_ignored,
    zero_group,
)
from autopar.runtime.grad_sync import UnitGradSync
from autopar.runtime.groups import Groups, unit_rank_sets
from autopar.runtime.layout import Layout, Placement, placements
from autopar.runtime.loss import TokenCrossEntropy, step_loss
from autopar.runtime.materialize import InitFn, model_init_fn
from autopar.runtime.meta_build import materialized, tie_sources
from autopar.runtime.p2p import Mailbox
from autopar.runtime.parallel_model import ParallelModel, _UnitState
from autopar.runtime.precision_policy import apply_cast, check_policy, fsdp_policy
from autopar.runtime.sharding import FlatShard, apply_fsdp, backward_reducer
from autopar.runtime.stage import LocalUnit, cross_entropy
from autopar.runtime.sync_batchnorm import apply_sync_batchnorm, has_batchnorm
from autopar.runtime.tensor_parallel import apply_tp, tp_partial_params
from autopar.runtime.ties import TiedGrads, tie_rank_sets
from autopar.runtime.unit_rng import RNGClock, UnitRNG
from autopar.units import UnitTPInfo

OptimizerFactory = Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
NONFINITE = ("raise", "skip")


def _local(p: torch.Tensor) -> torch.Tensor:
    """A plain tensor sharing storage with this rank's part of ``p`` (in-place updates reach ``p``)."""
    return p.to_local().detach() if isinstance(p, DTensor) else p


def wrap(model: nn.Module, plan: Plan | str | os.PathLike, optimizer: OptimizerFactory | None = None,
         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None, *, seed: int = 0,
         device: torch.device | None = None, loss_parallel: bool = True, timeout_s: float = 600.0,
         on_nonfinite: str = "raise", max_grad_norm: float | None = None, log_every: int = 0,
         mixed_precision: MixedPrecisionPolicy | None = None, compile: bool | dict = False,  # noqa: A002
         init_fn: InitFn | None = None) -> ParallelModel:
    """Place ``model`` on this rank as ``plan`` says; call on every rank with the same arguments.

    model:      an ``nn.Sequential`` (nested ones expanded: units ``0.0``, ``0.1``, ...), a model with
                ``embed`` / ``layers`` / ``head`` children (autopar.models), or a transformers causal
                LM (run through ``from_transformers``), or any module whose forward chains its
                children (autopar.units.chain_units). Tensors shared by two units (tied embeddings,
                a module used twice) stay tied (autopar.runtime.ties); BatchNorm takes its statistics
                over its unit's data-parallel group (autopar.runtime.sync_batchnorm) and is refused
                unless one micro-batch is the whole batch. Real weights (same seed on every rank) are
                used as given; a model on the meta device is materialised per unit from ``seed``, one
                unit at a time, only the units this rank holds (autopar.runtime.materialize:
                ``init_weights(model, seed)`` is the single-device equivalent). ``wrap`` takes the
                model over: units this rank does not hold are moved to the meta device. ``seed`` also
                seeds the streams units draw dropout masks from (autopar.runtime.unit_rng).
    plan:       a Plan, or a path to a plan YAML file.
    optimizer:  a factory ``params -> torch.optim.Optimizer``, e.g.
                ``lambda params: torch.optim.AdamW(params, lr=3e-4)``; each rank calls it once over
                the plain tensors it updates (its TP / FSDP shards, or its ZeRO-1/2 slices), so
                element-wise optimizers behave exactly as on one device.
    loss_fn:    default: token-mean cross entropy over the global batch's valid tokens (targets of
                -100 ignored across ranks and micro-batches, exactly as one ``F.cross_entropy`` over
                the whole batch); an ``nn.CrossEntropyLoss`` (mean, no class weights) is split the same
                way. Any other ``(output rows, target rows) -> mean over those rows`` is weighted by
                its rows' share of the global batch: exact when every row weighs the same, not for a
                mean over a data-dependent count (autopar.runtime.loss). With the default and a TP
                head, the loss runs under ``loss_parallel`` on vocabulary-sharded logits
                (``loss_parallel=False`` gathers them). A plan with context parallel (cp > 1)
                takes the token cross entropy only (autopar.runtime.context_parallel).
    device:     default: this rank's CUDA device under nccl, else the CPU.
    timeout_s:  collective timeout (default 10 minutes) when ``wrap`` initialises the process group
                from torchrun variables; a group you initialised keeps its own timeout.
    on_nonfinite: ``"raise"`` (default): a NaN/inf loss or gradient makes ``step`` raise on every
                rank, naming the step; ``"skip"``: that step's optimizer update is skipped (logged
                on rank 0, recorded in ``skipped_steps``) and training goes on.
    max_grad_norm: clip the gradient to this global L2 norm before each optimizer step (None: no
                clipping), computed over every TP / PP / ZeRO / FSDP shard exactly once: equal to
                ``torch.nn.utils.clip_grad_norm_`` on one device. Clipping inside the optimizer
                would see only this rank's shard and be wrong. ``pm.last_grad_norm`` holds the norm.
    log_every:  log one line every this many optimizer steps on rank 0 (step, loss, grad norm,
                memory, tokens/s, TFLOP/s, MFU; autopar.runtime.step_log); 0 (default): off.
    mixed_precision: a ``torch.distributed.fsdp.MixedPrecisionPolicy`` applied to every unit, whatever
                its strategy (autopar.runtime.precision_policy): compute in ``param_dtype`` on fp32
                master weights, gradients accumulated and reduced in fp32, the model's output in
                ``output_dtype``. None (default): the model's own dtype throughout.
    compile:    ``torch.compile`` each unit's forward on this rank (inside TP / FSDP hooks, around
                activation checkpointing); True for torch's defaults, or a dict of torch.compile
                arguments, e.g. ``{"backend": "aot_eager"}``. Refused for TP units with activation
                checkpointing (dynamo cannot trace that combination). Units with ``async_tp`` need it
                (inductor) on CUDA; on CPU they run as plain TP (autopar.runtime.async_tp).

    init_fn:    for a meta-device model: ``init_fn(module)`` is called on every module of a unit,
                children before parents, under the unit's seed (default: a transformers model's
                ``_init_weights``, else ``reset_parameters()`` of each module owning tensors);
                ``init_weights(model, seed, init_fn)`` is the single-device reference. A tensor it
                leaves unset is refused on every rank, naming it.

    Raises AutoparError, the same on every rank, if the plan does not fit the model or the world,
    or if the ranks' plans, model structures or these settings differ (checked in wrap's first
    collective: one line naming the first differing field and the ranks on each side).
    """
    if optimizer is None:
        raise AutoparError("optimizer", "no optimizer factory given",
                           "pass optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4)")
    if on_nonfinite not in NONFINITE:
        raise AutoparError("on_nonfinite", f"unknown value {on_nonfinite!r}", "use 'raise' or 'skip'")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise AutoparError("max_grad_norm", f"must be positive, got {max_grad_norm}", "pass a norm > 0 or None")
    if not isinstance(log_every, int) or log_every < 0:
        raise AutoparError("log_every", f"must be a whole number >= 0, got {log_every!r}", "pass 0 (off) or N")
    ensure_process_group(timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    compile_kwargs = _compile_kwargs(compile)
    settings = {"seed": seed, "loss_parallel": loss_parallel, "on_nonfinite": on_nonfinite,
                "max_grad_norm": max_grad_norm, "mixed_precision": repr(mixed_precision),
                "compile": repr(compile_kwargs), "meta_device": any(t.is_meta for t in model.parameters())}
    device = device or runtime_device()
    plan, named, infos, ties, hf_source = agreed_start(model, plan, world, settings, device)
    check_cp_settings(plan, isinstance(step_loss(loss_fn), TokenCrossEntropy), compile_kwargs is not None)
    check_policy(mixed_precision, model, plan.precision)
    if compile_kwargs is not None:
        _check_compilable(plan)
    check_ep_settings(plan, mixed_precision, compile_kwargs)
    names = [n for n, _ in named]
    modules = dict(named)

    places = placements(plan)
    micro_tp = prepare_async_tp(plan, device, compile_kwargs, rank)  # plain TP on CPU (logged); CUDA: compile
    groups = Groups([s for n in names for s in unit_rank_sets(places[n]) + ep_rank_sets(places[n])]
                    + tie_rank_sets(ties, places), device.type)
    pi, chunk_ids = rank_chunks(plan, rank)  # one stage, or an interleaved stage's chunks
    pipe = plan.pipelines[pi]
    mine = [ly for si in chunk_ids for ly in pipe.stages[si].layers]
    shapes = {n: [(fqn, tuple(p.shape), p.dtype) for fqn, p in m.named_parameters()] for n, m in named}
    last = mine[-1]
    logits_sharded = (loss_parallel and loss_fn is None and chunk_ids[-1] == len(pipe.stages) - 1 and last.strategy.tp > 1
                      and any(style == "logits" for _, style in entries(infos[last.name].plan)))
    boundary_check = BoundaryCheck(named, plan)  # meta copies of the units, taken before they are sharded
    options = _UnitOptions(mixed_precision, names[-1], compile_kwargs, pipe.num_microbatches,
                           init_fn or model_init_fn(model), micro_tp, seed)
    meta = settings["meta_device"]
    built = materialized([(ly.name, modules[ly.name]) for ly in mine], plan, world, meta, seed, device,
                         options.init_fn, tie_sources(ties, named) if meta else None)  # autopar.runtime.meta_build
    states = [_build_unit(ly, next(built), infos[ly.name], places[ly.name], pi, rank, groups, device,
                          logits_sharded and ly is last, options) for ly in mine]
    for _ in built:  # the rounds left when other ranks hold more units
        pass
    mine_names = {ly.name for ly in mine}
    for n, m in named:
        if n not in mine_names:
            m.to_empty(device="meta")  # this rank never runs it: free its memory

    mailbox = Mailbox(device)
    runner = build_runner(rank, plan, pi, chunk_ids, [s.unit for s in states], mailbox, loss_fn or cross_entropy,
                          logits_sharded, boundary_check)
    tensors = [t for s in states for t in s.proxies]
    # A rank whose units have no parameters still gets a real optimizer (torch refuses empty lists).
    opt = optimizer(tensors or [torch.zeros(0, device=device, requires_grad=True)])
    # Every rank takes part in one collective on the default group before any subset uses it for
    # batched point-to-point (NCCL requires it; it also means every rank finished wrap()).
    dist.barrier()
    pm = ParallelModel(plan, device, runner, states, opt, mailbox, shapes, places, on_nonfinite,
                       max_grad_norm=max_grad_norm, log_every=log_every, tied=TiedGrads(ties, places, rank, groups),
                       rng_clock=options.clock)
    pm.hf = hf_source
    return pm


def _compile_kwargs(compile: bool | dict) -> dict | None:  # noqa: A002
    """torch.compile's arguments for ``wrap(compile=...)`` (None: do not compile)."""
    if compile is True:
        return {}
    if compile is False:
        return None
    if isinstance(compile, dict):
        return dict(compile)
    raise AutoparError("compile", f"must be True, False or a dict of torch.compile arguments, got {compile!r}",
                       "pass compile=True or compile={'backend': 'aot_eager'}")


def _check_compilable(plan: Plan) -> None:
    """Refuse what torch.compile cannot trace here: activation checkpointing around DTensor TP code
    (torch 2.13's dynamo fails on the DeviceMesh the checkpoint would save)."""
    for pipe in plan.pipelines:
        for st in pipe.stages:
            for ly in st.layers:
                if ly.strategy.tp > 1 and ly.strategy.ckpt != "none":
                    raise AutoparError("compile", f"unit {ly.name} has tp {ly.strategy.tp} with ckpt "
                                       f"{ly.strategy.ckpt}: torch.compile cannot trace activation checkpointing "
                                       "around tensor-parallel code", "use ckpt none on TP units, or compile=False")


@dataclass(frozen=True)
class _UnitOptions:
    mixed_precision: MixedPrecisionPolicy | None
    last_unit: str  # the model's last unit (its output dtype is the policy's output_dtype)
    compile_kwargs: dict | None
    microbatches: int = 1  # this rank's pipeline's micro-batches: backward passes per step call
    init_fn: InitFn | None = None  # meta-device materialisation (runtime.materialize)
    async_tp: bool = False  # micro-pipeline async-TP units (CUDA, NCCL, inductor: autopar.runtime.async_tp)
    seed: int = 0  # wrap's seed: meta-device materialisation and the units' random streams (runtime.unit_rng)
    clock: RNGClock = field(default_factory=RNGClock)  # the model call those streams are at (ParallelModel sets it)


def _cp_group(lay: Layout, rank: int, groups: Groups) -> CPGroup:
    """This rank's CP group of a unit laid out as ``lay``."""
    members = lay.cp_group(rank)
    return CPGroup(groups.get(members), lay.cp, lay.cp_index(rank), tuple(lay.cp_index(m) for m in members))


def _build_unit(ly: StageLayer, module: nn.Module, info: UnitTPInfo, places: list[Placement], pipeline: int,
                rank: int, groups: Groups, device: torch.device, logits_sharded: bool,
                options: _UnitOptions) -> _UnitState:
    """Apply TP, the precision policy, checkpointing, compilation and ZeRO (in that order) to one
    materialised unit of this rank's stage; set up its sync."""
    mine = next(p for p in places if p.pipeline == pipeline)
    lay, strat = mine.layout, ly.strategy
    if lay.cp > 1:  # context parallel: this rank's positions, attention over its CP group
        apply_cp(module, _cp_group(lay, rank, groups))
    tp_mesh = fsdp_mesh = None
    if mine.fsdp and lay.tp > 1:  # FSDP x TP: one 2-D mesh, TP inner (torchtitan's layout)
        mesh2 = groups.mesh_fsdp_tp(lay)
        tp_mesh, fsdp_mesh = mesh2["tp"], mesh2["dp"]
    else:
        if lay.tp > 1:
            tp_mesh = groups.mesh_1d(lay.tp_group(rank))
        if mine.fsdp:
            fsdp_mesh = groups.mesh_1d(tuple(sorted(mine.devices)))
    if lay.dp > 1 and has_batchnorm(module):  # statistics over the DP group (check_batchnorm: one micro-batch)
        apply_sync_batchnorm(module, groups.get(lay.dp_group(rank)))
    if tp_mesh is not None:
        apply_tp(module, info.plan, tp_mesh, strat.sp, logits_sharded=logits_sharded)
        if options.async_tp and strat.async_tp:
            enable_symmetric_memory(tp_mesh)
    if strat.ep > 1:  # experts sharded over the EP group (tp 1: plan rules; ZeRO-3 nests FSDP2 over expert-DP)
        apply_expert_parallel(module, places, mine, rank, groups)
    params = list(module.parameters())
    policy, last = options.mixed_precision, ly.name == options.last_unit
    if policy is not None and (fsdp_mesh is None or not params):
        apply_cast(module, policy, last)
    apply_checkpointing(module, strat.ckpt, info.selective)
    if options.compile_kwargs is not None:
        module.forward = torch.compile(module.forward, **options.compile_kwargs)
    if fsdp_mesh is not None and params:
        apply_fsdp(module, fsdp_mesh, fsdp_policy(policy, params[0].dtype, last) if policy is not None else None,
                   reshard_after_forward=strat.reshard, ignored_params=fsdp_ignored(module, mine))
        params = list(module.parameters())
    if strat.ep > 1:
        sync = ExpertGradSync(module, places, mine, rank, groups)
    else:  # tp > 1: the gradients each TP rank holds a part of are summed over TP too
        sync = UnitGradSync(module, places, mine, rank, groups,
                            tp_partial_params(module, info.plan or {}, strat.sp))
    shard, proxies, zero2 = None, [_local(p) for p in params], None
    # ZeRO-1/2 of an expert-parallel unit: sliced over its expert-DP group (all its tensors are equal there).
    shard_ranks = zero_group(mine, rank) if strat.ep > 1 else lay.dp_group(rank)
    if mine.zero in (1, 2) and params and len(shard_ranks) > 1:
        shard = FlatShard(proxies, groups.get(shard_ranks), overlap=strat.zero_overlap)
        # ZeRO-2 (and ZeRO-1 with zero_overlap) reduce-scatter straight into the shard from backward
        # when the sync group is exactly the DP group. Otherwise (TP, or the unit also lives in other
        # pipelines, which run other micro-batch counts) the step-end sync all-reduces and the shard slices.
        direct = sync.mode == "aligned" and lay.tp == 1 and set(sync.rep_ranks) == set(lay.dp_group(rank))
        zero2 = backward_reducer(shard, params, mine.zero, strat.zero_overlap, direct, options.microbatches)
        proxies = [shard.master]
    window = info.plan if lay.tp > 1 and options.compile_kwargs is None else None
    own_tokens = strat.sp and splits_sequence(info.plan)  # (an embedding unit's output stays replicated under sp)
    UnitRNG(ly.name, options.seed, lay.tp_group(rank), rank, own_tokens, device, options.clock).install(module, window)
    return _UnitState(LocalUnit(ly.name, module, lay, strat), mine, sync, proxies, shard, zero2)
