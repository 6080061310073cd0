"""Plain stand-ins for the cost model's inputs (no autopar): a layer unit and a stage on one node."""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_models import CostParams
from cost_models.collectives import Collectives, GroupLinks

BW, LAT, HBM = 100e9, 5e-6, 1e12
CBW = BW * CostParams().link_efficiency  # what the collective formulas run at over a BW link (p2p: BW itself)


@dataclass(frozen=True)
class Unit:
    kind: str = "block"
    params: int = 1_000_000
    tp_params: int = 800_000
    flops: float = 1e9
    attn_core_flops: float = 2e8
    boundary_bytes: float = 1e5
    tp_comm_bytes: float = 2e5
    tp_collectives: int = 2

    def saved_bytes(self, ckpt: str, tp: int = 1, sp: bool = False, input_share: float = 1.0) -> float:
        return {"none": 3e6, "selective": 2e6, "full": 1e5, "op": 1.5e6}[ckpt] / tp

    def recompute_flops(self, ckpt: str) -> float:
        return {"none": 0.0, "selective": self.attn_core_flops, "full": self.flops, "op": 0.25 * self.flops}[ckpt]


@dataclass(frozen=True)
class Strat:
    """A strategy as the cost model reads it: every field of ``autopar.plan.schema.Strategy``."""

    tp: int = 1
    zero: int = 0
    ckpt: str = "none"
    sp: bool = False
    ep: int = 1
    reshard: bool = True
    zero_overlap: bool = False
    cp: int = 1
    async_tp: bool = False


def links(size: int) -> GroupLinks:
    """A group of ``size`` ranks on one node."""
    return GroupLinks(size, size, 1, BW, LAT, BW, LAT)


@dataclass
class OneNodeStage:
    n: int
    micro_batch_size: int
    num_microbatches: int = 1
    params: CostParams = field(default_factory=CostParams)
    peak_flops: float = 1e14
    attn_peak_flops: float = 1e14
    hbm_bw: float = HBM
    sms: int = 0  # not known: no GEMM wave quantisation (cost_models.gemm_shapes)
    matmul_ratios: tuple[float, float] = (1.0, 1.0)  # half-precision matmuls (cost_models.compute.layer_efficiency)
    tie_apart: bool = False  # a tied tensor's other copy on another stage (cost_models.ties): here, on this node

    @property
    def collectives(self) -> Collectives:
        return Collectives(self.params, self.hbm_bw)

    @property
    def stage_links(self) -> GroupLinks:
        return links(self.n)

    def tp_links(self, tp: int) -> GroupLinks:
        return links(tp)

    def dp_links(self, tp: int) -> GroupLinks:
        return links(self.n // tp)

    def tie_links(self) -> GroupLinks:
        return links(2 * self.n if self.tie_apart else self.n)

    def tie_pair_links(self) -> GroupLinks:
        return links(2)
