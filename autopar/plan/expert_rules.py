"""The plan rules of expert parallelism (``Strategy.ep``), applied by ``plan.rules.plan_rules`` and so by
both ``autopar validate`` and the runtime's ``check_plan``.

An MoE unit with ep e splits its experts over e consecutive DP ranks of its stage (DP rank r holds
experts ``[(r % e) * E/e, (r % e + 1) * E/e)``), so e must divide the unit's dp and its expert count E.
(An MoE unit with tp > 1 needs sequence parallel: ``rules.layer_rules``.) ep > 1 on a dense unit, tp > 1 or cp > 1
together with ep > 1 (expert tensor / context parallelism is not built), and ep > 1
with the ZeRO options ``reshard: false`` / ``zero_overlap`` (not priced for expert-sharded units) are
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
                at = f"pipelines[{pi}].stages[{si}].layers[{li}].ep"
                num = experts.get(ly.name, 0) if experts is not None else None
                if ep == 1:
                    continue
                if num == 0:
                    yield (at, f"ep {ep} on unit {ly.name!r}, which has no experts (expert parallel splits the "
                           "experts of an MoE unit)", "set ep: 1 for this unit")
                    continue
                if tp > 1:
                    yield (at, f"tp {tp} with ep {ep} on unit {ly.name!r}: tensor parallel and expert parallel "
                           "on one unit are not supported together yet", "set tp: 1 or ep: 1 for this unit")
                    continue
                if ly.strategy.cp > 1:
                    yield (at, f"cp {ly.strategy.cp} with ep {ep} on unit {ly.name!r}: expert parallel with context "
                           "parallel is not built", "set ep: 1 for this unit, or cp: 1 for the pipeline")
                    continue
                if not ly.strategy.reshard or ly.strategy.zero_overlap:  # cost_models.moe prices neither
                    option = "reshard: false" if not ly.strategy.reshard else "zero_overlap: true"
                    yield (at, f"{option} with ep {ep} on unit {ly.name!r}: expert parallel runs with plain ZeRO "
                           "only", f"drop {option.split(':')[0]} for this unit, or set ep: 1")
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
