"""torchtitan's op-level selective activation checkpointing policy (ckpt ``op``), for PyTorch's SAC API.

torchtitan (``selective_ac_option = "op"``; ``_save_list`` / ``_get_custom_policy`` in
``torchtitan/models/llama3/parallelize_llama.py``, 2024-12): inside one call of a checkpointed block,
save the outputs of ``aten.mm``, of the flash / efficient SDPA kernels, of reduce-scatters and of
``aten.max``, except every second ``mm`` (counted separately in forward and in recomputation);
recompute everything else. Two stated extensions, so the policy means the same on autopar's models
and devices: a biased ``nn.Linear`` runs ``aten.addmm`` (and some backends a leaf ``aten.linear``),
counted as matmuls like ``mm`` (torchtitan's own models have no biases; later torchtitan counts
``aten.linear`` too); the SDPA kernels of every backend (CPU flash, cuDNN, fused) count as SDPA.
The planner's figures for this mode are ``autopar.modelspec.op_policy``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten
MATMUL_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.linear.default})
SAVED_OPS = MATMUL_OPS | {
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    aten.max.default,
}


def op_policy() -> Callable:
    """A fresh policy for one checkpointed call: MUST_SAVE the ops above except every second matmul.

    Forward and recomputation count matmuls separately, so both make the same decisions.
    """
    count = {False: 0, True: 0}  # matmuls seen, by ctx.is_recompute

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in MATMUL_OPS:
            count[ctx.is_recompute] += 1
            if count[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy
