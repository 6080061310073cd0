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
    accumulates micro-batch by micro-batch, as 1F1B); async_tp: whether it micro-pipelines sequence-parallel TP's
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
    async_tp: bool = False

    def zero_levels(self, pp: int) -> tuple[int, ...]:
        return self.zero_pp if pp > 1 else self.zero


CAPS: dict[str, Caps] = {
    # torchtitan 0.3: FSDP2 (dp_shard; reshard_after_forward always = ZeRO-3, never = ZeRO-2), DDP
    # (dp_replicate), HSDP (both); TP always with its SequenceParallel switch; module_fqns_per_model_part;
    # activation_checkpoint none | selective (per-op SAC, autopar's op) | full; bf16 or fp32 parameters.
    "torchtitan": Caps("torchtitan", (0, 2, 3), (0, 2, 3), ("none", "op", "full"), "free", "any", True, True, True,
                       True, ("bf16", "fp32"), ".sh", ("1f1b", "gpipe"), async_tp=True),
    # Megatron-LM / megatron-core 0.16: uniform TP/PP, --pipeline-model-parallel-layout, DDP or the
    # distributed optimizer (ZeRO-1), Megatron-FSDP optim_grads (ZeRO-2) / optim_grads_params (ZeRO-3)
    # without pipelining; --recompute-granularity selective (the attention core) | full.
    "megatron": Caps("megatron", (0, 1, 2, 3), (0, 1), ("none", "selective", "full"), "free", "any", True, True,
                     True, False, ("bf16", "fp16", "fp32"), ".sh", async_tp=True),
    # DeepSpeed 0.19: zero_optimization.stage 0-3 (0-1 with its pipeline engine), AutoTP without pipelining,
    # PipelineModule's partition by block type (an even split), activation checkpointing of every block.
    "deepspeed": Caps("deepspeed", (0, 1, 2, 3), (0, 1), ("none", "full"), "never", "even", True, True, False,
                      False, ("bf16", "fp16", "fp32"), ".json"),
    # accelerate 1.x FSDP plugin: NO_SHARD / SHARD_GRAD_OP / FULL_SHARD, no tensor or pipeline parallelism,
    # fsdp_activation_checkpointing of the transformer blocks.
    "accelerate": Caps("accelerate", (0, 2, 3), (0, 2, 3), ("none", "full"), "never", "even", False, False, False,
                       False, ("bf16", "fp16", "fp32"), ".yaml"),
}
TARGETS = tuple(CAPS)


def caps_of(target: str) -> Caps:
    """The capabilities of ``target``; one-line refusal naming the known targets."""
    if target not in CAPS:
        raise AutoparError("export --to", f"unknown target {target!r}", f"use one of {', '.join(TARGETS)}")
    return CAPS[target]
