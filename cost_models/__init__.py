"""The cost model, whole: formulas and their assembly into layer, stage, pipeline and cross-pipeline costs.

Every function takes plain numbers or numpy arrays (or small protocols of them: ``layer.Layer``,
``layer.Stage``) and returns the same, so the search can score thousands of candidate strategies in
one call. Units: bytes, bytes/s, FLOPs, FLOP/s, seconds. Nothing here imports autopar; autopar turns
a model, cluster and plan into these numbers (``autopar.estimate``).

Modules, bottom up: ``params`` (the tunable constants), ``communication`` (alpha-beta-gamma
formulas), ``collectives`` (measured fit or formula, per group), ``compute``, ``gemm_shapes`` (a layer's
matmuls in tiles and waves over the SMs), ``memory``, ``layer``
(one layer under a table of strategies), ``stage``, ``pipeline``, ``cross_pipeline``; beside them
``precision`` (the training precisions as a table: peak column and byte counts).
"""

from cost_models.params import CostParams

__all__ = ["CostParams"]
