"""One measured case into the Plan autopar estimates: one pipeline of ``pp`` stages of ``tp x cp x dp`` devices
(with ``virtual_stages`` v > 1, Megatron's interleaved 1F1B: pp x v model chunks, chunk k on stage k mod pp).

The plan is at the precision of its cluster (``Cluster.at_precision``), and records the default cost
parameters at that precision (with the file's ``framework`` facts over them, ``measured.framework``), so
``estimate_plan(plan, model)`` estimates it as ``autopar estimate`` would.

Devices are numbered as Megatron and AMP rank them (tp fastest, then cp, then dp, then pp), so stage k
holds devices ``k*w ... (k+1)*w - 1``, w = tp*cp*dp. Every unit runs ``Strategy(tp, zero, ckpt, sp, cp)``, with the
checkpointing on the transformer blocks only (what Megatron, DeepSpeed and torchtitan recompute), and
the MoE units with the case's ``ep`` (Megatron's ``--expert-model-parallel-size``: EP groups of
consecutive DP ranks, as autopar's, since Megatron orders its ranks tp-cp-ep-dp-pp), and a
case's ``async_tp`` on the blocks too (torchtitan compiles, and so micro-pipelines, each transformer block).
A case's ``micro_batch_size`` is per data-parallel rank; autopar's is per pipeline (split over the
DP ranks, see autopar/plan/rules.py), so the plan's is ``micro_batch_size * dp``.

Two fields describe what FSDP users configure: ``dp_replicate`` R (HSDP, torchtitan's
``data_parallel_replicate_degree``, FSDP1's ``HYBRID_SHARD`` over nodes): R data-parallel replicas of
dp / R ranks each, the ranks of one replica consecutive, read as R pipelines (autopar's asymmetric plan
form, whose gradient all-reduce across pipelines ``cost_models.cross_pipeline`` prices); ``ckpt_every`` k:
the case's ``ckpt`` on every k-th transformer block only. ``zero_overlap`` (ZeRO 1 or 2): the framework overlaps
the distributed optimizer's step traffic (Megatron's ``overlap_grad_reduce`` / ``overlap_param_gather``, NeMo's
apex ``overlap_grad_sync`` / ``overlap_param_sync``), on every unit but expert-sharded ones (ep > 1: ``cost_models.moe``
prices no option, ``plan/expert_rules`` refuses it there).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.fields import Fields, as_int
from autopar.modelspec.spec import CKPT_MODES, ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy


@dataclass(frozen=True)
class Shape:
    """A case's parallel layout and batch as read from the file (every count checked)."""

    pp: int
    tp: int
    dp: int
    micro_batch_size: int
    num_microbatches: int
    zero: int
    ckpt: str
    sp: bool
    global_batch_size: int
    schedule: str
    virtual_stages: int = 1  # > 1: Megatron's interleaved 1F1B, model chunks per GPU
    ep: int = 1  # expert-parallel degree of the MoE units
    cp: int = 1  # context-parallel degree (every unit; the sequence split over cp ranks)
    async_tp: bool = False  # torchtitan's enable_async_tensor_parallel (needs tp > 1 with sequence_parallel)
    replicas: int = 1  # HSDP: the dp ranks form this many replicas, each sharding over dp / replicas ranks
    ckpt_every: int = 1  # ckpt on every k-th transformer block only (the k-th, 2k-th, ...); the others run without
    zero_overlap: bool = False  # ZeRO-1/2's step traffic overlapped with backward / the next forward (zero_options)


def read_shape(f: Fields, global_batch_size: int, schedule: str) -> Shape:
    """The shape of case ``f`` (micro-batch size, micro-batches and ckpt must be published: the caller
    checks for nulls first); ``global_batch_size`` must equal ``micro_batch_size * dp * num_microbatches``.
    ``virtual_stages`` v > 1 makes the schedule ``interleaved`` whatever the file's schedule says."""
    pp, tp, dp = (f.req_int(k, low=1) for k in ("pp", "tp", "dp"))
    mbs = f.req_int("micro_batch_size", low=1)
    m = f.req_int("num_microbatches", low=1)
    if mbs * dp * m != global_batch_size:
        raise AutoparError(f.at("global_batch_size"), f"is {global_batch_size} but micro_batch_size x dp x "
                           f"num_microbatches = {mbs} x {dp} x {m} = {mbs * dp * m}",
                           "fix the case's batch figures (micro_batch_size is per data-parallel rank)")
    v = f.opt_int("virtual_stages", 1, low=1)
    sp = bool(f.opt_bool("sequence_parallel", False)) and tp > 1
    async_tp = bool(f.opt_bool("async_tp", False))
    if async_tp and not sp:
        raise AutoparError(f.at("async_tp"), f"is true with tp {tp} and sequence_parallel {str(sp).lower()}: async TP "
                           "overlaps sequence parallelism's collectives", "give the case's tp > 1 and sequence_parallel: "
                           "true, or async_tp: false")
    replicas = f.opt_int("dp_replicate", 1, low=1)
    if dp % replicas:
        raise AutoparError(f.at("dp_replicate"), f"is {replicas}, which does not divide dp = {dp} (dp = dp_replicate x "
                           "the shard degree)", "give the HSDP replicate degree, a divisor of dp")
    if replicas > 1 and pp > 1:
        raise AutoparError(f.at("dp_replicate"), f"is {replicas} with pp = {pp}: HSDP cases are read with pp 1 only",
                           "give dp_replicate 1, or pp 1")
    zero = f.req_int("zero", low=0, high=3)
    zero_overlap = bool(f.opt_bool("zero_overlap", False))
    if zero_overlap and zero not in (1, 2):
        raise AutoparError(f.at("zero_overlap"), f"is true with zero {zero}: it overlaps the distributed optimizer's "
                           "gradient reduce-scatter and parameter all-gather", "give zero 1 or 2, or zero_overlap: false")
    ckpt = f.req_str("ckpt", choices=CKPT_MODES)
    every = f.opt_int("ckpt_every", 1, low=1)
    if every > 1 and ckpt == "none":
        raise AutoparError(f.at("ckpt_every"), f"is {every} with ckpt none", "give the checkpointed blocks' ckpt mode")
    return Shape(pp=pp, tp=tp, dp=dp, micro_batch_size=mbs, num_microbatches=m,
                 zero=zero, ckpt=ckpt,
                 sp=sp, global_batch_size=global_batch_size, schedule="interleaved" if v > 1 else schedule,
                 virtual_stages=v, ep=f.opt_int("ep", 1, low=1), cp=f.opt_int("cp", 1, low=1), async_tp=async_tp,
                 replicas=replicas, ckpt_every=every, zero_overlap=zero_overlap)


def stage_sizes(f: Fields, model: ModelSpec, pp: int, notes: list[str]) -> list[int]:
    """Units per stage: the case's ``layers_per_stage`` (checked against the model), or an even split."""
    n = model.num_layers
    raw = f.opt_list("layers_per_stage", None)
    if raw is None:
        base, extra = divmod(n, pp)
        sizes = [base + (1 if k < extra else 0) for k in range(pp)]
        notes.append(f"{f.at('layers_per_stage')} null: even split {sizes} of the {n} units")
        if base == 0:
            raise AutoparError(f.at("layers_per_stage"), f"cannot split {n} units over {pp} stages",
                               "give layers_per_stage")
        return sizes
    sizes = [as_int(x, f"{f.at('layers_per_stage')}[{i}]", low=1) for i, x in enumerate(raw)]
    if len(sizes) != pp or sum(sizes) != n:
        raise AutoparError(f.at("layers_per_stage"), f"{sizes} ({len(sizes)} stages, {sum(sizes)} units) does not "
                           f"match pp = {pp} and the model's {n} units (embed, {n - 2} blocks, head)",
                           "give one count per stage, adding up to the model's units")
    return sizes


def chunk_sizes(f: Fields, model: ModelSpec, shape: Shape, stage_units: list[int]) -> list[int]:
    """Units per model chunk: ``stage_units`` itself without interleaving; with v virtual stages Megatron's
    split, every chunk the same number of blocks (``--num-layers-per-virtual-pipeline-stage``), the
    embedding on the first chunk and the head on the last, which must add up to ``stage_units`` per stage."""
    p, v = shape.pp, shape.virtual_stages
    if v == 1:
        return stage_units
    blocks = model.num_layers - 2
    if blocks % (p * v):
        raise AutoparError(f.at("virtual_stages"), f"{blocks} blocks do not split into pp x virtual_stages = "
                           f"{p} x {v} equal chunks", "give the case's published virtual_stages and pp")
    sizes = [blocks // (p * v)] * (p * v)
    sizes[0] += 1
    sizes[-1] += 1
    per_stage = [sum(sizes[s::p]) for s in range(p)]
    if per_stage != stage_units:
        raise AutoparError(f.at("layers_per_stage"), f"{stage_units} differs from the {v} chunks per stage of "
                           f"{blocks // (p * v)} blocks (embed first, head last): {per_stage}",
                           "give layers_per_stage per physical stage, summed over its chunks")
    return sizes


def _ckpt(shape: Shape, block: int) -> str:
    """The checkpoint mode of the ``block``-th transformer block (1-based): the case's mode on every
    ``ckpt_every``-th, none on the others (PyTorch's ``apply_activation_checkpointing`` with a check_fn
    counting blocks, as fms-fsdp's ``selective_checkpointing``)."""
    return shape.ckpt if block % shape.ckpt_every == 0 else "none"


def build_plan(shape: Shape, sizes: list[int], model: ModelSpec, cluster: Cluster, cost_params: dict) -> Plan:
    """The Plan of ``shape`` with ``sizes`` units per chunk on ``cluster`` (one chunk per stage unless
    ``shape.virtual_stages`` > 1: then chunk k runs on stage k mod pp), recording ``cost_params`` (the
    precision's defaults with the file's ``framework`` over them: ``load._case``). One pipeline, or with
    ``replicas`` R > 1 (HSDP, pp 1) R identical pipelines on consecutive blocks of devices, each training
    1/R of the batch with its parameters sharded over its own dp / R ranks."""
    r = shape.replicas
    width = shape.tp * shape.cp * shape.dp // r
    pipes = []
    for j in range(r):
        stages, first, blocks = [], 0, 0
        for k, size in enumerate(sizes):
            layers = []
            for ly in model.layers[first:first + size]:
                blocks += ly.kind == "block"
                layers.append(StageLayer(ly.name, Strategy(
                    tp=shape.tp, zero=shape.zero, sp=shape.sp, ckpt=_ckpt(shape, blocks) if ly.kind == "block" else "none",
                    ep=shape.ep if ly.moe is not None else 1, cp=shape.cp, async_tp=shape.async_tp and ly.kind == "block",
                    zero_overlap=shape.zero_overlap and (ly.moe is None or shape.ep == 1))))  # expert_rules
            s = j * shape.pp + k % shape.pp
            stages.append(Stage(devices=list(range(s * width, (s + 1) * width)), layers=layers))
            first += size
        pipes.append(Pipeline(batch_share=shape.global_batch_size // r, micro_batch_size=shape.micro_batch_size * shape.dp // r,
                              num_microbatches=shape.num_microbatches, stages=stages, virtual_stages=shape.virtual_stages))
    return Plan(model=ModelRef(model.name, model.seq_len, model.num_layers, model.source), cluster=cluster,
                global_batch_size=shape.global_batch_size, pipelines=pipes, schedule=shape.schedule,
                search={"cost_params": cost_params})
