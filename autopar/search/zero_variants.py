"""The sharding options of one (tp, zero, ckpt, sp) strategy the search scores: ZeRO-3 with and without
resharding after forward, ZeRO-1/2 with and without the distributed optimizer's overlap.

ZeRO-3 ``reshard: false`` trades memory (the unit's gathered parameters held from forward to backward)
for the backward all-gather, so both variants are scored and the dominance rule keeps the faster one only
where it fits (``space.prune_dominated``; the search then keeps it only under memory headroom). ZeRO-1/2
``zero_overlap`` holds the same memory as without: one of the two cannot win whenever the cost
parameters decide the comparison for every layer (``Rule.ZERO_OVERLAP_DOMINATES``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from autopar.plan.schema import Strategy
from autopar.search.rules import Rule
from cost_models import CostParams


def overlap_choice(p: CostParams) -> bool | None:
    """Which ZeRO-1/2 variant can win under ``p`` for every layer: True (overlapped), False (not), None (both).

    Without overlap the step-level sync hides behind ``overlap_sync`` of the backward; with it the
    reduce-scatter behind ``overlap_grad_reduce`` of the backward and the all-gather behind
    ``overlap_param_gather`` of the forward (cost_models/zero_options.py). With ``overlap_sync`` 0 the
    overlapped sync is never longer; with both overlap coefficients 0 it is never shorter.
    """
    if p.overlap_grad_reduce == 0 and p.overlap_param_gather == 0:
        return False
    if p.overlap_sync == 0:
        return True
    return None


def zero_variants(s: Strategy, p: CostParams, pruned: Counter) -> list[Strategy]:
    """``s`` and its sharding variants worth scoring under ``p``, in a fixed order (the default first)."""
    if s.zero == 3:
        return [s, replace(s, reshard=False)]
    if s.zero in (1, 2):
        choice = overlap_choice(p)
        if choice is None:
            return [s, replace(s, zero_overlap=True)]
        pruned[Rule.ZERO_OVERLAP_DOMINATES] += 1
        return [replace(s, zero_overlap=True)] if choice else [s]
    return [s]
