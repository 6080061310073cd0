"""The one cost model the search and `autopar estimate` share (built on cost_models/)."""

from autopar.estimate.layer_cost import LayerCosts, StageContext, layer_costs, layout_switch_time
from autopar.estimate.plan_cost import PlanEstimate, StageEstimate, estimate_plan, stage_cost

__all__ = ["LayerCosts", "PlanEstimate", "StageContext", "StageEstimate", "estimate_plan", "layer_costs",
           "layout_switch_time", "stage_cost"]
