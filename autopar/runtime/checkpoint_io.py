"""``ParallelModel.save`` / ``load``: the training state as one torch.distributed.checkpoint, any plan to any plan.

The checkpoint holds *logical* tensors keyed by fully qualified name, whatever plan wrote them:

- ``model.<unit>.<fqn>``: every parameter and persistent buffer;
- ``optim.<unit>.<fqn>.<key>``: the optimizer's per-parameter state (AdamW's ``exp_avg``,
  ``exp_avg_sq``: the parameter's shape; ``step``: a scalar), as if one optimizer had run over the
  unsharded model;
- ``autopar.calls`` / ``autopar.optimizer_steps`` / ``autopar.skipped_steps``: the step counters;
  ``autopar.optimizer``: the optimizer's class (``load`` refuses another one);
  ``rng.rank<r>.cpu`` (and ``.cuda``): each rank's RNG state.

Each rank offers its own region: TP and FSDP parameters as their DTensors, ZeRO-1/2 optimizer state
(which lives on flat slices) all-gathered in the unit's DP group and cut into per-parameter views
laid out like the parameters. Only a unit's first placement (pipeline 0) writes it; DP copies
offer the same regions and DCP keeps one. ``load`` asks each rank's own regions under *its* plan
(DCP reads exactly those from the files), so dp / tp / pp / ZeRO and the world size may all differ
between save and load. RNG: a rank restores the state its own rank number saved, or rank 0's
when the saving run had fewer ranks.

Only element-wise optimizers can be resharded this way (every state tensor has its parameter's
shape, or is a scalar): others are refused on every rank with one line.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError


def _as_logical(local: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``local`` (laid out like this rank's part of parameter ``p``) as the logical tensor DCP sees."""
    if isinstance(p, DTensor):
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())
    return local


def persistent_buffers(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    out = []
    for mname, m in module.named_modules():
        for bname, b in m.named_buffers(recurse=False):
            if b is not None and bname not in m._non_persistent_buffers_set:
                out.append((f"{mname}.{bname}" if mname else bname, b))
    return out


def param_names(st) -> list[str]:
    return [fqn for fqn, _ in st.unit.module.named_parameters()]


def _check_elementwise(pm) -> None:
    """Collective: refuse, on every rank, an optimizer whose state is not per-element (or scalar)."""
    problem = ""
    for st in pm._states:
        targets = [st.shard.master] if st.shard is not None else st.proxies
        for t in targets:
            for key, v in pm.optimizer.state.get(t, {}).items():
                if isinstance(v, torch.Tensor) and v.dim() and v.shape != t.shape and not problem:
                    problem = (f"{type(pm.optimizer).__name__} keeps state {key!r} of shape {tuple(v.shape)} for "
                               f"a tensor of shape {tuple(t.shape)}")
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, problem)
    first = next((f for f in found if f), "")
    if first:
        raise AutoparError("optimizer", f"{first}: its state is not element-wise, so it cannot be resharded",
                           "save/load support element-wise optimizers (SGD, Adam, AdamW, ...)")


def _owner(pm, st) -> bool:
    return pm._places[st.unit.name][0].pipeline == st.place.pipeline


def _optimizer_views(pm, st) -> list[dict[str, object]]:
    """Per parameter of the unit: its optimizer state as local tensors laid out like the parameter."""
    params = st.sync.params
    if st.shard is None:
        return [dict(pm.optimizer.state.get(proxy, {})) for proxy in st.proxies]
    state = pm.optimizer.state.get(st.shard.master, {})
    out: list[dict[str, object]] = [{} for _ in params]
    for key in sorted(state):
        v = state[key]
        if isinstance(v, torch.Tensor) and v.shape == st.shard.master.shape:
            full = torch.empty(st.shard.size * st.shard.world, dtype=v.dtype, device=v.device)
            dist.all_gather_into_tensor(full, v.contiguous(), group=st.shard.group)
            offset = 0
            for i, t in enumerate(st.shard.tensors):
                out[i][key] = full[offset:offset + t.numel()].view_as(t)
                offset += t.numel()
        else:
            for d in out:
                d[key] = v
    return out


def save_checkpoint(pm, path: str | os.PathLike) -> None:
    """Collective: write ``pm``'s parameters, buffers, optimizer state, counters and RNG to ``path``."""
    _check_elementwise(pm)
    sd: dict[str, object] = {}
    for st in pm._states:
        if not _owner(pm, st):
            continue
        name = st.unit.name
        views = _optimizer_views(pm, st)
        for fqn, p, opt in zip(param_names(st), st.sync.params, views):
            sd[f"model.{name}.{fqn}"] = p.detach()
            for key, v in opt.items():
                logical = (_as_logical(v, p) if isinstance(v, torch.Tensor) and v.dim() else v)
                sd[f"optim.{name}.{fqn}.{key}"] = logical
        for fqn, b in persistent_buffers(st.unit.module):
            sd[f"model.{name}.{fqn}"] = b
    sd["autopar.optimizer"] = type(pm.optimizer).__name__
    sd["autopar.calls"] = pm._calls
    sd["autopar.optimizer_steps"] = pm.optimizer_steps
    sd["autopar.skipped_steps"] = list(pm.skipped_steps)
    sd[f"rng.rank{pm.rank}.cpu"] = torch.get_rng_state()
    if pm.device.type == "cuda":
        sd[f"rng.rank{pm.rank}.cuda"] = torch.cuda.get_rng_state(pm.device)
    dcp.save(sd, checkpoint_id=os.fspath(path))


def agree_missing(problem: str, field: str = "checkpoint",
                  fix: str = "load a checkpoint of the same model (unit and parameter names)") -> None:
    """Collective: raise the first rank's problem on every rank (nothing when no rank has one)."""
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, problem)
    first = next((f for f in found if f), "")
    if first:
        raise AutoparError(field, first, fix)


def load_checkpoint(pm, path: str | os.PathLike) -> None:
    """Collective: load a checkpoint ``save`` wrote (under any plan) into ``pm``, resharded to its plan."""
    path = os.fspath(path)
    try:
        meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    except (FileNotFoundError, OSError) as e:
        raise AutoparError("checkpoint", f"cannot read {path}: {e}",
                           "pass a directory ParallelModel.save wrote") from None
    kind: dict[str, object] = {"autopar.optimizer": None}
    if "autopar.optimizer" in meta:  # read first: a mismatch is refused before anything is overwritten
        dcp.load(kind, checkpoint_id=path)
        if kind["autopar.optimizer"] != type(pm.optimizer).__name__:
            raise AutoparError("checkpoint", f"{path} holds {kind['autopar.optimizer']} state but this model's "
                               f"optimizer is {type(pm.optimizer).__name__}",
                               "build the same optimizer as the run that saved it")
    sd: dict[str, object] = {}
    optim: list[tuple[object, list]] = []  # (unit state, [(state key, checkpoint key)]) per parameter
    saved_states: dict[str, list[str]] = {}  # "optim.<unit>.<fqn>" -> its checkpoint keys
    for k in sorted(meta):
        if k.startswith("optim."):
            saved_states.setdefault(k.rsplit(".", 1)[0], []).append(k)
    problem = ""
    for st in pm._states:
        name = st.unit.name
        for fqn, p in zip(param_names(st), st.sync.params):
            key = f"model.{name}.{fqn}"
            md = meta.get(key)
            if not isinstance(md, TensorStorageMetadata) or tuple(md.size) != tuple(p.shape):
                problem = problem or (f"{path} has no parameter {name}.{fqn} of shape {tuple(p.shape)}"
                                      + (f" (it has {tuple(md.size)})" if md is not None and
                                         isinstance(md, TensorStorageMetadata) else ""))
                continue
            sd[key] = p.detach()
            targets = []
            prefix = f"optim.{name}.{fqn}."
            for k in saved_states.get(prefix[:-1], []):
                md_k = meta[k]
                if isinstance(md_k, BytesStorageMetadata):
                    sd[k] = None
                elif tuple(md_k.size) == tuple(p.shape) and len(md_k.size):
                    sd[k] = torch.zeros_like(p.detach(), dtype=md_k.properties.dtype)
                else:
                    sd[k] = torch.zeros(md_k.size, dtype=md_k.properties.dtype)
                targets.append((k[len(prefix):], k))
            optim.append((st, targets))
        for fqn, b in persistent_buffers(st.unit.module):
            if f"model.{name}.{fqn}" not in meta:
                problem = problem or f"{path} has no buffer {name}.{fqn}"
                continue
            sd[f"model.{name}.{fqn}"] = b
    agree_missing(problem)
    for k in ("autopar.calls", "autopar.optimizer_steps", "autopar.skipped_steps"):
        sd[k] = None
    rng = f"rng.rank{pm.rank}" if f"rng.rank{pm.rank}.cpu" in meta else "rng.rank0"
    sd[f"{rng}.cpu"] = torch.get_rng_state()
    cuda_rng = pm.device.type == "cuda" and f"{rng}.cuda" in meta
    if cuda_rng:
        sd[f"{rng}.cuda"] = torch.cuda.get_rng_state(pm.device)
    dcp.load(sd, checkpoint_id=path)
    _install(pm, sd, optim)
    pm._calls, pm.optimizer_steps = int(sd["autopar.calls"]), int(sd["autopar.optimizer_steps"])
    pm.skipped_steps = list(sd["autopar.skipped_steps"])
    torch.set_rng_state(sd[f"{rng}.cpu"])
    if cuda_rng:
        torch.cuda.set_rng_state(sd[f"{rng}.cuda"], pm.device)


@torch.no_grad()
def refresh_master(shard) -> None:
    """Set a ZeRO-1/2 shard's master slice from the parameters it covers (after they were loaded)."""
    shard.master.copy_(shard._flatten(shard.tensors)[shard.index * shard.size:(shard.index + 1) * shard.size])


def _local(t: object) -> object:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def _install(pm, sd: dict, optim: list) -> None:
    """Replace the optimizer's state by the loaded one (ZeRO-1/2: this rank's flat slice)."""
    pm.optimizer.state.clear()  # a tensor the checkpoint has no state for starts fresh, as after wrap
    by_state: dict[int, list] = {}
    for st, targets in optim:
        by_state.setdefault(id(st), [st, []])[1].append({key: _local(sd[k]) for key, k in targets})
    for st, per_param in by_state.values():
        if st.shard is not None:
            shard = st.shard
            refresh_master(shard)
            if per_param and per_param[0]:
                state = {}
                for key, v in per_param[0].items():
                    if isinstance(v, torch.Tensor) and v.dim():
                        flat = shard._flatten([d[key] for d in per_param])
                        state[key] = flat[shard.index * shard.size:(shard.index + 1) * shard.size].clone()
                    else:
                        state[key] = v
                pm.optimizer.state[shard.master] = state
            continue
        for proxy, d in zip(st.proxies, per_param):
            if d:
                pm.optimizer.state[proxy] = {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                             for k, v in d.items()}
