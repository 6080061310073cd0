"""The plan rules of expert parallelism (``Strategy.ep``), applied by ``plan.rules.plan_rules`` and so by
both ``autopar validate`` and the runtime's ``check_plan``.

An MoE unit with ep e splits its experts over e consecutive DP ranks of its stage (DP rank r holds
experts ``[(r % e) * E/e, (r % e + 1) * E/e)``), so e must divide the unit's dp and its expert count E.
ep > 1 on a dense unit, and tp > 1 together with ep > 1 (expert tensor parallelism is not built), are
refused, each naming the field and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

Problem = tuple[str, str, str]  # (field, problem, fix): the parts of an AutoparError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_rules(plan, experts: Mapping[str, int] | None) -> Iterator[Problem]:
    """Every problem of the plan's ``ep`` settings. ``experts``: unit name -> routed experts of the model's
    MoE units (None: no model given, so only the model-free checks run)."""
    for pi, p in enumerate(plan.pipelines):
        for si, st in enumerate(p.stages):
            n = len(st.devices)
            for li, ly in enumerate(st.layers):
                ep, tp = ly.strategy.ep, ly.strategy.tp
                if ep == 1:
                    continue
                at = f"pipelines[{pi}].stages[{si}].layers[{li}].ep"
                num = experts.get(ly.name, 0) if experts is not None else None
                if num == 0:
                    yield (at, f"ep {ep} on unit {ly.name!r}, which has no experts (expert parallel splits the "
                           "experts of an MoE unit)", "set ep: 1 for this unit")
                    continue
                if tp > 1:
                    yield (at, f"tp {tp} with ep {ep} on unit {ly.name!r}: tensor parallel and expert parallel "
                           "on one unit are not supported together yet", "set tp: 1 or ep: 1 for this unit")
                    continue
                if n == 0 or n % tp:
                    continue  # layer_rules names the TP problem
                dp = n // tp
                if dp % ep:
                    yield (at, f"ep {ep} does not divide dp = {dp} of unit {ly.name!r} (expert groups are "
                           "consecutive DP ranks)", f"use an ep dividing {dp} ({', '.join(map(str, _divisors(dp)))})")
                    continue
                if num is not None and num % ep:
                    yield (at, f"ep {ep} does not divide the {num} experts of unit {ly.name!r}",
                           f"use an ep dividing both {num} and dp = {dp} "
                           f"({', '.join(str(d) for d in _divisors(dp) if num % d == 0)})")
