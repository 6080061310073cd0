"""What ``save_pretrained`` writes for a transformers model, tensor by tensor, and which block of which model tensor
each one is: read by ``ParallelModel.load_hf`` and written by ``save_hf`` (autopar.runtime.hf_checkpoint, hf_save).

transformers 5 converts some checkpoint tensors on load (MoE experts stored one per expert are packed, Mixtral's
``block_sparse_moe`` becomes ``mlp``, GPT-NeoX's ``embed_out`` becomes ``lm_head``) and reverts the conversion on
save. ``saved_pieces`` runs that revert (``HFSource.revert``) on shape-only stand-ins whose values number their
elements, one model tensor at a time, and reads from the numbers where each saved tensor came from: the whole
tensor, rows of it, or rows of one expert of a packed experts tensor. A tied tensor is listed once, under the first
of its names (the one ``save_pretrained`` keeps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autopar.errors import AutoparError


@dataclass(frozen=True)
class SavedPiece:
    """A saved tensor: rows ``rows`` of the model's state-dict tensor ``source`` (of its expert ``expert``, the
    index along dim 0 of a packed experts tensor, when not None); ``shape`` and ``dtype`` as saved."""

    source: str
    expert: int | None
    rows: tuple[int, int]
    shape: tuple[int, ...]
    dtype: torch.dtype


def _stand_in(shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor's first dimension (and the second, for a packed experts tensor), numbered element by element."""
    kept = shape[:2] if len(shape) >= 3 else shape[:1]
    dims = kept + (1,) * (len(shape) - len(kept))
    return torch.arange(int(torch.Size(dims).numel()), dtype=torch.int64).reshape(dims)


def _decode(name: str, source: str, shape: tuple[int, ...], dtype: torch.dtype, stand: torch.Tensor,
            saved: torch.Tensor) -> SavedPiece:
    """Which block of ``source`` the saved tensor ``name`` is, from the numbers its stand-in carries."""
    if saved.shape == stand.shape and torch.equal(saved, stand):
        return SavedPiece(source, None, (0, shape[0] if shape else 1), shape, dtype)
    flat, n = saved.reshape(-1), saved.numel()
    first = int(flat[0]) if n else 0
    contiguous = n > 0 and saved.dim() >= 1 and saved.shape[0] == n and torch.equal(
        flat, torch.arange(first, first + n, dtype=flat.dtype))
    if contiguous and stand.dim() >= 3 and first % shape[1] + n <= shape[1]:
        r0 = first % shape[1]
        return SavedPiece(source, first // shape[1], (r0, r0 + n), (n, *shape[2:]), dtype)
    if contiguous and stand.dim() in (1, 2):
        return SavedPiece(source, None, (first, first + n), (n, *shape[1:]), dtype)
    raise AutoparError("hf checkpoint", f"transformers saves {source} {tuple(shape)} as {name}, which is not a block "
                       "of its rows: autopar reads and writes checkpoints of such a model only whole",
                       "use ParallelModel.full_state_dict with the model's own from_pretrained / save_pretrained")


def by_source(pieces: dict[str, SavedPiece]) -> dict[str, list[tuple[str, SavedPiece]]]:
    """``pieces`` grouped by the model tensor each comes from: source -> [(saved name, piece)], in saved order."""
    out: dict[str, list[tuple[str, SavedPiece]]] = {}
    for name, piece in pieces.items():
        out.setdefault(piece.source, []).append((name, piece))
    return out


def saved_pieces(hf) -> dict[str, SavedPiece]:
    """Every tensor ``save_pretrained`` writes for the model of ``hf`` (an ``HFSource``), by its saved name."""
    tied_copies = {n for names in hf.names.values() for n in names[1:]}
    out: dict[str, SavedPiece] = {}
    for key, (shape, dtype) in hf.shapes.items():
        if key in tied_copies:
            continue
        stand = _stand_in(shape)
        for name, saved in hf.revert({key: stand}).items():
            out[name] = _decode(name, key, shape, dtype, stand, saved)
    return out
