"""The thin torch.distributed runtime: ``wrap(model, plan)`` executes any autopar plan.

Modules: layout (pure placement arithmetic), checks (plan vs model vs world), agreement (wrap's
first collective: every rank holds the same plan and model), guards (per-step batch and NaN checks),
groups (process groups, meshes), materialize (deterministic weights), meta_build (one unit at a time,
every rank told of a failure), sync_batchnorm (BatchNorm over a DP group), tensor_parallel (DTensor
TP/SP), checkpointing, sharding (ZeRO-1/2/3), p2p (pipeline and in-stage row exchanges), schedule
(1F1B / GPipe), stage (one stage's micro-batch loop), loss (the global-batch loss split exactly),
ties (tensors shared by units), boundaries (tuples / dicts between ranks), grad_sync, parallel_model
(the ParallelModel ``wrap`` returns: step, eval_step, predict, train/eval, save/load), clip (global
gradient norm), outputs (forward-only results on every rank), checkpoint_io (torch.distributed.checkpoint,
any plan to any plan), precision_policy (MixedPrecisionPolicy on every unit), step_log (per-step lines),
wrap; local_ranks (fork-based multi-process launcher).
"""

from autopar.runtime.materialize import init_weights
from autopar.runtime.parallel_model import ParallelModel
from autopar.runtime.wrap import wrap

__all__ = ["ParallelModel", "init_weights", "wrap"]
