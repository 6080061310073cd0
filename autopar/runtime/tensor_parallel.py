"""Tensor parallelism of one unit with DTensor ``parallelize_module``, driven by the model's TP table.

A unit's boundary tensors (its input and output) are always plain local tensors holding the full
sequence, replicated over the TP group: that is the contract between units and pipeline stages.
Sequence parallelism lives inside a unit (``sp_unit`` splits the input along the sequence and
gathers the output), so neighbours with different TP degrees or without sp need no special case.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel, parallelize_module
from torch.distributed.tensor.parallel.style import ParallelStyle

from autopar.errors import AutoparError
from autopar.models.tp_plans import MOE_LOCAL, entries
from autopar.runtime.tp_linear import Colwise, Rowwise

# A module that keeps its parameters whole on every TP rank but sees only the rank's share of what it
# normalises (Qwen3's per-head Q/K norms, HF's ``replicated_with_grad_allreduce``): each rank's gradient is a
# part of the whole, so the unit's gradient sync sums it over the TP group (``tp_partial_params``).
TP_GRAD_SUM = "tp_grad_sum"
# The same only under sequence parallelism: a replicated module that sees the rank's own tokens when the unit splits
# the sequence and every token otherwise (OPT-350M's project_out in the head): a part of its gradient with sp, the
# whole without.
SP_GRAD_SUM = "sp_grad_sum"
# A projection kept whole on every TP rank whose output every rank's heads read (multi-query attention's one K and V
# head): the gradients of its input and of its parameters are each the part of the rank's heads, summed over TP.
KV_REPLICATED = "kv_replicated"
# A module whose parts read one input (a multi-query QKV held as parts): the input becomes a replicated DTensor once.
REPLICATED_INPUT = "replicated_input"


def _style(name: str, sp: bool, logits_sharded: bool) -> ParallelStyle | None:
    """The ParallelStyle for a table entry (None: leave the module as it is). Under sequence parallelism a rank's
    tokens are its share of an activation's second-to-last dimension: the sequence of a ``[B, S, H]`` one, the rows of
    one whose tokens a layer flattened to ``[B x S, H]`` (OPT's MLP)."""
    seq = Shard(-2)
    if name == "colwise":
        return Colwise()
    if name == "rowwise":
        return Rowwise(output_layouts=seq if sp else Replicate())
    if name == "vocab_embed":
        return Rowwise(input_layouts=Replicate(), output_layouts=Replicate())
    if name == "tp_norm":
        return _HeadShardedNorm()
    if name == "local_heads":
        return _LocalHeads()
    if name == "writable_output":
        return _WritableOutput()
    if name == "head_norm_list":
        return _HeadNormList()
    if name == "local_head_range":
        return _LocalHeadRange()
    if name in (TP_GRAD_SUM, SP_GRAD_SUM, MOE_LOCAL):  # MOE_LOCAL: an MoE block's router and experts
        return None  # the module runs as it is on this rank's heads or tokens; the gradient sync sums its gradient
    if name == KV_REPLICATED:
        return _ReadByEveryHead()
    if name == "local_queries":
        return _LocalHeads(QUERY_COUNTS, in_config=False)
    if name == REPLICATED_INPUT:
        # one replicated DTensor for the module's parts: their input gradients (a column-parallel part's and the
        # whole K / V head's partial sums) add up as DTensors and are all-reduced once, not once a part
        return PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
    if name == "logits":
        return Colwise(input_layouts=seq if sp else Replicate(),
                       output_layouts=Shard(-1) if logits_sharded else Replicate(),
                       use_local_output=not logits_sharded)
    if not sp:
        return None  # the remaining styles only act under sequence parallelism
    if name == "sp_norm":
        return SequenceParallel(sequence_dim=-2)
    if name == "sp_norm_local":  # a norm whose output meets plain tensors (Gemma 2's norms on sublayer outputs)
        return SequenceParallel(sequence_dim=-2, use_local_output=True)
    if name == "sp_region":
        return PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
    if name == "sp_region_hidden_states":  # the same for a module called as m(hidden_states=...) (HF attention)
        return PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                  desired_input_kwarg_layouts={"hidden_states": Replicate()})
    if name == "sp_region_with_residual":  # called as m(x, residual, ...): x gathered, the residual left sharded
        return PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None))
    if name == "sp_unit":
        return _SplitGather()
    if name == "sp_unit_in":
        return PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(seq,),
                                  use_local_output=True)
    raise AutoparError("tp plan", f"unknown style {name!r}",
                       "use colwise, rowwise, vocab_embed, logits, tp_norm, tp_grad_sum, sp_grad_sum, moe_local, "
                       "kv_replicated, replicated_input, "
                       "local_queries, local_heads, local_head_range, writable_output, head_norm_list, sp_norm, "
                       "sp_norm_local, sp_region, sp_region_hidden_states, sp_region_with_residual, sp_unit or "
                       "sp_unit_in (or several joined by '+')")


class _SplitGather(ParallelStyle):
    """Split a unit's replicated input along the sequence and gather its sequence-sharded output (the first element
    of an output tuple: a decoder layer that also returns its attention weights, Falcon's)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                           use_local_output=True)._apply(module, device_mesh)

        def gather(_mod: nn.Module, _args: tuple, out):
            first = out[0] if isinstance(out, tuple) else out
            whole = DTensor.from_local(first, device_mesh, [Shard(1)], run_check=False).redistribute(
                device_mesh, [Replicate()]).to_local()
            return (whole, *out[1:]) if isinstance(out, tuple) else whole

        module.register_forward_hook(gather)
        return module


class _HeadShardedNorm(ParallelStyle):
    """A norm over features the column-parallel projection before it split by heads (OLMo 2's Q/K norms over all
    heads, Cohere's per-head ones): its parameters are sharded on dim 0 with the heads, and it runs its own forward
    on its input as a DTensor sharded on the first normalised dimension, so DTensor all-reduces the statistics where
    the normalised features span ranks (a 1-D weight) and keeps them local where each head is normalised alone
    (a weight of shape (heads, head_dim)). Its output is the local shard again."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def shard_params(_name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for pname, p in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)]), p.requires_grad))

        def as_dtensor(mod: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
            x = inputs[0]
            return (DTensor.from_local(x, mesh, [Shard(x.ndim - mod.weight.ndim)], run_check=False), *inputs[1:])

        return distribute_module(module, device_mesh, shard_params, as_dtensor,
                                 lambda _mod, out, _mesh: out.to_local())


# The head counts an attention module may keep as attributes (and its config as fields) and size its tensors by,
# and the widths of its heads together (GPT-2's ``split_size``, where it splits its fused Q, K, V output): under TP
# each rank runs its own heads, so ``local_heads`` divides them by the TP degree.
HEAD_COUNTS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "split_size")
# The counts of a multi-query attention module (its one K and V head whole on every rank: kv_replicated) that follow
# its query heads only, which ``local_queries`` divides: GPT-BigCode's width ``embed_dim``, where it splits its fused
# projection's output, and ``num_key_value_groups``, query heads per K/V head. Its K/V head count stays.
QUERY_COUNTS = ("num_heads", "embed_dim", "num_key_value_groups")


class _LocalHeads(ParallelStyle):
    """An attention module that reshapes its projections by its head counts rather than by ``-1`` (StableLM's and
    Persimmon's ``view(b, s, self.num_heads, d)``, Phi-3's split of its fused QKV at ``config.num_attention_heads``,
    GPT-2's at ``self.split_size``):
    each of ``counts`` it keeps (as attributes, and with ``in_config`` in its config, which it then gets a copy of)
    becomes the rank's, the whole count divided by the TP degree (the TP-limit check makes it divide)."""

    def __init__(self, counts: tuple[str, ...] = HEAD_COUNTS, in_config: bool = True) -> None:
        super().__init__()
        self.counts, self.in_config = counts, in_config

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        t = device_mesh.size()
        cfg = getattr(module, "config", None) if self.in_config else None
        if cfg is not None:
            module.config = cfg = copy.copy(cfg)  # the model's other modules keep the whole counts
        for owner in (module,) if cfg is None else (module, cfg):
            for attr in self.counts:
                n = getattr(owner, attr, None)
                if isinstance(n, int) and not isinstance(n, bool):
                    setattr(owner, attr, n // t)
        return module


class _ReadByEveryHead(ParallelStyle):
    """A projection kept whole on every TP rank whose output each rank's heads read (multi-query attention's K and V):
    its input enters as a local tensor whose gradient is marked a part (``Partial``), so the gradient reaching the
    activation is summed over TP (all-reduced from a replicated input; reduce-scattered by the gather of a sequence-
    parallel one). Its parameters' gradients are parts too: ``tp_partial_params`` names them."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def local_input(_module: nn.Module, args: tuple) -> tuple:
            x = args[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
            return (x.to_local(grad_placements=[Partial()]), *args[1:])

        module.register_forward_pre_hook(local_input)
        return module


class _LocalHeadRange(ParallelStyle):
    """A module that computes something per head for the heads ``[first_head, first_head + heads)`` it keeps (BLOOM's
    block wrapper builds their ALiBi biases): under TP, the rank's range of the whole count."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.heads //= device_mesh.size()
        module.first_head = device_mesh.get_local_rank() * module.heads
        return module


class _WritableOutput(ParallelStyle):
    """A module whose output its caller modifies in place (Falcon's ``mlp_output += attention_output``, OLMo's
    ``clamp_`` of its projections): under TP a row- or column-parallel output is a view of a DTensor's local tensor,
    which autograd forbids writing to, so the module returns a copy."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.register_forward_hook(lambda _mod, _args, out: out.clone() if isinstance(out, torch.Tensor) else out)
        return module


class _HeadNormList(ParallelStyle):
    """A module keeping one norm per head in its ``norms`` list, which its forward zips with the heads it is given
    (StableLM's qk_layernorm): under TP it is given the rank's heads, so while it runs its list is the slice of those
    heads. Every norm stays on every rank, unused ones with no gradient there: marked ``tp_grad_sum`` as well, each
    norm's gradient is summed from the rank that used it."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        whole = module.norms
        n = len(whole) // device_mesh.size()
        first = device_mesh.get_local_rank() * n
        mine = nn.ModuleList(list(whole)[first:first + n])

        def swap(_mod: nn.Module, *_hook_args) -> None:
            module._modules["norms"] = mine if module._modules["norms"] is whole else whole

        module.register_forward_pre_hook(swap)
        module.register_forward_hook(swap, always_call=True)
        return module


def apply_tp(unit: nn.Module, table: dict[str, str], mesh: DeviceMesh, sp: bool,
             logits_sharded: bool = False) -> None:
    """Shard ``unit`` over the 1-D ``mesh`` as ``table`` says (in place).

    ``logits_sharded``: keep vocabulary-sharded logits as a DTensor for ``loss_parallel``.
    Modules not named in the table keep plain, replicated parameters. An entry of several styles joined by ``+``
    applies each, in order.
    """
    plan: dict[str, ParallelStyle] = {}
    after: list[tuple[str, ParallelStyle]] = []  # the unit's own style, and a module's second and later styles
    for fqn, name in entries(table):
        style = _style(name, sp, logits_sharded)
        if style is None:
            continue
        if fqn == "" or fqn in plan:
            after.append((fqn, style))
        else:
            plan[fqn] = style
    if plan:
        parallelize_module(unit, mesh, plan)
    for fqn, style in after:
        style._apply(unit.get_submodule(fqn) if fqn else unit, mesh)


def tp_partial_params(unit: nn.Module, table: dict[str, str], sp: bool = False) -> set[str]:
    """Names (in ``unit``) of the parameters whose gradient each TP rank holds only a part of: those of the
    modules ``table`` marks ``tp_grad_sum`` or ``kv_replicated`` (theirs and their children's), and under sequence
    parallelism (``sp``) those it marks ``sp_grad_sum`` or ``moe_local``. Names, not tensors: ZeRO-3 replaces the
    parameter objects."""
    summed = (TP_GRAD_SUM, KV_REPLICATED, SP_GRAD_SUM, MOE_LOCAL) if sp else (TP_GRAD_SUM, KV_REPLICATED)
    return {f"{fqn}.{name}" if fqn else name for fqn, style in entries(table) if style in summed
            for name, _ in unit.get_submodule(fqn).named_parameters()}
