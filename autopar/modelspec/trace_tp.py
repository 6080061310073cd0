"""What a traced unit's TP plan (the model's own table, ``autopar.units.unit_tp_info``) means for its LayerSpec: the
plan's name and kind, the TP divisors, the row-parallel modules, the parameters it shards or keeps whole on the
rank's tokens, and the collectives it adds per forward.

A unit without a plan runs with tp = 1 only, since the runtime has no plan for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

# Unit kinds of autopar.models TP plans (Megatron layout): LayerSpec.kind, the all-reduces per forward (a block's:
# one per row-parallel module, the attention's and the MLP's; an MoE family's block, whose experts run whole on the
# rank's tokens, has the attention's only), the tensor whose bytes they carry, and which parameters the plan shards
# ("matrices": what the plan's styles shard; "vocab": tensors with a vocab-sized dimension).
TP_KINDS = {
    "embed": {"kind": "embedding", "collectives": 1, "bytes_of": "output", "sharded": "vocab"},
    "block": {"kind": "block", "collectives": None, "bytes_of": "output", "sharded": "matrices"},
    "head": {"kind": "head", "collectives": 1, "bytes_of": "input", "sharded": "vocab"},
}
# The parameters a style shards (autopar/runtime/tensor_parallel.py): a column-parallel linear splits its
# bias with its output columns, a row-parallel one keeps its bias whole (added after the all-reduce).
SHARDED_BY_STYLE = {"colwise": ("weight", "bias"), "rowwise": ("weight",), "vocab_embed": ("weight",),
                    "logits": ("weight", "bias"), "tp_norm": ("weight", "bias")}


@dataclass(frozen=True)
class TPFacts:
    """A unit's TP facts (``plan`` None: no plan, tp = 1 only)."""

    plan: str | None = None
    kind: str = "generic"
    divisors: tuple[int, ...] = ()
    rows: set = field(default_factory=set)  # row-parallel modules (trace_ops: their matmuls' outputs)
    tp_params: int = 0
    local_params: int = 0  # LayerSpec.tp_local_params
    collectives: int = 0  # per forward, the norms' statistics all-reduces included
    comm_bytes: float = 0.0  # per sample and forward


def tp_facts(model: nn.Module, name: str, unit: nn.Module, params: list[nn.Parameter], out_bytes: float,
             in_bytes: float) -> TPFacts:
    """The TP facts of unit ``name`` (``unit``, holding ``params``; ``out_bytes`` / ``in_bytes``: its output and
    input per sample) of ``model``."""
    from autopar.models.tp_plans import MOE_LOCAL, entries, tp_norm_collectives
    from autopar.units import unit_kind, unit_tp_info

    info = unit_tp_info(model, name, unit)
    if info.plan is None or not info.divisors:
        return TPFacts()
    kind = unit_kind(name)
    row = TP_KINDS[kind]
    styled = [(unit.get_submodule(fqn), style) for fqn, style in entries(info.plan)]
    rows = {m for m, style in styled if style == "rowwise"}
    by_plan = {id(p) for m, style in styled for pname, p in m.named_parameters(recurse=False)
               if pname in SHARDED_BY_STYLE.get(style, ())}
    local = {id(p) for m, style in styled if style == MOE_LOCAL for p in m.parameters()}
    divisors = tuple(info.divisors)

    def sharded(p: nn.Parameter) -> bool:
        return id(p) in by_plan if row["sharded"] == "matrices" else any(n in divisors for n in p.shape)

    coll = len(rows) if row["collectives"] is None else row["collectives"]
    carried = out_bytes if row["bytes_of"] == "output" else in_bytes
    return TPFacts(plan=f"{model.family}.{kind}", kind=row["kind"], divisors=divisors, rows=rows,
                   tp_params=sum(p.numel() for p in params if sharded(p)),
                   local_params=sum(p.numel() for p in params if id(p) in local),
                   # the norms' statistics: a few floats a token, latency and no bandwidth
                   collectives=coll + tp_norm_collectives(unit, info.plan), comm_bytes=coll * carried)
