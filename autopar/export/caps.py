"""What each export target can express, as data: the ZeRO levels, checkpoint modes, precisions, layer
splits and degrees its configuration takes (from the tools' own options; see each target's module)."""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError


@dataclass(frozen=True)
class Caps:
    """One target's expressible subset of autopar plans (all uniform: one strategy for every block).

    zero / zero_pp: the ZeRO levels it configures without / with pipeline parallelism; ckpt: the
    activation-checkpoint modes; sp: "free" (a switch), "always" (TP implies it) or "never";
    split: "any" (an explicit per-stage layer list) or "even" (its own even split of the blocks);
    pp / tp: whether it configures pipeline / tensor parallelism (tp_with_pp: both at once);
    replicas: identical pipelines over sharded stages (HSDP); precisions: autopar precisions it trains in;
    schedules: its pipeline schedules (Megatron and DeepSpeed run 1F1B only; without pipelining every tool
    accumulates micro-batch by micro-batch, as 1F1B); ep_zero: the ZeRO levels with which it runs expert
    parallelism (one degree for every MoE unit; empty: no expert parallelism in its configuration). No target takes
    ``zb-h1``: torchtitan's zero-bubble schedules (InterleavedZeroBubble, ZBVZeroBubble) are its multi-stage ones,
    built for 2+ stages per rank, so a zb-h1 plan exports as the closest 1F1B plan with the change listed.
    reshard: the ``reshard`` values it runs ZeRO-3 with
    (False: parameters kept gathered from forward to backward); overlap: the ``zero_overlap`` values it runs
    ZeRO-1/2 with (True: reduce-scatter in backward and all-gather before forward overlapped, both).
    cp: whether it configures context parallelism
    (DeepSpeed and accelerate do not: their closest plan has cp 1).
    async_tp: whether it micro-pipelines sequence-parallel TP's
    collectives with their matmuls in the transformer blocks (torchtitan's compile.enable_async_tensor_parallel, moved
    there from parallelism by pytorch/torchtitan#4045 before 0.3,
    Megatron's --tp-comm-overlap); elsewhere an async-TP plan is exported as plain TP, the change listed.
    """

    name: str
    zero: tuple[int, ...]
    zero_pp: tuple[int, ...]
    ckpt: tuple[str, ...]
    sp: str
    split: str
    pp: bool
    tp: bool
    tp_with_pp: bool
    replicas: bool
    precisions: tuple[str, ...]
    suffix: str  # the file name ending its format takes
    schedules: tuple[str, ...] = ("1f1b",)  # pipeline schedules (autopar names)
    ep_zero: tuple[int, ...] = ()  # ZeRO levels it runs expert parallelism with
    reshard: tuple[bool, ...] = (True,)  # ZeRO-3's reshard values
    overlap: tuple[bool, ...] = (False,)  # ZeRO-1/2's zero_overlap values
    cp: bool = False  # context parallel (torchtitan context_parallel_degree, Megatron --context-parallel-size)
    async_tp: bool = False

    def zero_levels(self, pp: int) -> tuple[int, ...]:
        return self.zero_pp if pp > 1 else self.zero


CAPS: dict[str, Caps] = {
    # torchtitan 0.3: FSDP2 (dp_shard; fsdp_reshard_after_forward always = ZeRO-3, never = ZeRO-3 with
    # reshard: false; its parameters are sharded between steps, so it is not ZeRO-2), DDP (dp_replicate),
    # HSDP (both); TP always with its SequenceParallel switch; module_fqns_per_model_part;
    # activation_checkpoint none | selective (per-op SAC, autopar's op) | full; bf16 or fp32 parameters.
    # --parallelism.expert_parallel_degree borrows its ranks from FSDP (ParallelismConfig: efsdp = dp_shard * cp *
    # tp / ep), so expert parallelism goes with FSDP (ZeRO-3, resharding or not).
    "torchtitan": Caps("torchtitan", (0, 3), (0, 3), ("none", "op", "full"), "free", "any", True, True, True,
                       True, ("bf16", "fp32"), ".sh", ("1f1b", "gpipe"), (3,), reshard=(True, False), cp=True,
                       async_tp=True),
    # Megatron-LM / megatron-core 0.16: uniform TP/PP, --pipeline-model-parallel-layout, DDP or the
    # distributed optimizer (ZeRO-1), Megatron-FSDP optim_grads (ZeRO-2) / optim_grads_params (ZeRO-3)
    # without pipelining, --overlap-grad-reduce with --overlap-param-gather (zero_overlap) on either;
    # --recompute-granularity selective (the attention core) | full.
    # --expert-model-parallel-size (EP a sub-group of DP) with DDP or the distributed optimizer.
    "megatron": Caps("megatron", (0, 1, 2, 3), (0, 1), ("none", "selective", "full"), "free", "any", True, True,
                     True, False, ("bf16", "fp16", "fp32"), ".sh", ep_zero=(0, 1), overlap=(False, True), cp=True,
                     async_tp=True),
    # DeepSpeed 0.19: zero_optimization.stage 0-3 (0-1 with its pipeline engine), AutoTP without pipelining,
    # PipelineModule's partition by block type (an even split), activation checkpointing of every block.
    # Not zero_overlap (its overlap_comm overlaps the gradient reduction only, not the parameter all-gather)
    # nor reshard: false (stage3_max_reuse_distance keeps parameters by distance, not from forward to backward).
    "deepspeed": Caps("deepspeed", (0, 1, 2, 3), (0, 1), ("none", "full"), "never", "even", True, True, False,
                      False, ("bf16", "fp16", "fp32"), ".json"),
    # accelerate 1.x FSDP plugin: fsdp_reshard_after_forward NO_SHARD / SHARD_GRAD_OP (ZeRO-3 with reshard:
    # false: FSDP1 gathers before forward and reshards after backward, so not ZeRO-2) / FULL_SHARD, no tensor
    # or pipeline parallelism, fsdp_activation_checkpointing of the transformer blocks.
    "accelerate": Caps("accelerate", (0, 3), (0, 3), ("none", "full"), "never", "even", False, False, False,
                       False, ("bf16", "fp16", "fp32"), ".yaml", reshard=(True, False)),
}
TARGETS = tuple(CAPS)


def caps_of(target: str) -> Caps:
    """The capabilities of ``target``; one-line refusal naming the known targets."""
    if target not in CAPS:
        raise AutoparError("export --to", f"unknown target {target!r}", f"use one of {', '.join(TARGETS)}")
    return CAPS[target]
