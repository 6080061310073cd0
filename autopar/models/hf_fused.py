"""Fused projections held as their parts, so tensor parallel splits each part by heads or features.

Phi-3 (and Phi-4, the same architecture) computes Q, K and V with one ``qkv_proj`` and its MLP's gate and up
halves with one ``gate_up_proj``; GLM and GLM-4 fuse the MLP's the same way. A plain column split of such a weight
would give rank 0 all of Q and rank 1 the keys and values (or the gate and the up half): the rows each rank needs
are a block of every part, which a DTensor expresses only with a strided placement that torch's checkpointing
refuses. So the view replaces each fused ``nn.Linear`` by a ``FusedLinear`` of one ``nn.Linear`` per part (rows
``[offsets[i], offsets[i + 1])`` of the weight and bias) whose output is the concatenation of theirs: with every
part column-parallel, a rank's output is its share of each part, in the order the module's forward splits it.

The split is structural (the same for every plan, so autopar checkpoints reshard across TP degrees) and is made in
the transformers model itself, whose modules the view shares. Its checkpoints keep the fused names:
``fused_parts`` says which block of which saved tensor each part is (``HFSource``; ``load_hf`` and ``save_hf`` read
and write the blocks in place, autopar.runtime.row_blocks).
"""

from __future__ import annotations

import torch
from torch import nn


class FusedLinear(nn.Module):
    """A fused ``nn.Linear`` as ``parts`` (one ``nn.Linear`` per block of output rows, ``sizes`` wide)."""

    def __init__(self, linear: nn.Linear, sizes: tuple[int, ...]) -> None:
        super().__init__()
        if sum(sizes) != linear.out_features:
            raise ValueError(f"parts {sizes} do not add up to the {linear.out_features} output features")
        self.in_features, self.out_features, self.sizes = linear.in_features, linear.out_features, tuple(sizes)
        w, b = linear.weight, linear.bias
        self.parts = nn.ModuleList()
        start = 0
        for n in sizes:
            part = nn.Linear(self.in_features, n, bias=b is not None, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                if w.device.type != "meta":
                    part.weight.copy_(w[start:start + n])
                    if b is not None:
                        part.bias.copy_(b[start:start + n])
            for t in part.parameters():
                t.requires_grad_(w.requires_grad)
            self.parts.append(part)
            start += n

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
    "halves": lambda parent, linear, cfg: (linear.out_features // 2, linear.out_features // 2),
}


def split_fused(layer: nn.Module, fused: dict[str, str], cfg) -> None:
    """Replace each fused projection ``fused`` names in ``layer`` (path -> layout of ``LAYOUTS``) by a
    ``FusedLinear``, in place; one already split is left as it is (a model viewed twice)."""
    for path, layout in fused.items():
        parent_path, _, attr = path.rpartition(".")
        parent = layer.get_submodule(parent_path)
        linear = getattr(parent, attr)
        if isinstance(linear, nn.Linear):
            setattr(parent, attr, FusedLinear(linear, LAYOUTS[layout](parent, linear, cfg)))


def fused_parts(model: nn.Module) -> dict[str, tuple[str, int]]:
    """Every ``FusedLinear`` tensor of ``model``'s state dict -> (the fused tensor's name, its first row there)."""
    out: dict[str, tuple[str, int]] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FusedLinear):
            start = 0
            for i, n in enumerate(mod.sizes):
                for kind in ("weight", "bias"):
                    out[f"{name}.parts.{i}.{kind}"] = (f"{name}.{kind}", start)
                start += n
    return out


def fused_shapes(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], parts: dict[str, tuple[str, int]]
                 ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``shapes`` (state-dict name -> (shape, dtype)) with the parts ``parts`` names replaced by their fused tensor,
    in the place of its first part (the order ``save_pretrained`` writes)."""
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for key, (shape, dtype) in shapes.items():
        if key not in parts:
            out[key] = (shape, dtype)
            continue
        fused = parts[key][0]
        rows = out[fused][0][0] if fused in out else 0
        out[fused] = ((rows + shape[0], *shape[1:]), dtype)
    return out
