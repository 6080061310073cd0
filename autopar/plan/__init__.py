"""Plans: dataclasses (schema), YAML load/save (io, reader), the plan rules (rules) and the validator."""

from autopar.plan.io import dump_plan_yaml, load_plan, plan_to_dict, save_plan
from autopar.plan.reader import plan_from_dict
from autopar.plan.schema import (
    PLAN_VERSION,
    SCHEDULES,
    ModelRef,
    Pipeline,
    Plan,
    Stage,
    StageLayer,
    Strategy,
)
from autopar.plan.validate import plan_problems, validate_plan

__all__ = ["PLAN_VERSION", "SCHEDULES", "ModelRef", "Pipeline", "Plan", "Stage", "StageLayer", "Strategy",
           "dump_plan_yaml", "load_plan", "plan_from_dict", "plan_problems", "plan_to_dict", "save_plan",
           "validate_plan"]
