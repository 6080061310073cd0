"""Packed MoE experts from a Hugging Face checkpoint that stores them one tensor per expert.

transformers 5 keeps a MoE layer's experts packed (``experts.gate_up_proj [E, 2F, H]``, ``experts.down_proj
[E, H, F]``) but ``save_pretrained`` writes them as the released checkpoints do, one module per expert (Qwen-MoE's
``gate_proj`` / ``up_proj`` / ``down_proj``, Mixtral's ``w1`` / ``w3`` / ``w2`` under ``block_sparse_moe``), and
packs them on load: ``gate_up_proj[e] = cat(gate_e, up_e)``, ``down_proj[e] = down_e``. Which saved tensor is
which block of which expert is transformers' own knowledge, read by autopar.models.hf_saved; here each rank reads
only the experts of its own shard (expert parallel and ZeRO-3 split the packed tensors on the expert dimension)
with ``safetensors``, in the parameter's dtype.
"""

from __future__ import annotations

import contextlib
import json
import os

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autopar.errors import AutoparError


def expert_sources(pieces: list, experts: int, have) -> list[list[str]] | None:
    """Per expert of a packed tensor of ``experts`` experts, the checkpoint names whose concatenation (along the
    expert's first dimension) it is, from ``pieces``: (saved name, ``SavedPiece``) pairs of what save_pretrained
    writes of it (autopar.models.hf_saved); None unless every one is in the checkpoint ``have``."""
    per: list[list[tuple[int, str]]] = [[] for _ in range(experts)]
    for name, piece in pieces:
        if piece.expert is None or not 0 <= piece.expert < experts:
            return None
        per[piece.expert].append((piece.rows[0], name))
    names = [[n for _, n in sorted(parts)] for parts in per]
    return names if all(names) and all(n in have for parts in names for n in parts) else None


def _files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file in checkpoint folder ``path`` (its index, or its one file)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    from safetensors import safe_open

    single = os.path.join(path, "model.safetensors")
    with safe_open(single, "pt") as f:
        return dict.fromkeys(f.keys(), single)


@torch.no_grad()
def load_packed_experts(path: str, packed: list[tuple[str, torch.Tensor, list[list[str]]]]) -> None:
    """Fill each packed tensor's local experts (its rows along dim 0 on this rank) from their per-expert sources."""
    if not packed:
        return
    from safetensors import safe_open

    files = _files(path)
    with contextlib.ExitStack() as opened:
        handles = {f: opened.enter_context(safe_open(f, "pt")) for f in {files[k] for _, _, s in packed
                                                                          for per in s for k in per}}
        for _, t, sources in packed:
            _fill(t, sources, files, handles)


def local_rows(t: torch.Tensor, field: str) -> tuple[torch.Tensor, int]:
    """(this rank's rows of ``t``, the index of the first): ``t`` whole, or a DTensor split on dim 0 only (expert
    parallel, ZeRO-3); one split elsewhere is refused naming ``field``, as checkpoints hold such tensors in rows."""
    if not isinstance(t, DTensor):
        return t, 0
    local = t.to_local()
    if tuple(local.shape[1:]) != tuple(t.shape[1:]):
        raise AutoparError(field, f"a tensor of shape {tuple(t.shape)} is split on a dimension other than its first "
                           "here, which the checkpoint holds in blocks of rows",
                           "write the full state dict on one rank (ParallelModel.full_state_dict) and use "
                           "save_pretrained / from_pretrained")
    return local, compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)[1][0]


def _fill(t: torch.Tensor, sources: list[list[str]], files: dict[str, str], handles: dict) -> None:
    """This rank's rows (experts) of packed tensor ``t``, each the concatenation of its sources."""
    local, first = local_rows(t, "load_hf")
    for row in range(local.shape[0]):
        parts = [handles[files[key]].get_tensor(key) for key in sources[first + row]]
        local[row].copy_(torch.cat(parts, dim=0).to(local.dtype))
