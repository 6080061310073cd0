"""Per-device memory: model states by ZeRO stage, and how many micro-batches' activations a stage holds."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def model_state_bytes(params: ArrayLike, zero: ArrayLike, dp: ArrayLike, state_bytes: float = 16,
                      param_bytes: float = 2, table: tuple = ()) -> np.ndarray:
    """Bytes of parameters, gradients and Adam states one rank holds for ``params`` parameters.

    Mixed-precision Adam keeps ``state_bytes`` = 16 bytes/param unsharded: 2 (bf16 param) + 2 (grad)
    + 12 (fp32 master, m, v). ZeRO shards over the ``dp`` ranks (Rajbhandari et al.):
      zero 0: 16;  zero 1: 4 + 12/d;  zero 2: 2 + 14/d;  zero 3: 16/d   (bytes per parameter)
    ``table``: measured ((a, b) per ZeRO stage 0..3) instead: a + b/d bytes per parameter for d > 1;
    d = 1 shards nothing, so every stage holds stage 0's a + b there.
    """
    p, z, d = np.asarray(params, float), np.asarray(zero), np.asarray(dp, float)
    if len(table):
        a = np.array([row[0] for row in table], float)
        b = np.array([row[1] for row in table], float)
        eff = np.where(d > 1, z, 0)
        return p * (a[eff] + b[eff] / d)
    opt = state_bytes - 2 * param_bytes  # 12: master + m + v
    per_param = np.select(
        [z == 0, z == 1, z == 2, z == 3],
        [state_bytes,
         2 * param_bytes + opt / d,
         param_bytes + (param_bytes + opt) / d,
         state_bytes / d],
    )
    return p * per_param


def inflight_microbatches(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak.

    1F1B: stage i warms up with p - i forwards before its first backward, so min(p - i, m).
    GPipe: every forward runs before any backward, so m.
    """
    if schedule == "gpipe":
        return num_microbatches
    return min(num_stages - stage, num_microbatches)

