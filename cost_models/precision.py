"""Training precisions as data: which peak a precision's matrix multiplies run at, and its byte counts.

One row per precision a plan may name. ``peak`` is the GPU catalogue column the GEMMs run at
(``autopar/cluster/catalogue.yaml``: ``tflops`` is the dense bf16/fp16 tensor peak, ``tflops_tf32``
the TF32 tensor peak, ``tflops_fp32`` plain FP32 without TF32, ``tflops_fp8`` the FP8 tensor peak).
The byte counts are what ``CostParams`` (``param_bytes``, ``grad_comm_bytes``, ``state_bytes``) and a
model spec's activations (``ModelSpec.dtype_bytes``) hold at that precision. The cost model times
a layer's linear-layer FLOPs at the row's ``peak`` and its attention core at ``attn_peak`` (the same
column except for fp8); ``eff_max`` is the one factor for what a layer reaches of them, with the
GPU's measured achievable matmul share at that column (``MAMF_COLUMNS``, ``GPUType.matmul_factor``).

``CostParams``' defaults are the bf16 row (a test checks it): ``with_precision`` writes a row's byte
counts into a CostParams, so the default precision leaves the defaults as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models.params import CostParams

DEFAULT = "bf16"


@dataclass(frozen=True)
class Precision:
    """What training in one precision means to the cost model.

    peak: the catalogue column (GPUType field) of the dense TFLOPS its GEMMs run at.
    act_bytes: bytes of an activation element saved for backward or sent between stages.
    param_bytes: bytes of a parameter in the compute dtype (what ZeRO-3 gathers and a rank holds unsharded).
    grad_comm_bytes: bytes of a gradient element on the wire (data-parallel reduction).
    grad_bytes: bytes of a gradient element in the gradient buffer a rank holds (accumulation dtype).
    state_bytes: model-state bytes per parameter with Adam, unsharded (params, grads, master copy, m, v).
    attn_peak: the column the attention core (QK^T, softmax . V) runs at: ``peak`` except where the
        precision converts the linear layers only.
    """

    name: str
    peak: str
    act_bytes: int
    param_bytes: int
    grad_comm_bytes: int
    state_bytes: int
    grad_bytes: int
    what: str
    attn_peak: str = ""

    def __post_init__(self) -> None:
        if not self.attn_peak:
            object.__setattr__(self, "attn_peak", self.peak)


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    # Mixed precision (Megatron --bf16, FSDP2 MixedPrecisionPolicy(bf16, reduce fp32)): bf16 GEMMs and
    # activations, bf16 params for compute, gradients accumulated and reduced in fp32 (Megatron-LM
    # forces accumulate_allreduce_grads_in_fp32 under bf16; DeepSpeed's BF16 optimizer does the same),
    # fp32 master + Adam m, v: 2 + 4 + 4 + 4 + 4 = 18 bytes per parameter, Megatron-LM's documented
    # figure (api-guide/dist_optimizer: 18 unsharded, 6 + 12/d with the distributed optimizer).
    Precision("bf16", "tflops", 2, 2, 4, 18, 4, "bf16 mixed precision (fp32 master weights and reduction)"),
    # The same with fp16 (Megatron --fp16, DeepSpeed fp16, torch autocast + GradScaler): the catalogue's
    # ``tflops`` is the fp16 rate where a GPU has no bf16 (V100, T4, Turing) and equal to it elsewhere.
    # Gradients are counted in fp32 on the wire as for bf16 (DeepSpeed fp32_allreduce; Megatron's fp16
    # default reduces in fp16, which this overstates by 2x). They are held in fp16; the optimizer keeps
    # an fp32 master, an fp32 copy of the gradient and m, v: 2 + 2 + 16 = 20 bytes per parameter,
    # 4 + 16/d sharded (Megatron-LM's table).
    Precision("fp16", "tflops", 2, 2, 4, 20, 2, "fp16 mixed precision (fp32 master weights, loss scaling)"),
    # Plain fp32 (torch.backends.cuda.matmul.allow_tf32 = False, PyTorch's default): GEMMs on the FP32
    # units, everything 4 bytes, no master copy: 4 param + 4 grad + 4 m + 4 v = 16 bytes per parameter.
    Precision("fp32", "tflops_fp32", 4, 4, 4, 16, 4, "fp32 throughout, GEMMs without TF32"),
    # fp32 storage with TF32 tensor-core GEMMs (allow_tf32 = True; Ampere and later): bytes as fp32.
    Precision("tf32", "tflops_tf32", 4, 4, 4, 16, 4, "fp32 storage, TF32 tensor-core GEMMs"),
    # torchao Float8 linear layers (torchtitan --model.converters float8): the linear layers' GEMMs at
    # the fp8 peak with dynamic scaling; weights, activations, gradients and optimizer states as in
    # bf16 mixed precision (Float8Linear keeps bf16/fp32 weights and casts per call; the float8
    # all-gather of FSDP2 is an option, not counted). The attention core stays bf16 in torchao
    # (``attn_peak``), so its FLOPs run at the bf16 peak.
    Precision("fp8", "tflops_fp8", 2, 2, 4, 18, 4, "Float8 linear layers (torchao), bf16 otherwise", attn_peak="tflops"),
)}
NAMES = tuple(PRECISIONS)
PEAK_COLUMNS = tuple(dict.fromkeys(p.peak for p in PRECISIONS.values()))
# The catalogue column of measured achievable matmul efficiency (MAMF, ``GPUType.matmul_factor``) that belongs to a
# peak column: half-precision, FP8 and plain FP32 matmuls were measured; TF32 was not.
MAMF_COLUMNS = {"tflops": "mamf", "tflops_fp8": "mamf_fp8", "tflops_fp32": "mamf_fp32"}
HALF_PEAK = "tflops"  # the half-precision tensor column, the one eff_max was set at (CostParams.eff_max)


def precision(name: str) -> Precision | None:
    """The row called ``name``, or None (the caller names the field in its error)."""
    return PRECISIONS.get(name)


def with_precision(params: CostParams, prec: Precision) -> CostParams:
    """``params`` with the byte counts of ``prec`` (param, gradient on the wire and held, model state)."""
    return replace(params, param_bytes=prec.param_bytes, grad_comm_bytes=prec.grad_comm_bytes,
                   state_bytes=prec.state_bytes, grad_bytes=prec.grad_bytes)
