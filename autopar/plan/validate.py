"""The plan validator: everything a plan must satisfy before the runtime or a launcher touches it.

The rules themselves live in ``autopar.plan.rules`` (the runtime applies the same ones, so a fault
reads the same from ``autopar validate`` and from ``wrap``); here they are applied to a plan and,
optionally, the planner's ModelSpec and the predicted peak memory per device. Problems are one line
each: ``<field>: <problem>; <fix>``.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec
from autopar.plan.rules import ModelFacts, Problem, plan_rules
from autopar.plan.schema import Plan


def plan_problems(plan: Plan, model: ModelSpec | None = None,
                  memory_peak_gib: dict[int, float] | None = None) -> list[str]:
    """Every problem of ``plan``, one line each (empty: the plan is valid)."""
    return [str(AutoparError(*p)) for p in _problems(plan, model, memory_peak_gib)]


def validate_plan(plan: Plan, model: ModelSpec | None = None,
                  memory_peak_gib: dict[int, float] | None = None) -> None:
    """Raise AutoparError naming the first problem of ``plan`` and its fix; return None when valid."""
    problems = _problems(plan, model, memory_peak_gib)
    if problems:
        raise AutoparError(*problems[0])


def _problems(plan: Plan, model: ModelSpec | None, memory_peak_gib: dict[int, float] | None) -> list[Problem]:
    return plan_rules(plan, ModelFacts.of_spec(model) if model is not None else None,
                      memory_peak_gib=memory_peak_gib)
