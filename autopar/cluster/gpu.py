"""GPUType: one accelerator model of the catalogue, computing at one training precision.

Units: memory GiB, compute TFLOPS (dense peaks: ``tflops`` bf16/fp16 tensor, and per precision
``tflops_fp32``, ``tflops_tf32``, ``tflops_fp8``; 0 = not known), bandwidth GB/s (1e9 bytes/s, one
direction). Methods that feed the cost model return SI units (bytes, bytes/s, FLOP/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError
from cost_models.params import REFERENCE_MAMF
from cost_models.precision import DEFAULT, HALF_PEAK, MAMF_COLUMNS, NAMES, PEAK_COLUMNS, precision

GIB = 1024**3
# GDDR memory with ECC on (``GPUType.gddr_ecc``): the CUDA C++ Best Practices Guide ("Theoretical Bandwidth
# Calculation"): on GPUs with GDDR memory and ECC enabled, available DRAM is reduced by 6.25% to store the ECC
# bits, and fetching them reduces effective bandwidth by approximately 20%. nvidia-smi shows it on the data-center
# GDDR parts, which ship with ECC on: T4 15360 MiB of 16 GiB, A10/A10G 23028 MiB and L4 23034 MiB of 24 GiB,
# A40/L40S 46068 MiB of 48 GiB.
ECC_MEMORY_FRACTION = 1.0 - 0.0625
ECC_BANDWIDTH_FRACTION = 0.8
PEAK_FIELDS = tuple(c for c in PEAK_COLUMNS if c != "tflops")  # optional per-precision peaks (0: unknown)
MAMF_FIELDS = tuple(MAMF_COLUMNS.values())  # optional measured achievable matmul shares (0: unknown)


@dataclass(frozen=True)
class GPUType:
    """One accelerator model from the catalogue, computing at one training precision.

    ``tflops`` is the dense bf16/fp16 tensor peak; ``tflops_fp32`` / ``tflops_tf32`` / ``tflops_fp8`` the
    dense peaks at those precisions (0: not known or not supported). ``precision`` names the row of
    ``cost_models.precision`` the GPU's GEMMs run at (set for a whole cluster by ``Cluster.at_precision``);
    a GPU without that row's peak is refused here, with one line naming the missing field.
    """

    name: str
    memory_gib: float
    tflops: float
    hbm_gbps: float
    nvlink_gbps: float = 0.0  # per-GPU intra-node bandwidth when the node has NVLink/NVSwitch; else PCIe
    pcie_gbps: float = 25.0
    vendor: str = "nvidia"
    tflops_fp32: float = 0.0
    tflops_tf32: float = 0.0
    tflops_fp8: float = 0.0
    sustained: float = 1.0  # fraction of the datasheet peaks a power-capped part holds on long GEMMs
    gddr_ecc: bool = False  # GDDR memory with ECC on: less usable memory and bandwidth (ECC_* above)
    sms: int = 0  # streaming multiprocessors (0: not known): what GEMM tiles are scheduled over (cost_models.gemm_shapes)
    mamf: float = 0.0  # measured fraction of ``tflops`` the best large bf16/fp16 matmul reaches (0: not known)
    mamf_fp8: float = 0.0  # the same for ``tflops_fp8``
    mamf_fp32: float = 0.0  # the same for ``tflops_fp32`` (plain FP32 matmuls, without TF32)
    precision: str = DEFAULT
    memory_margin: float = 0.0  # fraction of its usable memory a plan leaves free (``Cluster.with_memory_margin``)

    def __post_init__(self) -> None:
        if not 0 <= self.memory_margin < 1:
            raise AutoparError("memory_margin", f"must be a fraction in [0, 1), got {self.memory_margin}",
                               "give the share of each GPU's memory to keep free, e.g. 0.1")
        for f in ("memory_gib", "tflops", "hbm_gbps"):
            if getattr(self, f) <= 0:
                raise AutoparError(f"gpu {self.name}.{f}", f"must be positive, got {getattr(self, f)}",
                                   "fix the GPU catalogue entry")
        if not 0 < self.sustained <= 1:
            raise AutoparError(f"gpu {self.name}.sustained", f"must be in (0, 1], got {self.sustained}",
                               "give the fraction of its peak the GPU sustains (1: the datasheet's)")
        if not isinstance(self.sms, int) or self.sms < 0:
            raise AutoparError(f"gpu {self.name}.sms", f"must be a whole number >= 0, got {self.sms!r}",
                               "give the GPU's streaming multiprocessor count, or 0 when it is not known")
        for f in MAMF_FIELDS:
            if not 0 <= getattr(self, f) <= 1:
                raise AutoparError(f"gpu {self.name}.{f}", f"must be in [0, 1], got {getattr(self, f)}",
                                   "give the measured achievable matmul TFLOPS over the dense peak, or 0 when not known")
        prec = precision(self.precision)
        if prec is None:
            raise AutoparError("precision", f"unknown precision {self.precision!r}", f"use one of {', '.join(NAMES)}")
        if not getattr(self, prec.peak) > 0:
            raise AutoparError(f"gpu {self.name}.{prec.peak}", f"is not known (0), so precision {self.precision} "
                               f"cannot be planned on {self.name}",
                               f"pick another precision, or give the GPU's dense {prec.peak} in a cluster file")

    @property
    def usable_memory_gib(self) -> float:
        """What programs can allocate: ``memory_gib`` less the ECC bits' share on a ``gddr_ecc`` part."""
        return self.memory_gib * (ECC_MEMORY_FRACTION if self.gddr_ecc else 1.0)

    @property
    def memory_bytes(self) -> float:
        """``usable_memory_gib`` in bytes (a plan's budget leaves ``memory_margin`` of it free: ``budget_gib``)."""
        return self.usable_memory_gib * GIB

    @property
    def hbm_bw(self) -> float:
        """Bytes/s its memory-bound kernels move: the ``hbm_gbps`` line rate, less ECC's share on a ``gddr_ecc`` part."""
        return self.hbm_gbps * 1e9 * (ECC_BANDWIDTH_FRACTION if self.gddr_ecc else 1.0)

    @property
    def flops(self) -> float:
        """Peak dense FLOP/s of its GEMMs at its ``precision`` (the catalogue column the precision names)."""
        return getattr(self, precision(self.precision).peak) * 1e12

    def matmul_factor(self, peak: str) -> float:
        """Its measured achievable matmul efficiency at the ``peak`` column over the reference GPU's
        (``REFERENCE_MAMF``): below 1 where its large matmuls reach less of their datasheet peak than the A100's
        that ``eff_max`` was set on; 1 where no figure is known."""
        column = MAMF_COLUMNS.get(peak)
        value = getattr(self, column) if column else 0.0
        return value / REFERENCE_MAMF if value else 1.0

    def matmul_ratio(self, peak: str) -> float:
        """How fast its large matmuls run at the ``peak`` column against its half-precision tensor matmuls
        (``tflops``), each at its measured achievable share (the reference's where not known): 1 for bf16/fp16,
        about 0.06 for plain FP32 on an H100, about 1.8 for FP8. What ``cost_models.compute.layer_efficiency``
        needs to keep the rest of a layer at the speed ``eff_max`` was set at."""
        return getattr(self, peak) * self.matmul_factor(peak) / (getattr(self, HALF_PEAK) * self.matmul_factor(HALF_PEAK))

    @property
    def sustained_attn_flops(self) -> float:
        """Sustained FLOP/s of its attention core at its ``precision`` (the bf16 peak under fp8)."""
        peak = precision(self.precision).attn_peak
        return getattr(self, peak) * 1e12 * self.sustained * self.matmul_factor(peak)

    @property
    def sustained_flops(self) -> float:
        """What its GEMMs can run at: ``flops`` times ``sustained`` times ``matmul_factor`` (compute time; MFU
        stays against ``flops``)."""
        return self.flops * self.sustained * self.matmul_factor(precision(self.precision).peak)

    @property
    def default_intra_bw_gbps(self) -> float:
        return self.nvlink_gbps or self.pcie_gbps
