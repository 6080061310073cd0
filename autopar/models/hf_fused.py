"""Fused projections held as their parts, so tensor parallel splits each part by heads or features.

Phi-3 (and Phi-4, the same architecture) computes Q, K and V with one ``qkv_proj`` and its MLP's gate and up
halves with one ``gate_up_proj``; GLM and GLM-4 fuse the MLP's the same way; GPT-2 computes Q, K and V with one
``Conv1D`` ``c_attn``, a linear layer storing its weight transposed (its parts are blocks of columns, ``dim`` 1,
held as ``Conv1D`` parts; autopar.runtime.tp_linear shards those). A plain column split of such a weight
would give rank 0 all of Q and rank 1 the keys and values (or the gate and the up half): the rows each rank needs
are a block of every part, which a DTensor expresses only with a strided placement that torch's checkpointing
refuses. So the view replaces each fused layer by a ``FusedLinear`` of one layer of its kind per part (rows
``[offsets[i], offsets[i + 1])`` of the weight and bias; a Conv1D's weight's columns) whose output is the concatenation of theirs: with every
part column-parallel, a rank's output is its share of each part, in the order the module's forward splits it.

The split is structural (the same for every plan, so autopar checkpoints reshard across TP degrees) and is made in
the transformers model itself, whose modules the view shares. Its state dict keeps the fused tensors (a state-dict
hook concatenates the parts, a load hook splits them), so the model's own ``state_dict``, ``save_pretrained`` and
``load_state_dict`` see the checkpoint layout; ``part_blocks`` says which block of which fused tensor each part is
(``HFSource``: ``load_hf`` and ``save_hf`` read and write the blocks in place, autopar.runtime.tensor_blocks).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is transformers' ``Conv1D`` (GPT-2's projections: a linear layer whose weight is stored
    transposed, ``(in, out)``), checked without importing transformers."""
    return type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers.")


def out_features(linear: nn.Module) -> int:
    """Output features of an ``nn.Linear`` or a ``Conv1D``."""
    return linear.nf if is_conv1d(linear) else linear.out_features


class FusedLinear(nn.Module):
    """A fused linear layer (an ``nn.Linear``, or a ``Conv1D``) as ``parts``: one layer of its kind per block of
    output features, ``sizes`` wide. ``dim``: the weight's dimension of output features (0; a Conv1D's: 1)."""

    def __init__(self, linear: nn.Module, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.dim = 1 if is_conv1d(linear) else 0
        self.in_features, self.out_features, self.sizes = linear.weight.shape[1 - self.dim], out_features(linear), \
            tuple(sizes)
        if sum(sizes) != self.out_features:
            raise ValueError(f"parts {sizes} do not add up to the {self.out_features} output features")
        w, b = linear.weight, linear.bias
        self.parts = nn.ModuleList()
        start = 0
        for n in sizes:
            part = self._part(linear, n)
            with torch.no_grad():
                if w.device.type != "meta":
                    part.weight.copy_(w.narrow(self.dim, start, n))
                    if b is not None:
                        part.bias.copy_(b[start:start + n])
            for t in part.parameters():
                t.requires_grad_(w.requires_grad)
            self.parts.append(part)
            start += n
        self.register_state_dict_post_hook(_fused_state)
        self.register_load_state_dict_pre_hook(_split_state)

    def _part(self, linear: nn.Module, n: int) -> nn.Module:
        """A layer of ``linear``'s kind, device and dtype with ``n`` output features."""
        w = linear.weight
        if not self.dim:
            return nn.Linear(self.in_features, n, bias=linear.bias is not None, device=w.device, dtype=w.dtype)
        with torch.device(w.device):
            return type(linear)(n, self.in_features).to(w.dtype)  # Conv1D(nf, nx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


def qkv_sizes(attn: nn.Module, cfg) -> tuple[int, ...]:
    """Q, K and V widths of an attention's fused projection (its ``head_dim``; the config's head counts)."""
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return cfg.num_attention_heads * attn.head_dim, kv * attn.head_dim, kv * attn.head_dim


# How a fused projection splits, by the layout name the family tables use (autopar.models.hf_llama.FUSED):
# (parent module, the fused linear, the model config) -> part widths
LAYOUTS = {
    "qkv": lambda parent, linear, cfg: qkv_sizes(parent, cfg),
    "halves": lambda parent, linear, cfg: (out_features(linear) // 2,) * 2,
    "thirds": lambda parent, linear, cfg: (out_features(linear) // 3,) * 3,  # GPT-2's c_attn: Q, K, V alike
    # a multi-query QKV (GPT-BigCode's c_attn, Falcon-7B's query_key_value): every query head, then one K and one V
    "query_then_kv": lambda parent, linear, cfg: (out_features(linear) - 2 * parent.head_dim,) + (parent.head_dim,) * 2,
}


def split_fused(layer: nn.Module, fused: dict[str, str], cfg) -> None:
    """Replace each fused projection ``fused`` names in ``layer`` (path -> layout of ``LAYOUTS``) by a
    ``FusedLinear``, in place; one already split is left as it is (a model viewed twice)."""
    for path, layout in fused.items():
        parent_path, _, attr = path.rpartition(".")
        parent = layer.get_submodule(parent_path)
        linear = getattr(parent, attr)
        if isinstance(linear, nn.Linear) or is_conv1d(linear):
            setattr(parent, attr, FusedLinear(linear, LAYOUTS[layout](parent, linear, cfg)))


def _dim(module: FusedLinear, kind: str) -> int:
    return module.dim if kind == "weight" else 0


def _fused_state(module: FusedLinear, state_dict: dict, prefix: str, _metadata) -> None:
    """State-dict hook: the parts' tensors as the one fused tensor, under its own name. Left as parts once they are
    DTensors (a wrapped unit: joining them would be a collective on one rank's call)."""
    for kind in ("weight", "bias"):
        keys = [f"{prefix}parts.{i}.{kind}" for i in range(len(module.parts))]
        if all(k in state_dict for k in keys) and not any(isinstance(state_dict[k], DTensor) for k in keys):
            state_dict[f"{prefix}{kind}"] = torch.cat([state_dict.pop(k) for k in keys], _dim(module, kind)).detach()


def _split_state(module: FusedLinear, state_dict: dict, prefix: str, *_args) -> None:
    """Load hook: a fused tensor given under its own name goes to the parts, block by block."""
    for kind in ("weight", "bias"):
        fused = state_dict.pop(f"{prefix}{kind}", None)
        if fused is not None:
            start = 0
            for i, n in enumerate(module.sizes):
                state_dict[f"{prefix}parts.{i}.{kind}"] = fused.narrow(_dim(module, kind), start, n)
                start += n


def part_blocks(view: nn.Module, model: nn.Module) -> dict[str, tuple[str, int, int]]:
    """Each parameter of ``view`` that is a part of one of ``model``'s ``FusedLinear`` modules, by its name in
    ``view`` -> (the fused tensor's name in ``model``'s state dict, the dimension the parts are stacked along there,
    the part's first index along it)."""
    names = {id(p): n for n, p in view.named_parameters()}
    out: dict[str, tuple[str, int, int]] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FusedLinear):
            start = 0
            for part, n in zip(mod.parts, mod.sizes):
                for kind, p in part.named_parameters(recurse=False):
                    if id(p) in names:
                        out[names[id(p)]] = (f"{name}.{kind}", _dim(mod, kind), start)
                start += n
    return out
