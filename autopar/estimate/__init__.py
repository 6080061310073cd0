"""The thin adapter between autopar and the cost model (``cost_models/``, where every formula lives).

A Cluster, a Plan and a ModelSpec become the numbers ``cost_models`` prices: ``StageContext`` (a
stage's devices -> the links of its groups, its peak and HBM), ``estimate_pipeline`` and
``cross_pipeline`` (a plan's stages and pipelines), ``estimate_plan`` (the figures of a whole plan).
Callers that run many estimates own a ``CostCache`` and pass it down.
"""

from autopar.estimate.cache import CostCache
from autopar.estimate.context import StageContext, device_budget_bytes, stage_link
from autopar.estimate.pipeline import StageEstimate, boundary_p2p_time, stage_cost
from autopar.estimate.plan_cost import PlanEstimate, estimate_plan, plan_cost_params
from cost_models.layer import LayerCosts, layer_costs, layout_switch_time
from cost_models.transient import head_excess, transient_bound

__all__ = ["CostCache", "LayerCosts", "PlanEstimate", "StageContext", "StageEstimate", "boundary_p2p_time",
           "device_budget_bytes", "estimate_plan", "head_excess", "layer_costs", "layout_switch_time", "plan_cost_params",
           "stage_cost", "stage_link", "transient_bound"]
