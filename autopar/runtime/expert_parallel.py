"""Expert parallelism of an MoE unit: its experts split over ``ep`` consecutive DP ranks, tokens exchanged all-to-all.

A unit with ``ep`` e (tp 1) on a stage with devices D: DP rank r (its position in D) belongs to EP group
``D[(r // e) * e:(r // e + 1) * e]`` and holds experts ``[(r % e) * E/e, (r % e + 1) * E/e)`` of each packed
experts module (``gate_up_proj [E, 2F, H]`` / ``down_proj [E, H, F]`` as transformers' Mixtral and Qwen2-MoE
store them, transposed with per-expert biases as gpt-oss's: every parameter of the module is split on its expert
dimension); the plan rules make each EP group's devices increasing, so r % e is also the
rank's position in the EP process group and the Shard(0) coordinate of its expert DTensors.

Forward of one experts module (``hidden [T, H], top_k_index [T, k], top_k_weights [T, k]``, the router
replicated and run by each rank on its own tokens, exactly as in the HF model):

1. the T * k token copies are sorted by expert (stable), so they go out grouped by owning rank;
2. dispatch: one ``all_to_all_single`` of the copies' hidden states (and one of their expert ids);
3. each rank runs its local experts on what it received (``down(gate(gate_up(x)))`` with the experts class's own
   gate: HF's eager math);
4. combine: the reverse ``all_to_all_single`` brings each copy's output home, where it is weighted by
   its router probability and summed into its token in ascending expert order (HF's order).

Dropless: no capacity, every copy is computed, so a run equals single-process training. Both exchanges
are differentiable (``_AllToAll``: backward is the reverse exchange); every rank always runs every local
expert (zero rows included), so the backward exchanges line up on all ranks of the EP group. gloo has
``all_to_all_single`` with uneven splits in torch 2.13, and NCCL has it natively: one code path.

Gradients (``ExpertGradSync``): expert weights are summed over the expert-data-parallel group (the
holders with the same shard index r % e, in every pipeline); every other parameter over all holders,
as ``UnitGradSync`` does for tp 1. ZeRO-1/2 slice the whole unit over the stage's holders of the same
expert shard (``zero_group``; non-expert parameters are identical on every holder, so each such group
updating its own slices stays exact; their optimizer state is thus split dp / ep ways, not dp ways).
ZeRO-3: FSDP2 shards each expert share over the stage's expert-DP group on a 2-D (expert-DP, EP) mesh
(left whole when ep = dp: no other rank holds it), and the unit's own ``fully_shard`` the rest over the
stage; FSDP2's reduce-scatters, then an all-reduce among the ranks at the same stage position in the
other pipelines (equal, increasing stages), are the whole sync. ``max_grad_norm`` counts each element
once (``ExpertGradSync.owned_square_sum``). Not built (``runtime_problems``, one line each): tp with ep,
ZeRO-3 with ep on unequal or decreasing stages, ``mixed_precision`` with ep and ZeRO-3, ``compile`` with ep, the
router's auxiliary loss. ``mixed_precision`` (zero 0-2) casts the expert shards like every parameter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from autopar.errors import AutoparError
from autopar.plan.schema import Plan
from autopar.runtime.groups import Groups, sync_groups
from autopar.runtime.layout import Layout, Placement
from autopar.runtime.sharding import apply_fsdp

Ranks = tuple[int, ...]


def packed_experts(module: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """Every packed experts module inside ``module``: (parent, attribute name, experts module).

    A packed experts module has an integer ``num_experts`` and 3-D ``gate_up_proj`` / ``down_proj``
    parameters whose first dimension is that count (transformers' Mixtral / Qwen2-MoE experts).
    """
    out = []
    for parent in module.modules():
        for attr, child in parent.named_children():
            n = getattr(child, "num_experts", None)
            params = [getattr(child, k, None) for k in ("gate_up_proj", "down_proj")]
            if isinstance(n, int) and all(isinstance(p, torch.Tensor) and p.dim() == 3 and p.shape[0] == n
                                          for p in params):
                out.append((parent, attr, child))
    return out


def num_experts(unit: nn.Module) -> int:
    """The unit's expert count (0: dense); the smallest when it holds several experts modules."""
    counts = [child.num_experts for _, _, child in packed_experts(unit)]
    return min(counts) if counts else 0


def _ep_position(place: Placement, rank: int) -> tuple[Ranks, int]:
    """(EP group of ``rank``, its shard index) in one placement (tp 1: DP rank = position in the stage)."""
    e, r = place.strategy.ep, place.devices.index(rank)
    start = (r // e) * e
    return tuple(place.devices[start:start + e]), r % e


def expert_dp_group(places: list[Placement], shard: int) -> Ranks:
    """Holders of expert shard ``shard`` in every placement of the unit (sorted): where its gradients are summed."""
    return tuple(sorted(d for p in places for i, d in enumerate(p.devices) if i % p.strategy.ep == shard))


def zero_group(place: Placement, rank: int) -> Ranks:
    """ZeRO-1/2 shard group of an expert-parallel unit: the stage's holders of ``rank``'s expert shard (sorted)."""
    return expert_dp_group([place], _ep_position(place, rank)[1])


def ep_rank_sets(places: list[Placement]) -> list[Ranks]:
    """The extra process groups an expert-parallel unit needs: its EP groups and expert-DP groups."""
    if places[0].strategy.ep == 1:
        return []
    sets: list[Ranks] = []
    for p in places:
        e = p.strategy.ep
        sets.extend(tuple(p.devices[g:g + e]) for g in range(0, len(p.devices), e))
    sets.extend(expert_dp_group(places, s) for s in range(places[0].strategy.ep))
    sets.extend(expert_dp_group([p], s) for p in places for s in range(p.strategy.ep))
    if places[0].fsdp:  # ZeRO-3 in several pipelines: the holders of the same pieces (same stage position)
        sets.extend(tuple(sorted(p.devices[i] for p in places)) for i in range(len(places[0].devices)))
    return [s for s in sets if len(s) > 1]


def runtime_problems(plan: Plan) -> list[tuple[str, str, str]]:
    """What the plan rules (``plan.expert_rules``) allow but this runtime does not run, as (field, problem, fix):
    ep > 1 with zero 3 on stages of different sizes, with decreasing devices or not in every pipeline, a unit with different ep in two pipelines,
    an EP group whose devices are not increasing."""
    out, first_ep = [], {}
    for pi, p in enumerate(plan.pipelines):
        for si, st in enumerate(p.stages):
            for li, ly in enumerate(st.layers):
                at, ep, n = f"pipelines[{pi}].stages[{si}].layers[{li}].ep", ly.strategy.ep, len(st.devices)
                if first_ep.setdefault(ly.name, ep) != ep:
                    out.append((at, f"unit {ly.name!r} has ep {ep} here but ep {first_ep[ly.name]} in an earlier "
                                "pipeline: the runtime syncs expert shards only between equal splits",
                                "give the unit the same ep in every pipeline"))
                if ep == 1 or ly.strategy.tp > 1 or n % ep:
                    continue  # tp with ep, ep not dividing dp: the plan rules name them
                sizes = sorted({len(s.devices) for _, s, _ in _stages_of(plan, ly.name)})
                zero3 = {other.strategy.zero == 3 for _, _, other in _stages_of(plan, ly.name)}
                if len(zero3) > 1:
                    out.append((at, f"ep {ep} on unit {ly.name!r} with zero 3 in some pipelines and not in others: "
                                "the runtime syncs its expert shards only between placements sharded alike",
                                "give the unit zero 3 in every pipeline or in none"))
                elif ly.strategy.zero == 3 and (len(sizes) > 1 or list(st.devices) != sorted(st.devices)):
                    out.append((at, f"ep {ep} with zero 3 on unit {ly.name!r}: the runtime shards it alike in every "
                                f"pipeline only on stages of one size ({sizes}) with increasing devices",
                                "use zero 0, 1 or 2 for this unit, or equal stages with devices in increasing order"))
                elif any(list(st.devices[g:g + ep]) != sorted(st.devices[g:g + ep]) for g in range(0, n, ep)):
                    out.append((at, f"ep {ep} on stage devices {st.devices}: each EP group's devices must be "
                                "increasing (the expert shard order)", "list the stage's devices in increasing order"))
    return out


# transformers' experts interface flags the share computes (any weight orientation, biases and gate, which is the
# experts class's own): a gate, and no norm after the experts
_LAYOUT = (("has_gate", True), ("has_post_expert_norm", False))


def check_moe_units(plan: Plan, named_units: list[tuple[str, nn.Module]]) -> None:
    """Refuse what wrap cannot train as one process does, in one line: an HF MoE model configured to add the
    router's auxiliary loss (``output_router_logits``: wrap's loss has no such term) or with router jitter
    (random per-token noise), and ep > 1 on experts without a gate (``up_proj`` only) or with a norm after them,
    which ``ExpertParallelExperts`` does not compute."""
    eps = {ly.name for st in plan.stages for ly in st.layers if ly.strategy.ep > 1}
    for name, unit in named_units:
        for parent, _, experts in packed_experts(unit):
            cfg = getattr(experts, "config", None)  # transformers' experts keep their model's config
            if getattr(cfg, "output_router_logits", False):
                raise AutoparError("model.config.output_router_logits", "is True: the HF model would add the "
                                   "router's auxiliary load-balancing loss, which wrap's loss does not have",
                                   "set config.output_router_logits = False before wrap")
            if getattr(parent, "jitter_noise", 0.0):
                raise AutoparError("model.config.router_jitter_noise", f"is {parent.jitter_noise}: random per-token "
                                   "noise on the router input cannot be reproduced by a parallel run",
                                   "set config.router_jitter_noise = 0.0 before building the model")
            if name not in eps:
                continue
            bad = next((f for f, ok in _LAYOUT if getattr(experts, f, ok) != ok), None)
            if bad is not None:
                raise AutoparError("strategy.ep", f"unit {name}'s experts module {type(experts).__name__} has "
                                   f"{bad}={getattr(experts, bad)}, a layout expert parallel does not run",
                                   "use ep 1 for this unit (its experts are then replicated)")


def _stages_of(plan: Plan, name: str) -> list:
    """(pipeline, stage, layer) of every stage holding unit ``name``."""
    return [(pi, st, ly) for pi, p in enumerate(plan.pipelines) for st in p.stages for ly in st.layers
            if ly.name == name]


def check_ep_settings(plan: Plan, mixed_precision: object, compile_kwargs: dict | None) -> None:
    """Refuse wrap settings not built with expert parallel (pure: every rank raises the same line)."""
    eps = [ly.name for st in plan.stages for ly in st.layers if ly.strategy.ep > 1]
    if not eps:
        return
    if compile_kwargs is not None:
        raise AutoparError("compile", f"is set and unit {eps[0]} has ep > 1: compile with expert parallel is not "
                           "built", "leave compile unset, or use ep 1")
    zero3 = [ly.name for st in plan.stages for ly in st.layers if ly.strategy.ep > 1 and ly.strategy.zero == 3]
    if mixed_precision is not None and zero3:
        raise AutoparError("mixed_precision", f"is set and unit {zero3[0]} has ep > 1 with zero 3: mixed precision "
                           "with expert parallel is built for zero 0-2 only", "leave mixed_precision unset, or use "
                           "zero 0, 1 or 2 on that unit")


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits whose backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def _exchange_plain(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class ExpertParallelExperts(nn.Module):
    """This rank's share of a packed experts module, with all-to-all dispatch and combine (see module doc).

    Every parameter (``gate_up_proj`` / ``down_proj``, and their ``*_bias`` where the experts have biases) keeps
    its name and logical shape: DTensors sharded on the expert dimension over the EP group's mesh (checkpoints and
    ``full_state_dict`` see the whole tensors). The plain attributes the experts' gate reads (``act_fn``, gpt-oss's
    ``alpha`` / ``limit``) are copied, and the gate is the experts class's own ``_apply_gate``.
    """

    def __init__(self, experts: nn.Module, shard: int, ep: int, group, mesh) -> None:
        super().__init__()
        for key, value in vars(experts).items():  # flags and gate constants, not torch's bookkeeping
            if not key.startswith("_") and key != "training" and isinstance(value, (bool, int, float, str)):
                setattr(self, key, value)
        self.num_experts, self.ep, self.group = experts.num_experts, ep, group
        self.local = self.num_experts // ep
        self.base = shard * self.local
        self.act_fn = getattr(experts, "act_fn", None)
        self.gate = type(experts)._apply_gate  # transformers' experts interface: the custom or default gate
        self.transposed = bool(getattr(experts, "is_transposed", False))
        for name, full in experts.named_parameters(recurse=False):
            part = full.detach()[self.base:self.base + self.local].clone()
            dt = DTensor.from_local(part, mesh, [Shard(0)], run_check=False, shape=full.shape, stride=full.stride())
            setattr(self, name, nn.Parameter(dt, requires_grad=full.requires_grad))

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        k = top_k_index.shape[1]
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # copies by expert, then token, then slot
        experts_sorted = flat[order]
        token = order // k
        send = torch.bincount(experts_sorted // self.local, minlength=self.ep)
        recv = _exchange_plain(send, [1] * self.ep, [1] * self.ep, self.group)
        send_splits, recv_splits = send.tolist(), recv.tolist()
        x = _AllToAll.apply(hidden[token], recv_splits, send_splits, self.group)
        got = _exchange_plain(experts_sorted, recv_splits, send_splits, self.group) - self.base
        y = self._run_local(x, got)
        back = _AllToAll.apply(y, send_splits, recv_splits, self.group)
        weights = top_k_weights.reshape(-1)[order]
        contrib = back * weights[:, None]
        return torch.zeros_like(hidden).index_add(0, token, contrib.to(hidden.dtype))

    def _run_local(self, x: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        """``down(gate(gate_up(x)))`` of each received row by its local expert, as transformers' experts compute
        it (weights transposed or not, biases where they have them; every expert runs, 0 rows too)."""
        perm = torch.argsort(local_ids, stable=True)
        counts = torch.bincount(local_ids, minlength=self.local).tolist()
        local = {name: p.to_local() for name, p in self.named_parameters(recurse=False)}
        outs = []
        for j, rows in enumerate(torch.split(x[perm], counts)):
            h = self.gate(self, self._linear(rows, local, "gate_up_proj", j))
            outs.append(self._linear(h, local, "down_proj", j))
        return torch.cat(outs).index_select(0, torch.argsort(perm))

    def _linear(self, x: torch.Tensor, local: dict[str, torch.Tensor], name: str, j: int) -> torch.Tensor:
        w, b = local[name][j], local.get(f"{name}_bias")
        y = x @ w if self.transposed else nn.functional.linear(x, w)
        return y if b is None else y + b[j]


def apply_expert_parallel(module: nn.Module, places: list[Placement], mine: Placement, rank: int,
                          groups: Groups) -> None:
    """Replace every packed experts module of ``module`` by this rank's ``ExpertParallelExperts`` share."""
    ep_ranks, shard = _ep_position(mine, rank)
    group, mesh2 = groups.get(ep_ranks), None
    if mine.fsdp and len(mine.devices) > mine.strategy.ep:  # ZeRO-3: EP groups as rows, expert-DP as columns
        mesh2 = groups.mesh_fsdp_tp(Layout(mine.devices, mine.strategy.ep))
    mesh = mesh2["tp"] if mesh2 is not None else groups.mesh_1d(ep_ranks)
    for parent, attr, experts in packed_experts(module):
        share = ExpertParallelExperts(experts, shard, mine.strategy.ep, group, mesh)
        if mesh2 is not None:  # FSDP2 over the expert-DP group; the unit's own fully_shard takes the rest
            apply_fsdp(share, mesh2["dp"])
        setattr(parent, attr, share)


def fsdp_ignored(module: nn.Module, mine: Placement) -> set[nn.Parameter] | None:
    """The expert shards the unit's own ZeRO-3 ``fully_shard`` must leave alone: all of them when ep = dp
    (no other rank of the stage holds them; otherwise they are already FSDP2-sharded over expert-DP)."""
    if not (mine.fsdp and mine.strategy.ep == len(mine.devices)):
        return None
    return {p for m in module.modules() if isinstance(m, ExpertParallelExperts) for p in m.parameters()}


def is_expert_param(module: nn.Module) -> list[bool]:
    """Per parameter of ``module`` (in ``parameters()`` order): whether it is an expert shard."""
    expert_ids = {id(p) for m in module.modules() if isinstance(m, ExpertParallelExperts) for p in m.parameters()}
    return [id(p) in expert_ids for p in module.parameters()]


class ExpertGradSync:
    """``UnitGradSync`` for an expert-parallel unit: expert shards summed over the expert-DP group, the rest
    over every holder of the unit (ZeRO-3: nothing left to sum, FSDP2 reduced both)."""

    mode = "expert"

    def __init__(self, module: nn.Module, places: list[Placement], mine: Placement, rank: int,
                 groups: Groups) -> None:
        self.params = list(module.parameters())
        self.expert = is_expert_param(module)
        self.tp, self.fsdp = 1, mine.fsdp  # ZeRO-3 (one placement): FSDP2 already reduce-scattered them
        self.shard = _ep_position(mine, rank)[1]
        self.expert_ranks = expert_dp_group(places, self.shard)
        self.rep_ranks = tuple(sorted(mine.devices)) if self.fsdp else sync_groups(places)[1]["replicated"][()]
        if not self.fsdp:
            self.rep_group, self.expert_group = groups.get(self.rep_ranks), groups.get(self.expert_ranks)
        else:
            pos = mine.devices.index(rank)
            self.pos_group = groups.get(tuple(sorted(p.devices[pos] for p in places)))

    def _tp_placement(self, grad: torch.Tensor) -> None:
        """No TP with expert parallel (the clip code asks): every parameter is a TP-whole tensor."""
        return None

    def owned_square_sum(self, st, rank: int, skip: frozenset) -> torch.Tensor | None:
        """Sum of squares of the synced gradient elements this rank counts for the global norm (on the
        unit's first placement): expert shards on the first EP group (or, sliced by ZeRO over the shard
        group, on every slice holder), every other parameter on DP rank 0 (or on the slices of shard 0)."""
        pos, e = st.place.devices.index(rank), st.place.strategy.ep
        if self.fsdp:  # every rank holds its own pieces of every parameter
            pos, e = 0, 1
        if st.shard is None:
            total = None
            for i, (expert, proxy) in enumerate(zip(self.expert, st.proxies)):
                if proxy.grad is None or (st.unit.name, i) in skip or not (pos < e if expert else pos == 0):
                    continue
                s = proxy.grad.float().pow(2).sum()
                total = s if total is None else total + s
            return total
        g = st.shard.master.grad
        if g is None:
            return None
        mask = torch.ones(st.shard.size * st.shard.world, dtype=torch.bool, device=g.device)
        offset = 0
        for i, (expert, t) in enumerate(zip(self.expert, st.shard.tensors)):
            if (st.unit.name, i) in skip or not (expert or pos % e == 0):
                mask[offset:offset + t.numel()] = False
            offset += t.numel()
        lo = st.shard.index * st.shard.size
        return g[mask[lo:lo + st.shard.size]].float().pow(2).sum()

    def sync(self) -> list[torch.Tensor]:
        """Synchronised local gradients of every parameter (plain tensors, parameter order)."""
        grads = []
        for p in self.params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads.append(g.to_local() if isinstance(g, DTensor) else g)
        if self.fsdp:  # FSDP2 reduced inside the stage; other pipelines hold the same pieces at the same position
            if self.pos_group is not None:
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=self.pos_group)
                grads = [piece.view_as(g) for piece, g in zip(torch.split(flat, [g.numel() for g in grads]), grads)]
            return grads
        out: list[torch.Tensor | None] = [None] * len(grads)
        for is_expert, group in ((False, self.rep_group), (True, self.expert_group)):
            idx = [i for i, e in enumerate(self.expert) if e == is_expert]
            if not idx:
                continue
            if group is None:
                for i in idx:
                    out[i] = grads[i]
                continue
            flat = torch.cat([grads[i].reshape(-1) for i in idx])
            dist.all_reduce(flat, group=group)
            offset = 0
            for i in idx:
                out[i] = flat[offset:offset + grads[i].numel()].view_as(grads[i])
                offset += grads[i].numel()
        return out
