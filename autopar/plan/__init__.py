"""Plans: dataclasses (schema), YAML load/save (io), and the validator."""

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

__all__ = ["PLAN_VERSION", "SCHEDULES", "ModelRef", "Pipeline", "Plan", "Stage", "StageLayer", "Strategy"]
