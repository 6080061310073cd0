"""``ParallelModel.save_hf``: the wrapped transformers model written as a ``save_pretrained`` folder (``config.json``,
safetensors files and their ``model.safetensors.index.json``) that ``from_pretrained`` loads, each rank writing only
the pieces it holds, so no rank ever holds the whole model.

What is written is what ``save_pretrained`` of the unwrapped model writes (autopar.models.hf_saved: the names and
splits of transformers' own inverse of its load-time conversions, each saved tensor a block of one model tensor:
the whole, rows of it, or rows of one packed expert), a tied tensor once under its first name; a fused projection
the model holds as parts (autopar.models.hf_fused) as the one tensor it was, each rank writing a contiguous slice
(``_fused_slices``). Each rank offers its
blocks of the tensors it holds. A tensor is offered by the first unit holding it (a tied copy is not offered
twice) and only by the ranks of its first placement's pipeline, as ``full_state_dict`` takes it, so every saved
tensor is written in one layout. ``torch.distributed.checkpoint``'s ``HuggingFaceStorageWriter`` writes each
rank's pieces and consolidates them into files of at most ``MAX_FILE_BYTES`` (transformers' default).

The folder appears whole or not at all: everything is written to ``<path>.autopar-partial`` and renamed at the end.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.models.hf_saved import SavedPiece, by_source, saved_pieces
from autopar.runtime.checkpoint_io import agree_missing
from autopar.runtime.hf_checkpoint import fused_parts_here, fused_saved_names, hf_tensors
from autopar.runtime.hf_experts import local_rows
from autopar.runtime.tensor_blocks import TensorBlocks

MAX_FILE_BYTES = 5 * 10**9  # transformers' save_pretrained max_shard_size="5GB"
_FIX = "write the full state dict on one rank (ParallelModel.full_state_dict) and call save_pretrained"


def _offering(pm) -> dict[str, str]:
    """Model tensor -> the first unit tensor holding it (the one that writes it: a tied copy is not offered twice;
    a fused tensor held as parts, its first part)."""
    out: dict[str, str] = {}
    for view_name, names in pm.hf.names.items():
        if names:
            out.setdefault(names[0], view_name)
    for view_name, (fused, _, _) in pm.hf.blocks.items():
        out.setdefault(fused, view_name)
    return out


def _offered(pm, pieces: dict[str, SavedPiece], offering: dict[str, str]) -> tuple[dict[str, torch.Tensor], str]:
    """The saved tensors (or DTensor shards of them, or row blocks of fused ones) this rank writes, and the problem
    to refuse on every rank (``hf_checkpoint.fused_saved_names``)."""
    grouped = by_source(pieces)
    out: dict[str, torch.Tensor] = {}
    fused_units = set()  # the units writing a fused tensor: those holding its first part
    tensors = hf_tensors(pm)
    for unit, mine, names, t in tensors:
        if mine in pm.hf.blocks:
            if offering.get(pm.hf.blocks[mine][0]) == mine and pm._places[unit][0].pipeline == pm.pipeline:
                fused_units.add(unit)
            continue
        if not names or offering.get(names[0]) != mine or pm._places[unit][0].pipeline != pm.pipeline:
            continue
        for name, piece in grouped.get(names[0], []):
            whole = piece.expert is None and piece.rows == (0, t.shape[0] if t.dim() else 1)
            if whole:
                out[name] = t
                continue
            local, first = local_rows(t, "save_hf")
            if piece.expert is None:
                if first != 0 or local.shape[0] != t.shape[0]:
                    raise AutoparError("save_hf", f"{names[0]} is split here, and saved in blocks of rows", _FIX)
                out[name] = local[piece.rows[0]:piece.rows[1]]
            elif first <= piece.expert < first + local.shape[0]:
                out[name] = local[piece.expert - first, piece.rows[0]:piece.rows[1]]
    fused, problem = _fused_slices(pm, grouped, tensors, fused_units)
    return {**out, **fused}, problem


def _fused_slices(pm, saved: dict, tensors: list, units: set[str]) -> tuple[dict[str, TensorBlocks], str]:
    """A contiguous slice of rows of each fused tensor of ``units`` per rank holding them (in their first placement):
    the parts gathered whole (a collective over each part's mesh), joined and cut evenly over the placement's
    devices. One block per rank: the safetensors writer keeps one chunk of a tensor per rank and file, where under
    TP a rank holds a block of every part."""
    parts = fused_parts_here(pm, tensors, units)
    names, problem = fused_saved_names(pm, saved, parts)
    out = {}
    for key, name in names.items():
        unit, dim, held = parts[key]
        full = torch.cat([t.full_tensor() if isinstance(t, DTensor) else t for _, t in held], dim)
        devices = pm._places[unit][0].devices
        i, n = devices.index(pm.rank), len(devices)
        a, b = i * full.shape[0] // n, (i + 1) * full.shape[0] // n
        if b > a:
            out[name] = TensorBlocks(tuple(full.shape), [((a,) + (0,) * (full.dim() - 1), full[a:b].clone())])
    return out, problem


def _file_indices(pieces: dict[str, SavedPiece], limit: int) -> dict[str, int]:
    """Saved name -> file number (from 1), in order, a new file whenever the next tensor would pass ``limit``."""
    out, index, size = {}, 1, 0
    for name, piece in pieces.items():
        nbytes = torch.Size(piece.shape).numel() * piece.dtype.itemsize
        if size and size + nbytes > limit:
            index, size = index + 1, 0
        out[name], size = index, size + nbytes
    return out


def save_hf_checkpoint(pm, path: str | os.PathLike, max_file_bytes: int = MAX_FILE_BYTES) -> None:
    """Collective: write ``pm``'s model to folder ``path`` as ``save_pretrained`` would (module docstring)."""
    path = os.fspath(path)
    if pm.hf is None:
        raise AutoparError("save_hf", "the wrapped model is not a transformers model, so its tensors have no "
                           "Hugging Face names", "wrap the transformers model (or from_transformers(model)), or "
                           "use ParallelModel.save for an autopar checkpoint")
    problem = ""
    if os.path.isfile(path) or (os.path.isdir(path) and os.listdir(path)):
        problem = f"{path} exists and is not an empty folder"
    agree_missing(problem, "save_hf", "pass a new folder (save_hf writes a whole save_pretrained folder)")
    pieces, offering = saved_pieces(pm.hf), _offering(pm)
    missing = next((p.source for p in pieces.values() if p.source not in offering), None)
    if missing is not None:
        raise AutoparError("save_hf", f"the model's tensor {missing} is not held by any unit wrap runs", _FIX)
    partial = f"{path.rstrip(os.sep)}.autopar-partial"
    if pm.rank == 0 and os.path.exists(partial):
        shutil.rmtree(partial)  # what an interrupted save left
    dist.barrier()
    writer = dcp.HuggingFaceStorageWriter(partial, fqn_to_index_mapping=_file_indices(pieces, max_file_bytes),
                                          save_distributed=True, enable_consolidation=True)
    offered, problem = _offered(pm, pieces, offering)
    agree_missing(problem, "save_hf", _FIX)
    dcp.save(offered, storage_writer=writer)
    problem = ""
    if pm.rank == 0:
        problem = _finish(pm, pieces, partial, path)
    agree_missing(problem, "save_hf", _FIX)


def _finish(pm, pieces: dict[str, SavedPiece], partial: str, path: str) -> str:
    """Rank 0: drop the per-rank files, add the configs, check the index names every tensor, move into place."""
    try:
        shutil.rmtree(os.path.join(partial, "sharded"), ignore_errors=True)
        with open(os.path.join(partial, "model.safetensors.index.json")) as f:
            written = set(json.load(f)["weight_map"])
        if written != set(pieces):
            return f"the files hold {len(written)} tensors, save_pretrained writes {len(pieces)}"
        pm.hf.config.save_pretrained(partial)
        if pm.hf.generation_config is not None:
            pm.hf.generation_config.save_pretrained(partial)
        if os.path.isdir(path):
            os.rmdir(path)  # checked empty before writing
        os.replace(partial, path)
    except OSError as e:
        return f"cannot write {path}: {e}"
    return ""
