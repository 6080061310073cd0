"""ModelSpec and LayerSpec: a model as an ordered list of layer units with the numbers the cost model needs.

Every quantity is *per sample* (one sequence) and for the whole unit (TP degree 1); the cost model
divides by TP / DP degrees. Bytes assume the model's training dtype (``dtype_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.errors import AutoparError
from autopar.modelspec.op_policy import OpSaved
from cost_models.gemm_shapes import Gemm, flops_per_token

# none | selective (the attention core, Korthikanti et al.) | full (keep the unit's input) | op (torchtitan's
# op-level selective checkpointing: matmul outputs but every second one, SDPA outputs; see op_policy.py)
CKPT_MODES = ("none", "selective", "full", "op")
# fp32: the softmax statistics (log-sum-exp per query row) flash / fused SDPA kernels keep, and the logits the loss
# reads (autocast runs cross entropy in fp32)
STATS_BYTES = 4


@dataclass(frozen=True)
class MoESpec:
    """The mixture-of-experts part of a layer unit (a block whose MLP is routed to ``top_k`` of
    ``num_experts`` experts per token, dropless: every token reaches its ``top_k`` experts).

    num_experts:      routed experts of the unit (shared experts, which every token runs, are not counted:
                      they are ordinary parameters of the unit).
    top_k:            experts each token is sent to.
    expert_params:    parameters of all routed experts together (what expert parallelism splits: a rank of
                      an EP group of degree e holds ``expert_params / e``); part of ``LayerSpec.params``.
    capacity_factor:  tokens an expert may take, as a multiple of the even share (None: dropless, the only
                      mode autopar plans and runs; kept so a spec can state a model trained with dropping).
    expert_flops:     forward FLOPs per sample of the routed experts (top_k active: 2 x top_k x one
                      expert's parameters per token); part of ``LayerSpec.flops``.
    dispatch_bytes:   bytes per sample an all-to-all moves to the experts (top_k copies of each token's
                      hidden state); the combine moves the same back.
    expert_act_bytes: saved activation bytes per sample of the expert MLPs (the dispatched tokens and the
                      expert interiors); part of ``LayerSpec.act_tp_bytes``.
    """

    num_experts: int
    top_k: int
    expert_params: int
    capacity_factor: float | None = None
    expert_flops: float = 0.0
    dispatch_bytes: float = 0.0
    expert_act_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.num_experts, int) or self.num_experts < 1:
            raise AutoparError("moe.num_experts", f"must be an integer >= 1, got {self.num_experts!r}",
                               "give the routed expert count (num_local_experts / num_experts)")
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.num_experts:
            raise AutoparError("moe.top_k", f"must be an integer in 1..{self.num_experts}, got {self.top_k!r}",
                               "give the experts per token (num_experts_per_tok)")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise AutoparError("moe.capacity_factor", f"must be positive, got {self.capacity_factor!r}",
                               "give a factor > 0, or leave it unset (dropless)")
        for f in ("expert_params", "expert_flops", "dispatch_bytes", "expert_act_bytes"):
            if getattr(self, f) < 0:
                raise AutoparError(f"moe.{f}", f"is negative ({getattr(self, f)})", "give a count or size of at least 0")

    @property
    def params_per_expert(self) -> float:
        """Parameters of one routed expert."""
        return self.expert_params / self.num_experts


@dataclass(frozen=True)
class LayerSpec:
    """One layer unit in execution order (embedding, a transformer block, norm + head, any module).

    name:            the module's FQN (``embed``, ``layers.3``, ``head``, or an ``nn.Sequential`` index).
    kind:            embedding | block | head | generic (informational; the numbers below decide cost).
    params:          parameter count of the unit.
    tp_params:       how many of ``params`` tensor parallelism shards (the rest, e.g. norms, is replicated).
    tp_local_params: how many of the rest run whole on the rank's tokens (an MoE family's router and experts
                     under autopar's runtime, ``moe_local``): the unit runs TP with sequence parallelism only
                     (``tp_needs_sp``), and their gradients are summed over TP (``cost_models.layer``).
    flops:           forward FLOPs per sample (a multiply-add is 2 FLOPs). Backward costs 2x forward.
    attn_core_flops: forward FLOPs per sample of the attention core (QK^T, softmax, .V); selective
                     checkpointing recomputes exactly these.
    act_tp_bytes:    bytes saved for backward per sample that TP shards (inside attention and MLP).
    act_seq_bytes:   saved bytes per sample that TP alone replicates but sequence parallel shards
                     (norm inputs, residuals, dropout masks).
    act_attn_bytes:  saved bytes per sample of the attention core (scores, softmax); selective
                     checkpointing drops them; TP shards them. Near zero with flash attention.
    boundary_bytes:  bytes per sample of the unit's output (what a pipeline stage sends, what full
                     checkpointing keeps of the unit's input).
    tp_divisors:     a TP degree must divide each of these (heads, KV heads, FFN width, vocab).
                     Empty: the unit has no TP plan and runs with tp = 1 only.
    tp_comm_bytes:   bytes per sample all-reduced over the TP group in forward (backward: the same).
    tp_collectives:  number of TP collectives per forward (each pays the latency).
    tp_plan:         name of the unit's TP plan table in autopar.models (None: no TP).
    op:              what ckpt ``op`` keeps and recomputes (``op_policy.OpSaved``); None: not modelled
                     for this unit, so ``op`` is refused for it.
    moe:             the unit's routed experts (``MoESpec``); None: a dense unit. ``params`` counts every
                     expert (total), ``flops`` the ``top_k`` a token runs (active).
    kv_bytes:        bytes per sample of the unit's K and V at KV-head width: what context parallel
                     all-gathers (cost_models/context_parallel.py); 0: taken as 2 x boundary_bytes
                     for a unit with an attention core.
    loss_bytes:      bytes per sample of the fp32 logits the loss reads on this unit (an LM head:
                     s*V*4, vocabulary-parallel under TP); 0: no loss here. The loss's backward holds
                     several copies (cost_models/memory_terms.py).
    gemms:           the unit's tensor-parallel matmuls in execution order (``cost_models.gemm_shapes.Gemm``:
                     k, n at TP 1 and which one TP splits), each run on ``gemm_rows`` rows per sample; their
                     per-rank shapes decide how much of the GPU's SMs they keep busy. Empty: not known (the
                     unit's FLOPs run at the large-GEMM efficiency).
    gemm_rows:       rows per sample of those matmuls (the sample's tokens).
    lin_in_seq_bytes:    saved bytes per sample (in ``act_seq_bytes``) that only a column-parallel linear layer
                     keeps, its input for the weight gradient: the norm outputs feeding QKV and the MLP.
    lin_in_tp_bytes:     the same for row-parallel linear layers (in ``act_tp_bytes``): the MLP's
                     down-projection input.
    lin_in_shared_bytes: row-parallel linear inputs another op keeps too (in ``act_tp_bytes``): flash
                     attention's output, which the out-projection reads. These three say what a framework
                     that keeps linear inputs in a narrower dtype saves (``cast_input_delta``); 0 (traced
                     units, MoE blocks): not known, nothing changes.
    tied_params:     parameters the unit uses that an earlier unit owns (an LM head tied to the token
                     embedding), not in ``params`` (each tensor counts once, at its first unit). A runtime
                     that keeps a copy for the later unit (``CostParams.tied_copy_one_stage``, or any stage
                     but the earlier unit's) holds, syncs and updates it as the unit's own, TP-sharded.
    shared_params:   parameters of the unit (in ``params``) that a later unit also uses: where that unit
                     keeps a copy, their gradients are summed once per step (``cost_models.ties``), charged
                     here, on the stage whose gradient is ready last.
    """

    name: str
    kind: str = "generic"
    params: int = 0
    tp_params: int = 0
    flops: float = 0.0
    attn_core_flops: float = 0.0
    act_tp_bytes: float = 0.0
    act_seq_bytes: float = 0.0
    act_attn_bytes: float = 0.0
    boundary_bytes: float = 0.0
    tp_divisors: tuple[int, ...] = ()
    tp_comm_bytes: float = 0.0
    tp_collectives: int = 0
    tp_plan: str | None = None
    op: OpSaved | None = None
    moe: MoESpec | None = None
    kv_bytes: float = 0.0
    loss_bytes: float = 0.0
    gemms: tuple[Gemm, ...] = ()
    gemm_rows: int = 0
    lin_in_seq_bytes: float = 0.0
    lin_in_tp_bytes: float = 0.0
    lin_in_shared_bytes: float = 0.0
    tied_params: int = 0
    shared_params: int = 0
    tp_local_params: int = 0

    def __post_init__(self) -> None:
        for f in ("params", "tp_params", "tp_local_params", "flops", "attn_core_flops", "act_tp_bytes", "act_seq_bytes",
                  "act_attn_bytes", "boundary_bytes", "tp_comm_bytes", "tp_collectives", "kv_bytes",
                  "loss_bytes", "lin_in_seq_bytes", "lin_in_tp_bytes", "lin_in_shared_bytes", "tied_params",
                  "shared_params"):
            if getattr(self, f) < 0:
                raise AutoparError(f"layer {self.name}.{f}", f"is negative ({getattr(self, f)})",
                                   "give a count or size of at least 0")
        if self.shared_params > self.params:
            raise AutoparError(f"layer {self.name}.shared_params", "exceeds params",
                               "shared_params counts the part of params a later unit also uses")
        if self.tp_params + self.tp_local_params > self.params:
            raise AutoparError(f"layer {self.name}.tp_params", "with tp_local_params exceeds params",
                               "tp_params counts the TP-sharded part of params, tp_local_params part of the rest")
        if self.gemms and (self.gemm_rows <= 0 or self.gemm_flops > self.flops * (1 + 1e-9)):
            raise AutoparError(f"layer {self.name}.gemms", f"{len(self.gemms)} matmuls of {self.gemm_rows} rows "
                               f"give {self.gemm_flops:.4g} FLOPs per sample, more than the unit's {self.flops:.4g} "
                               "(or no rows)", "list the unit's matmuls as [tokens, k] @ [k, n] with gemm_rows "
                               "= tokens per sample")
        if self.moe is not None and self.moe.expert_params > self.params:
            raise AutoparError(f"layer {self.name}.moe.expert_params", "exceeds params",
                               "expert_params counts the routed experts' part of params")

    @property
    def tp_needs_sp(self) -> bool:
        """Whether TP > 1 needs sequence parallelism: parts run per token, whole on every rank (``tp_local_params``),
        which only sequence parallelism divides over TP."""
        return self.tp_local_params > 0

    @property
    def supports_tp(self) -> bool:
        return bool(self.tp_divisors)

    def tp_ok(self, tp: int) -> bool:
        """Whether TP degree ``tp`` is legal for this unit (1 always is)."""
        if tp == 1:
            return True
        return self.supports_tp and all(d % tp == 0 for d in self.tp_divisors)

    def saved_bytes(self, ckpt: str, tp: int = 1, sp: bool = False, input_share: float = 1.0) -> float:
        """Activation bytes per sample this unit keeps for backward under (ckpt, tp, sp).

        Korthikanti et al. (2205.05198) split: TP shards the attention/MLP interior, sequence
        parallelism shards the rest; selective recompute drops the attention core; full recompute
        keeps only the unit's input; ``op`` keeps what torchtitan's op policy saves (``op_policy``).
        ``input_share`` < 1: the linear layers keep their inputs at that share of the activations'
        bytes (``CostParams.linear_input_share``, ``cast_input_delta``; the interior modes only).
        """
        seq_div = tp if sp else 1
        if ckpt == "none":
            return ((self.act_tp_bytes + self.act_attn_bytes) / tp + self.act_seq_bytes / seq_div
                    + self.cast_input_delta(tp, sp, input_share))
        if ckpt == "selective":
            return self.act_tp_bytes / tp + self.act_seq_bytes / seq_div + self.cast_input_delta(tp, sp, input_share)
        if ckpt == "full":  # the loss runs after the checkpointed forward: its saved logits stay
            return self.boundary_bytes / seq_div + self.loss_bytes / tp
        if ckpt == "op":
            return self.op_facts().saved_bytes(tp, sp)
        raise AutoparError("ckpt", f"unknown mode {ckpt!r}", f"use one of {', '.join(CKPT_MODES)}")

    def cast_input_delta(self, tp: int, sp: bool, share: float) -> float:
        """Bytes per sample the saved activations change by when every linear layer keeps its input at
        ``share`` of the activations' bytes instead of the activation itself: the inputs only a linear layer
        keeps shrink to that share, and one another op keeps too gains the linear layer's own narrower copy.
        Transformer Engine's FP8 linear layers keep the FP8 cast of their input (share 0.5 of bf16; TE v1.8
        module/linear.py saves ``inputmat`` cast to FP8, layernorm_linear.py its FP8 ``ln_out``) while flash
        attention keeps its bf16 output, the out-projection's input. 0 at share 1 (the same tensor)."""
        if share >= 1.0:
            return 0.0
        seq_div = tp if sp else 1
        only = self.lin_in_seq_bytes / seq_div + self.lin_in_tp_bytes / tp
        return (share - 1.0) * only + share * self.lin_in_shared_bytes / tp

    def recompute_flops(self, ckpt: str) -> float:
        """Forward FLOPs per sample recomputed in backward under ``ckpt``."""
        if ckpt == "op":
            return self.op_facts().recompute_flops
        return {"none": 0.0, "selective": self.attn_core_flops, "full": self.flops}[ckpt]

    @property
    def gemm_flops(self) -> float:
        """Forward FLOPs per sample (TP 1) of the matmuls ``gemms`` lists."""
        return self.gemm_rows * flops_per_token(self.gemms)

    def recompute_gemm_flops(self, ckpt: str) -> float:
        """The part of ``recompute_flops(ckpt)`` that ``gemms`` runs: all of them under full recomputation,
        every second one under ``op`` (the policy recomputes the 2nd, 4th, ... matmul), none otherwise."""
        if ckpt == "full":
            return self.gemm_flops
        if ckpt == "op":
            return self.gemm_rows * flops_per_token(self.gemms[1::2])
        return 0.0

    def op_facts(self) -> OpSaved:
        """What ckpt ``op`` keeps and recomputes; one-line refusal for a unit it is not modelled for."""
        if self.op is None:
            raise AutoparError(f"layer {self.name}.ckpt", "op checkpointing is not modelled for this unit (zoo and "
                               "Hugging Face models: transformer blocks only)", "use none, selective or full for it")
        return self.op


@dataclass
class ModelSpec:
    """A model as the planner sees it: ordered layer units plus the shape facts the CLI reports.

    ``source`` is how to rebuild it (zoo name, HF config path, or ``pkg.module:factory``), so a plan
    file can be re-estimated later.
    """

    name: str
    seq_len: int
    layers: list[LayerSpec]
    hidden: int = 0
    vocab: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    ffn: int = 0
    dtype_bytes: int = 2
    source: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.seq_len <= 0:
            raise AutoparError("seq_len", f"must be positive, got {self.seq_len}", "pass --seq-len N with N >= 1")
        if not self.layers:
            raise AutoparError("model", "has no layer units", "give a model with at least one module")
        names = [ly.name for ly in self.layers]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise AutoparError("model.layers", f"duplicate unit names {dup}", "name every unit uniquely")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_params(self) -> int:
        return sum(ly.params for ly in self.layers)

    @property
    def num_experts(self) -> dict[str, int]:
        """Unit name -> routed experts, for the MoE units only (empty for a dense model)."""
        return {ly.name: ly.moe.num_experts for ly in self.layers if ly.moe is not None}

    @property
    def active_params(self) -> float:
        """Parameters a token runs through: every dense parameter, ``top_k`` experts of each MoE unit."""
        return sum(ly.params - (ly.moe.expert_params * (1 - ly.moe.top_k / ly.moe.num_experts) if ly.moe else 0)
                   for ly in self.layers)

    @property
    def flops_per_sample(self) -> float:
        """Forward FLOPs per sample."""
        return sum(ly.flops for ly in self.layers)

    @property
    def model_flops_per_sample(self) -> float:
        """Training FLOPs per sample for MFU (PaLM appendix B: forward + backward, recompute not counted)."""
        return 3.0 * self.flops_per_sample

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def layer(self, name: str) -> LayerSpec:
        for ly in self.layers:
            if ly.name == name:
                return ly
        raise AutoparError("layer", f"unknown unit {name!r} in model {self.name}",
                           f"use one of {', '.join(ly.name for ly in self.layers[:4])}, ...")

    def index(self) -> dict[str, int]:
        """Unit name -> position."""
        return {ly.name: i for i, ly in enumerate(self.layers)}
