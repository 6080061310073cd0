"""Per-device memory: model states by ZeRO stage, and how many micro-batches' activations a stage holds."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def model_state_bytes(params: ArrayLike, zero: ArrayLike, dp: ArrayLike, state_bytes: float = 18,
                      param_bytes: float = 2, table: tuple = (), grad_bytes: float = 4) -> np.ndarray:
    """Bytes of parameters, gradients and Adam states one rank holds for ``params`` parameters.

    A rank holds ``param_bytes`` of compute-dtype parameter, ``grad_bytes`` of gradient buffer (the
    dtype gradients are accumulated and reduced in) and ``opt = state_bytes - param_bytes - grad_bytes``
    of optimizer state (fp32 master copy where there is one, Adam m and v) per parameter. ZeRO shards
    over the ``dp`` ranks (Rajbhandari et al.):
      zero 0: state;  zero 1: param + grad + opt/d;  zero 2: param + (grad + opt)/d;  zero 3: state/d
    With Megatron-LM's rows (docs: api-guide/dist_optimizer, "theoretical number of bytes per
    parameter"): bf16 params with fp32 gradients (2, 4, 12) give 18 and 6 + 12/d; fp16 params and
    gradients (2, 2, 16: fp32 master, fp32 main gradient, m, v) 20 and 4 + 16/d; fp32 (4, 4, 8) 16
    and 8 + 8/d. DeepSpeed's BF16 optimizer (BLOOM) also accumulates gradients in fp32.
    ``table``: measured ((a, b) per ZeRO stage 0..3) instead: a + b/d bytes per parameter for d > 1;
    d = 1 shards nothing, so every stage holds stage 0's a + b there.
    """
    p, z, d = np.asarray(params, float), np.asarray(zero), np.asarray(dp, float)
    if len(table):
        a = np.array([row[0] for row in table], float)
        b = np.array([row[1] for row in table], float)
        eff = np.where(d > 1, z, 0)
        return p * (a[eff] + b[eff] / d)
    opt = state_bytes - param_bytes - grad_bytes
    per_param = np.select(
        [z == 0, z == 1, z == 2, z == 3],
        [state_bytes,
         param_bytes + grad_bytes + opt / d,
         param_bytes + (grad_bytes + opt) / d,
         state_bytes / d],
    )
    return p * per_param


def inflight_microbatches(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak.

    1F1B: stage i warms up with p - i forwards before its first backward, so min(p - i, m).
    GPipe: every forward runs before any backward, so m.
    zb-h1: a micro-batch's activations stay until its W, so every stage holds min(p, m) (its table's peak).
    """
    if schedule == "gpipe":
        return num_microbatches
    if schedule == "zb-h1":
        return min(num_stages, num_microbatches)
    return min(num_stages - stage, num_microbatches)

