"""CostParams: the tunable constants of the cost model, with defaults and where they come from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

GIB = 1024**3


@dataclass(frozen=True)
class CostParams:
    """Constants the formulas use. A measured profile (``autopar profile``) replaces the defaults.

    eff_max: achieved fraction of peak FLOPS for large work. Large GEMMs reach 70-80% of dense
        peak, but attention, norms and elementwise kernels pull a whole layer down to about 60%:
        Megatron-LM reports 52-56% MFU for GPT-3-scale models on A100 (Korthikanti et al.,
        2205.05198) after its communication and bubbles. A profile replaces this.
    layer_overhead_s: fixed time per layer call (forward; backward pays it twice): kernel launches
        and dispatch, ~10 kernels of ~5 us on a GPU. It is what makes small per-rank work slow.
    param_bytes: bytes of a parameter in the compute dtype (bf16).
    grad_comm_bytes: bytes per gradient element on the wire (fp32 reduction, the Megatron/FSDP2 default).
    state_bytes: model-state bytes per parameter with mixed-precision Adam, unsharded
        (2 param + 2 grad + 4 master + 4 m + 4 v = 16; ZeRO divides the shardable parts).
    opt_bytes_touched: bytes read+written per owned parameter by the optimizer step (memory bound).
    overlap_sync: fraction of a layer's backward that can hide its step-level gradient sync.
    overlap_zero3: fraction of compute that can hide ZeRO-3 parameter gathers (prefetch).
    reserve_gib: framework reserve per device (CUDA context, NCCL buffers, allocator fragmentation).
    """

    eff_max: float = 0.60
    layer_overhead_s: float = 5e-5
    param_bytes: int = 2
    grad_comm_bytes: int = 4
    state_bytes: int = 16
    opt_bytes_touched: int = 36
    overlap_sync: float = 1.0
    overlap_zero3: float = 1.0
    reserve_gib: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostParams:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def reserve_bytes(self) -> float:
        return self.reserve_gib * GIB
