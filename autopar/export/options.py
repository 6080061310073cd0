"""The sharding options of an export: ZeRO-3 ``reshard`` and ZeRO-1/2 ``zero_overlap``, projected onto
what a target runs (``Caps.reshard`` / ``Caps.overlap``).

The option a plan wants is the one covering the most parameters among its units at the levels the
option belongs to. A plan whose ZeRO-2 projects to a target's ZeRO-3 (torchtitan, accelerate: FSDP's
``reshard_after_forward=False`` / ``SHARD_GRAD_OP`` is the nearest they run to ZeRO-2: the parameters
gathered through forward and backward, the gradients reduce-scattered) asks for ``reshard: false``.
"""

from __future__ import annotations

from collections import Counter

from autopar.export.caps import Caps
from autopar.export.shape import weighted_choice
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan


def _wanted(plan: Plan, model: ModelSpec, levels: tuple[int, ...], key, default: bool) -> bool:
    """``key(strategy)`` covering the most parameters over the plan's units at ZeRO ``levels``."""
    weight: Counter = Counter()
    by_name = {ly.name: ly for ly in model.layers}
    for st in plan.stages:
        for ly in st.layers:
            if ly.strategy.zero in levels:
                spec = by_name[ly.name]
                weight[key(ly.strategy)] += spec.params or spec.flops or 1
    return max(weight, key=lambda v: (weight[v], v)) if weight else default


def sharding_options(plan: Plan, model: ModelSpec, caps: Caps, zero: int) -> tuple[bool, bool]:
    """(reshard, zero_overlap) of the target's shape nearest to ``plan`` at ZeRO level ``zero``."""
    reshard, overlap = True, False
    if zero == 3:
        from_zero2 = weighted_choice(plan, model, lambda s: s.zero) == 2
        want = False if from_zero2 else _wanted(plan, model, (3,), lambda s: s.reshard, True)
        reshard = want if want in caps.reshard else caps.reshard[0]
    elif zero in (1, 2):
        want = _wanted(plan, model, (1, 2), lambda s: s.zero_overlap, False)
        overlap = want if want in caps.overlap else caps.overlap[0]
    return reshard, overlap


def option_pairs(caps: Caps, zero: int) -> list[tuple[bool, bool]]:
    """Every (reshard, zero_overlap) the target runs at ZeRO level ``zero`` (its uniform space)."""
    if zero == 3:
        return [(r, False) for r in caps.reshard]
    if zero in (1, 2):
        return [(True, o) for o in caps.overlap]
    return [(True, False)]
