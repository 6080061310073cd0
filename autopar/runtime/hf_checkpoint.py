"""``ParallelModel.load_hf``: a Hugging Face checkpoint (a ``save_pretrained`` folder of safetensors files) read
into a wrapped transformers model, each rank reading only the pieces it holds.

The model must come from a transformers model (raw, or ``autopar.models.from_transformers``): its units view
records each tensor's name in the HF state dict (``hf_source.names``), and ``wrap`` keeps it (``pm.hf``). Each rank offers its
own parameters and persistent buffers (TP and FSDP shards as their DTensors, expert-parallel shards, whole tensors)
under those names, and ``torch.distributed.checkpoint`` with its ``HuggingFaceStorageReader`` reads exactly those
regions from the files, converting dtypes. A tensor the checkpoint names as ``save_pretrained`` writes it rather
than as the module does (GPT-NeoX's ``embed_out``, Mixtral's ``block_sparse_moe``: autopar.models.hf_saved) is read
under that name; packed MoE experts, which transformers saves one tensor per expert, are assembled from exactly
the experts this rank holds (``hf_experts``); a fused projection held as parts (autopar.models.hf_fused) is read
block by block into them (``tensor_blocks``). A tied tensor the checkpoint holds once (``lm_head.weight`` under
``tie_word_embeddings``) is read into every unit that keeps a copy of it. ZeRO-1/2's master shards are then
refreshed from the loaded parameters. This is how a model built on the meta device starts from pretrained
weights without any rank holding the whole model.

Only before training: the optimizer's state would not match the new weights. A missing tensor or a shape that
differs is refused on every rank with one line naming it, before anything is overwritten.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from autopar.errors import AutoparError
from autopar.models.hf_saved import by_source, saved_pieces
from autopar.runtime.checkpoint_io import agree_missing, param_names, persistent_buffers, refresh_master
from autopar.runtime.hf_experts import expert_sources, load_packed_experts
from autopar.runtime.tensor_blocks import TensorBlocks, local_block


def hf_tensors(pm) -> list[tuple[str, str, tuple[str, ...], torch.Tensor]]:
    """(unit, this rank's name of the tensor, its names in the HF state dict, the tensor) for every parameter and
    persistent buffer this rank holds (TP / FSDP shards as their DTensors)."""
    out = []
    for st in pm._states:
        name = st.unit.name
        out += [(name, f"{name}.{fqn}", p.detach()) for fqn, p in zip(param_names(st), st.sync.params)]
        out += [(name, f"{name}.{fqn}", b) for fqn, b in persistent_buffers(st.unit.module)]
    return [(u, n, pm.hf.names.get(n, ()), t) for u, n, t in out]


def fused_parts_here(pm, tensors: list, units: set[str] | None = None
                     ) -> dict[str, tuple[str, int, list[tuple[int, torch.Tensor]]]]:
    """Each fused tensor this rank holds parts of (autopar.models.hf_fused; in ``units`` only, when given) -> (the
    unit holding it, the dimension its parts are stacked along, its parts in order: the part's first index along
    it, the part as held here). ``tensors``: ``hf_tensors(pm)``."""
    out: dict[str, tuple[str, int, list[tuple[int, torch.Tensor]]]] = {}
    for unit, mine, _, t in tensors:
        fused = pm.hf.blocks.get(mine)
        if fused is not None and (units is None or unit in units):
            out.setdefault(fused[0], (unit, fused[1], []))[2].append((fused[2], t))
    return {key: (unit, dim, sorted(parts, key=lambda p: p[0])) for key, (unit, dim, parts) in sorted(out.items())}


def fused_saved_names(pm, saved: dict, keys) -> tuple[dict[str, str], str]:
    """Fused tensor -> the name save_pretrained writes it under (``saved``: ``hf_saved.by_source`` of its pieces),
    and the problem to refuse on every rank (``agree_missing``): one it writes in pieces, handled only whole."""
    out, problem = {}, ""
    for key in keys:
        rows = pm.hf.shapes[key][0][0]
        name = next((n for n, p in saved.get(key, []) if p.expert is None and p.rows == (0, rows)), None)
        if name is None:
            problem = problem or f"transformers saves the fused tensor {key} in pieces, which autopar handles whole"
        else:
            out[key] = name
    return out, problem


def _fused_load_tensors(pm, saved: dict, tensors: list) -> tuple[dict[str, TensorBlocks], str]:
    """This rank's blocks of each fused tensor (views of its parts' local shards), under their saved names."""
    parts = fused_parts_here(pm, tensors)
    names, problem = fused_saved_names(pm, saved, parts)
    out = {}
    for key, name in names.items():
        _, dim, held = parts[key]
        blocks = []
        for start, t in held:
            local, offsets = local_block(t)
            if local.numel():  # (an uneven ZeRO-3 split may leave a rank nothing of a part)
                blocks.append((tuple(o + start if d == dim else o for d, o in enumerate(offsets)), local))
        if blocks:
            out[name] = TensorBlocks(pm.hf.shapes[key][0], blocks)
    return out, problem


def load_hf_checkpoint(pm, path: str | os.PathLike) -> None:
    """Collective: read the HF safetensors checkpoint in folder ``path`` into ``pm`` (module docstring)."""
    path = os.fspath(path)
    if pm.hf is None:
        raise AutoparError("load_hf", "the wrapped model is not a transformers model, so its tensors have no "
                           "Hugging Face names", "wrap the transformers model (or from_transformers(model)), or "
                           "use ParallelModel.load for an autopar checkpoint")
    if pm.optimizer_steps:  # (pending accumulated gradients: ParallelModel.load_hf refuses them first)
        raise AutoparError("load_hf", f"{pm.optimizer_steps} optimizer step(s) have run: the optimizer's state "
                           "belongs to the weights they trained", "load pretrained weights right after wrap")
    try:
        reader = dcp.HuggingFaceStorageReader(path)
        have = reader.read_metadata().state_dict_metadata
    except (FileNotFoundError, OSError, ValueError) as e:
        raise AutoparError("load_hf", f"cannot read a Hugging Face checkpoint in {path}: {e}",
                           "pass the folder save_pretrained wrote (its *.safetensors files)") from None
    saved = by_source(saved_pieces(pm.hf))  # model tensor -> what save_pretrained writes of it
    rounds: list[dict[str, torch.Tensor]] = [{}]
    packed: list[tuple[str, torch.Tensor, list[list[str]]]] = []  # (HF name, tensor, per-expert sources)
    tensors = hf_tensors(pm)
    fused, problem = _fused_load_tensors(pm, saved, tensors)
    for key, t in fused.items():
        md = have.get(key)
        if not isinstance(md, TensorStorageMetadata) or tuple(md.size) != tuple(t.shape):
            problem = problem or f"{path} has no tensor {key} of shape {tuple(t.shape)}"
        rounds[0][key] = t
    for _, mine, names, t in tensors:
        if mine in pm.hf.blocks:
            continue  # read above, with the other parts of its fused tensor
        pieces = saved.get(names[0], []) if names else []
        whole = [n for n, p in pieces if p.expert is None and tuple(p.shape) == tuple(t.shape)]
        key = next((n for n in (*names, *whole) if n in have), None)  # as the module or save_pretrained names it
        sources = expert_sources(pieces, t.shape[0], have) if key is None else None
        if sources is not None:  # a packed experts tensor the checkpoint holds one piece per expert
            packed.append((names[0], t, sources))
            continue
        md = have.get(key)
        if not isinstance(md, TensorStorageMetadata) or tuple(md.size) != tuple(t.shape):
            found = f" (it has {tuple(md.size)})" if isinstance(md, TensorStorageMetadata) else ""
            problem = problem or (f"{path} has no tensor {' or '.join(names) or mine} of shape "
                                  f"{tuple(t.shape)}{found}")
            continue
        slot = next(r for r in rounds + [{}] if key not in r)  # a tied tensor twice on this rank: another round
        if slot not in rounds:
            rounds.append(slot)
        slot[key] = t
    agree_missing(problem, "load_hf", "load a checkpoint of this model (save_pretrained of the same config)")
    count = torch.tensor([len(rounds)])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)  # dcp.load is collective: every rank takes as many rounds
    for i in range(int(count.item())):
        dcp.load(rounds[i] if i < len(rounds) else {}, storage_reader=dcp.HuggingFaceStorageReader(path))
    load_packed_experts(path, packed)
    for st in pm._states:
        if st.shard is not None:
            refresh_master(st.shard)
