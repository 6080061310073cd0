"""Context parallel (CP): every sample's sequence split over the cp ranks of a CP group (all-gather CP).

This is Llama 3's context parallelism ("The Llama 3 Herd of Models", section 3.3.2): the sequence is
cut into 2c equal chunks and CP rank r holds chunks r and 2c-1-r (every rank then has the same share
of causal attention work). Each rank computes its own tokens through every layer; attention all-gathers
K and V over the CP group (backward: a reduce-scatter of dK and dV, the gather's adjoint) and attends
its local queries to the whole sequence under the causal mask at the tokens' true positions. Rotary and
learned position embeddings use the true positions too. Parameters are replicated over CP ranks and
their gradients summed over dp x cp (the unit's DP group: autopar/runtime/layout.py); the loss is the
global valid-token mean (autopar/runtime/loss.py: each rank sums its tokens' losses over the global
count), so the result equals single-process training.

Why not ``torch.distributed.tensor.experimental.context_parallel``: in torch 2.13 it patches
``F.scaled_dot_product_attention`` (DTensor inputs on a device mesh) and has ring / all-gather handlers
only for the fused SDPA ops, ``_scaled_dot_product_flash_attention``, ``_efficient_attention`` and
``_cudnn_attention``, none of which takes an attention mask (``attn_bias`` raises NotImplementedError),
plus flex attention (``torch/distributed/tensor/experimental/_context_parallel/_attention.py``). On
CPU SDPA runs the math path, which has no handler, so it cannot run, let alone be proven equal to
one process, on gloo/CPU. It also shards the buffers it is handed up front and rewrites every SDPA call
globally, where autopar places CP per unit under its own TP layout, and Hugging Face attention passes a
mask. The path here is plain collectives (``all_gather_single`` / ``reduce_scatter_single``) on a
process group, the same code on NCCL/CUDA, with SDPA given an explicit mask (any kernel that takes
masks runs it).

How a model opts in (``supports_cp``): its units view has ``context_parallel = True``; modules that
compute positions expose a ``cp_positions`` attribute (None = positions 0..S-1), which ``apply_cp``
sets to this rank's ``positions``; autopar's ``AttentionCore`` modules are replaced by
``CPAttentionCore``; a Hugging Face Llama-like dense block (``HFRotaryBlock``: Llama, Mistral, Qwen2/3, Phi-3,
Gemma 1-3) gets ``cp_attention`` and runs its attention through the ``autopar_cp`` attention function registered
with transformers, under a causal mask at the true positions that also carries the layer's sliding window. Both gather K and V at KV-head width (what the cost model counts): HF before its own
repeat, autopar's Llama (which repeats K and V to every query head before its attention core, stating
``kv_repeat``) by gathering one copy per KV head and repeating after the gather.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autopar.errors import AutoparError
from autopar.models.hf_units import additive_mask, visible_keys
from autopar.plan.schema import Plan
from autopar.units import AttentionCore


@dataclass(frozen=True)
class CPGroup:
    """This rank's CP group: the process group, the CP degree, this rank's CP index, and the CP index
    of each group member in process-group order (sorted global ranks)."""

    group: dist.ProcessGroup | None
    cp: int
    index: int
    member_index: tuple[int, ...]

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """The true positions of this rank's ``local_len`` tokens (chunks index and 2c-1-index)."""
        return chunk_positions(local_len * self.cp, self.cp, self.index, device)

    def hf_positions_and_mask(self, x: torch.Tensor, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """For a Hugging Face block on this rank's tokens ``x [B, local, d]``: position ids ``[1, local]``
        and the additive ``[1, 1, local, S]`` causal mask of its queries against the whole sequence (with a
        sliding ``window``: only the keys less than ``window`` positions back, ``hf_units.visible_keys``)."""
        pos = self.positions(x.shape[1], x.device)
        return pos[None], additive_mask(visible_keys(pos, x.shape[1] * self.cp, window), x.dtype)


def chunk_positions(seq_len: int, cp: int, index: int, device: torch.device | None = None) -> torch.Tensor:
    """Positions of CP rank ``index`` of ``cp``: chunks ``index`` and ``2cp-1-index`` of 2cp equal chunks."""
    if seq_len % (2 * cp):
        raise AutoparError("inputs", f"sequence length {seq_len} does not split into 2 x cp = {2 * cp} equal chunks",
                           f"use a sequence length that is a multiple of {2 * cp}")
    ch = seq_len // (2 * cp)
    a, b = index * ch, (2 * cp - 1 - index) * ch
    return torch.cat([torch.arange(a, a + ch, device=device), torch.arange(b, b + ch, device=device)])


def split_sequence(x: torch.Tensor, cp: int, index: int, dim: int = 1) -> torch.Tensor:
    """This CP rank's tokens of ``x`` along ``dim`` (chunks index and 2cp-1-index, in that order)."""
    if cp == 1:
        return x
    return x.index_select(dim, chunk_positions(x.shape[dim], cp, index, x.device))


class _GatherSequence(torch.autograd.Function):
    """All-gather the local sequence chunks of a CP group into the whole sequence (dim -2, true order);
    backward reduce-scatters the gradient (each rank gets the sum over ranks of its chunks' gradients)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cpg: CPGroup) -> torch.Tensor:  # noqa: ANN001
        ctx.cpg = cpg
        c = cpg.cp
        parts = torch.empty((c, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_single(parts.view(c * x.shape[0], *x.shape[1:]), x.contiguous(), group=cpg.group)
        ch = x.shape[-2] // 2
        by_index = [parts[cpg.member_index.index(j)] for j in range(c)]
        pieces = [by_index[j][..., :ch, :] for j in range(c)] + [by_index[j][..., ch:, :] for j in reversed(range(c))]
        return torch.cat(pieces, dim=-2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        cpg = ctx.cpg
        c = cpg.cp
        ch = grad.shape[-2] // (2 * c)
        chunks = grad.split(ch, dim=-2)
        # member g's slot: the gradient of the two chunks its CP index holds
        slots = [torch.cat([chunks[j], chunks[2 * c - 1 - j]], dim=-2) for j in cpg.member_index]
        flat = torch.cat(slots, dim=0).contiguous()
        out = torch.empty_like(slots[0])
        dist.reduce_scatter_single(out, flat, group=cpg.group)  # a sum
        return out, None


def gather_sequence(x: torch.Tensor, cpg: CPGroup) -> torch.Tensor:
    """The whole sequence of ``x [..., local_len, d]`` over the CP group, in true token order."""
    return _GatherSequence.apply(x, cpg)


class CPAttentionCore(AttentionCore):
    """Causal attention of this rank's queries against the CP group's whole K and V (selective
    checkpointing still finds it: it is an ``AttentionCore``)."""

    def __init__(self, cpg: CPGroup, kv_repeat: int = 1) -> None:
        super().__init__()
        self.cpg, self.kv_repeat = cpg, kv_repeat

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        r = self.kv_repeat  # K and V arrive repeated to every query head: gather one copy per KV head
        if r > 1:
            k, v = k[:, ::r], v[:, ::r]
        k_all, v_all = gather_sequence(k, self.cpg), gather_sequence(v, self.cpg)
        if r > 1:
            k_all, v_all = k_all.repeat_interleave(r, dim=1), v_all.repeat_interleave(r, dim=1)
        mask = visible_keys(self.cpg.positions(q.shape[-2], q.device), k_all.shape[-2])
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)


def supports_cp(model: nn.Module) -> bool:
    """Whether ``model`` (its units view) states the context-parallel hook."""
    return bool(getattr(model, "context_parallel", False))


def plan_cp(plan: Plan) -> list[tuple[int, int, int]]:
    """(pipeline, stage, layer) of the first unit with cp > 1 in each pipeline that has one."""
    out = []
    for pi, pipe in enumerate(plan.pipelines):
        at = next(((si, li) for si, st in enumerate(pipe.stages) for li, ly in enumerate(st.layers)
                   if ly.strategy.cp > 1), None)
        if at is not None:
            out.append((pi, *at))
    return out


def check_cp_model(plan: Plan, model: nn.Module) -> None:
    """Refuse a plan with cp > 1 on a model without the context-parallel hook (one line)."""
    used = plan_cp(plan)
    if used and not supports_cp(model):
        pi, si, li = used[0]
        name = getattr(model, "family", None) or type(model).__name__  # a transformers view: its model type
        raise AutoparError(f"pipelines[{pi}].stages[{si}].layers[{li}].cp",
                           f"context parallel needs a model with the context-parallel hook; {name} has none "
                           "(autopar.models Llama / GPT and the Hugging Face dense Llama-like models: Llama, "
                           "Mistral, Qwen2/3, Phi-3, Gemma 1-3 have it)", "set cp: 1, or run one of those models")


def check_cp_settings(plan: Plan, token_loss: bool, compiled: bool) -> None:
    """Refuse cp > 1 with what the runtime cannot split over sequence chunks or has not proven with it:
    a loss other than the token mean, and torch.compile (one line naming the pair)."""
    used = plan_cp(plan)
    if not used:
        return
    pi, si, li = used[0]
    at = f"pipelines[{pi}].stages[{si}].layers[{li}].cp"
    if not token_loss:
        raise AutoparError("loss_fn", f"context parallel ({at}) splits each sample's tokens over ranks; only the "
                           "token cross entropy is split exactly", "use the default loss (or nn.CrossEntropyLoss), "
                           "or set cp: 1")
    if compiled:
        raise AutoparError("compile", f"context parallel ({at}) with torch.compile is not supported (its K/V "
                           "all-gather is not traced here)", "use compile=False, or set cp: 1")


def hf_cp_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention function ``autopar_cp``: K and V gathered over the module's CP group
    (``module.autopar_cp``, set by ``HFRotaryBlock``), then the attention the model was built with: its
    modeling file's own ``eager_attention_forward`` for eager (Gemma 2's soft-capping lives there), else
    transformers' SDPA (the flash kernels take no mask; the block's mask carries causality and windows)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cpg = module.autopar_cp
    attend = sdpa_attention_forward
    if getattr(module.config, "autopar_cp_base", None) == "eager":
        attend = sys.modules[type(module).__module__].eager_attention_forward
    return attend(module, query, gather_sequence(key, cpg), gather_sequence(value, cpg), attention_mask, **kwargs)


def _use_hf_cp_attention(block: nn.Module) -> None:
    """Register ``autopar_cp`` with transformers and point the block's attention at it (the config is
    the model's: every block of this rank shares the pipeline's one cp); the implementation it replaces is
    kept as ``autopar_cp_base``."""
    from transformers import AttentionInterface

    AttentionInterface.register("autopar_cp", hf_cp_attention)
    cfg = block.attention.config
    if cfg._attn_implementation != "autopar_cp":
        cfg.autopar_cp_base = cfg._attn_implementation
    cfg._attn_implementation = "autopar_cp"


def apply_cp(unit: nn.Module, cpg: CPGroup) -> None:
    """Make ``unit`` run on this rank's tokens: positions from ``cpg``, attention over the CP group."""
    for m in list(unit.modules()):
        if hasattr(m, "cp_positions"):
            m.cp_positions = cpg.positions
        if hasattr(m, "cp_attention"):
            m.cp_attention = cpg
            _use_hf_cp_attention(m)
        for child_name, child in list(m.named_children()):
            if type(child) is AttentionCore:  # ``kv_repeat``: query heads per KV head, where the parent repeats
                setattr(m, child_name, CPAttentionCore(cpg, getattr(m, "kv_repeat", 1)))
