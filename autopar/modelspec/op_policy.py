"""What op-level selective activation checkpointing (ckpt ``op``) keeps and recomputes in a unit.

The policy is torchtitan's default "selective" checkpointing (``activation_checkpoint.mode =
"selective"``, ``selective_ac_option = "op"``; ``_save_list`` and ``_get_custom_policy`` in
``torchtitan/models/llama3/parallelize_llama.py`` of 2024-12, ``SelectiveAC`` in
``torchtitan/distributed/activation_checkpoint.py`` later): inside one call of the unit, the outputs
of matmuls are saved except every second one (the 2nd, 4th, ... in execution order are recomputed),
the outputs of SDPA kernels (flash / efficient attention) and of reduce-scatters are saved, and
everything else (norms, activations, RoPE, residual adds, dropout) is recomputed. The unit's input
is kept, as the recomputation starts from it. autopar's runtime applies the same policy
(``autopar.runtime.checkpointing``).

Per sample, at tp 1, the saved bytes split by how TP / SP shard them:

* ``seq``: the unit's input (sequence parallel shards it, as for ``full``);
* ``tp``: saved outputs of column-parallel matmuls (Q/K/V or fused QKV, MLP up/gate) and of SDPA
  (its output and fp32 log-sum-exp statistics);
* ``rep``: saved outputs of row-parallel matmuls (attention output, MLP down): under TP the matmul
  yields partial sums at full size before the reduction, so TP does not shard them;
* ``rs``: the row-parallel outputs after the reduce-scatter that sequence parallelism performs,
  saved whatever their matmul's parity (divided by tp; only with tp > 1 and sp).

``recompute_flops`` is what backward reruns: the FLOPs of the recomputed (even) matmuls, plus the
attention core when it is not an SDPA kernel (eager ``bmm`` attention is not on the save list).
Elementwise work has no FLOPs in the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Matmul:
    """One matmul of a unit in execution order: its output bytes per sample and forward FLOPs per sample.

    ``row``: a row-parallel matmul under TP (its output is a partial sum reduced over the TP group).
    """

    out_bytes: float
    flops: float
    row: bool = False


@dataclass(frozen=True)
class OpSaved:
    """A unit's saved bytes per sample under ckpt ``op``, split by TP/SP sharding, and its recompute FLOPs."""

    seq: float
    tp: float
    rep: float
    rs: float
    recompute_flops: float

    def saved_bytes(self, tp: int = 1, sp: bool = False) -> float:
        """Bytes per sample one rank keeps under ckpt ``op`` at TP degree ``tp`` (sequence parallel ``sp``)."""
        seq_div = tp if sp else 1
        rs = self.rs / tp if sp and tp > 1 else 0.0
        return self.seq / seq_div + self.tp / tp + self.rep + rs


def op_saved(input_bytes: float, matmuls: list[Matmul], sdpa_bytes: float, eager_attn_flops: float = 0.0) -> OpSaved:
    """Apply the op policy to a unit: input kept, odd-numbered matmul outputs and SDPA outputs saved.

    ``matmuls`` in execution order (the 1st, 3rd, ... are saved, the 2nd, 4th, ... recomputed);
    ``sdpa_bytes``: the SDPA kernel's outputs per sample (0 without an SDPA kernel);
    ``eager_attn_flops``: FLOPs of an attention core computed without SDPA (recomputed).
    """
    saved, dropped = matmuls[0::2], matmuls[1::2]
    return OpSaved(seq=input_bytes,
                   tp=sum(m.out_bytes for m in saved if not m.row) + sdpa_bytes,
                   rep=sum(m.out_bytes for m in saved if m.row),
                   rs=sum(m.out_bytes for m in matmuls if m.row),
                   recompute_flops=sum(m.flops for m in dropped) + eager_attn_flops)
