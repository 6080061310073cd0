"""The plan: what runs where. One schema for homogeneous (Galvatron-style) and asymmetric (FlashFlex-style) plans.

Conventions the search, the cost model and the runtime share:

* A plan has one or more **pipelines** (data-parallel replicas). Pipeline j trains on a contiguous
  block of ``batch_share`` samples of the global batch, in pipeline order.
* ``micro_batch_size`` is samples per micro-batch *of the whole pipeline*; ``batch_share ==
  micro_batch_size * num_microbatches``. Micro-batch k of pipeline j holds samples
  ``offset_j + k*mbs ... offset_j + (k+1)*mbs - 1``.
* A **stage** holds ``devices`` (global device ids, node by node = launch rank order) and a run of
  consecutive layer units. Each layer has its own strategy. For a layer with TP degree t on a stage
  with n devices, the TP groups are consecutive chunks ``devices[i*t:(i+1)*t]`` and the DP groups are
  the strided slices ``devices[j::t]``, so dp = n / t. DP rank r of a layer processes samples
  ``r*mbs/dp ... (r+1)*mbs/dp - 1`` of each micro-batch.
* The loss is the mean over every sample of the global batch; gradients equal the global-batch mean
  gradient whatever the plan.
* **Interleaved pipelines** (``schedule: interleaved``, Megatron's virtual stages): a pipeline with
  ``virtual_stages: v`` lists p * v stages, the model chunks in model order; chunk k runs on the devices
  of chunk k mod p (it repeats them), so each of the p physical stages runs v chunks. Every other
  pipeline has ``virtual_stages: 1`` (absent from the file) and one chunk per stage.
* **Zero-bubble pipelines** (``schedule: zb-h1``, Qi et al. 2024's ZB-H1): 1F1B's stages, each backward
  split into input-gradient (B) and weight-gradient (W) passes; needs 2+ stages (``rules.schedule_rules``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.modelspec.spec import CKPT_MODES

PLAN_VERSION = 1
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")


@dataclass(frozen=True)
class Strategy:
    """How one layer unit runs inside its stage."""

    tp: int = 1
    zero: int = 0  # 0 DDP, 1 sharded optimizer, 2 + sharded grads, 3 + sharded params (FSDP)
    ckpt: str = "none"  # none | selective | full | op
    sp: bool = False  # sequence parallel (needs tp > 1)
    ep: int = 1  # expert parallel degree of an MoE unit: its experts split over ep consecutive DP ranks
    # ZeRO-3 only: False keeps the unit's parameters gathered from its forward to its backward (FSDP2
    # reshard_after_forward=False: no second all-gather in backward, the full parameters held meanwhile).
    reshard: bool = True
    # ZeRO-1/2 only: Megatron's distributed optimizer with overlap_grad_reduce + overlap_param_gather:
    # the gradient reduce-scatter runs during the step's last backward, the parameter all-gather
    # during the next forward (cost_models/zero_options.py prices what stays exposed).
    zero_overlap: bool = False
    cp: int = 1  # context parallel degree: the sequence split over cp ranks (autopar/plan/cp_rules.py)
    async_tp: bool = False  # async TP: SP's collectives micro-pipelined with their matmuls (needs tp > 1 and sp; rules.py)

    def __post_init__(self) -> None:
        if not isinstance(self.tp, int) or self.tp < 1:
            raise AutoparError("strategy.tp", f"must be an integer >= 1, got {self.tp!r}", "use 1, 2, 4, 8, ...")
        if self.zero not in (0, 1, 2, 3):
            raise AutoparError("strategy.zero", f"must be 0, 1, 2 or 3, got {self.zero!r}",
                               "0 = DDP, 1 = sharded optimizer, 2 = + grads, 3 = + params")
        if self.ckpt not in CKPT_MODES:
            raise AutoparError("strategy.ckpt", f"unknown mode {self.ckpt!r}", f"use one of {', '.join(CKPT_MODES)}")
        if self.sp and self.tp == 1:
            raise AutoparError("strategy.sp", "sequence parallel needs tp > 1", "set sp: false or tp >= 2")
        if not isinstance(self.ep, int) or isinstance(self.ep, bool) or self.ep < 1:
            raise AutoparError("strategy.ep", f"must be an integer >= 1, got {self.ep!r}",
                               "use 1 (no expert parallelism) or a divisor of dp and of the unit's experts")
        if not isinstance(self.reshard, bool) or (not self.reshard and self.zero != 3):
            raise AutoparError("strategy.reshard", f"reshard: {self.reshard!r} with zero {self.zero}: only ZeRO-3 "
                               "reshards parameters after forward", "set reshard: false only with zero: 3 (or omit it)")
        if not isinstance(self.zero_overlap, bool) or (self.zero_overlap and self.zero not in (1, 2)):
            raise AutoparError("strategy.zero_overlap", f"zero_overlap: {self.zero_overlap!r} with zero {self.zero}: "
                               "only ZeRO-1/2 (the distributed optimizer) overlap their step-level reduce-scatter "
                               "and all-gather", "set zero_overlap: true only with zero: 1 or 2 (or omit it)")
        if not isinstance(self.cp, int) or isinstance(self.cp, bool) or self.cp < 1:
            raise AutoparError("strategy.cp", f"must be an integer >= 1, got {self.cp!r}", "use 1 (off), 2, 4, 8, ...")

    def short(self) -> str:
        """Compact label, e.g. ``tp2 z3 full sp``; ``nr`` after z3: no reshard after forward; ``ov`` after
        z1/z2: distributed-optimizer overlap (``tp1 z3 nr``, ``tp1 z1 ov``); ``sp atp`` with async TP; ``ep4``:
        expert parallel 4; ``cp2``: context parallel 2."""
        s = f"tp{self.tp} z{self.zero}"
        if not self.reshard:
            s += " nr"
        if self.zero_overlap:
            s += " ov"
        if self.ckpt != "none":
            s += f" {self.ckpt[:3]}"
        if self.sp:
            s += " sp"
        if self.async_tp:
            s += " atp"
        if self.ep != 1:
            s += f" ep{self.ep}"
        if self.cp > 1:
            s += f" cp{self.cp}"
        return s


@dataclass(frozen=True)
class StageLayer:
    name: str
    strategy: Strategy = Strategy()


@dataclass
class Stage:
    devices: list[int]
    layers: list[StageLayer]

    def dp(self, layer: StageLayer) -> int:
        return len(self.devices) // (layer.strategy.tp * layer.strategy.cp)

    def tp_groups(self, tp: int) -> list[list[int]]:
        return [self.devices[i:i + tp] for i in range(0, len(self.devices), tp)]

    @property
    def layer_names(self) -> list[str]:
        return [ly.name for ly in self.layers]


@dataclass
class Pipeline:
    batch_share: int
    micro_batch_size: int
    num_microbatches: int
    stages: list[Stage]  # with virtual_stages v: the p * v model chunks, chunk k on chunk k mod p's devices
    virtual_stages: int = 1

    @property
    def num_stages(self) -> int:
        """Physical stages p (chunks / virtual_stages; all chunks when the count does not divide)."""
        v = self.virtual_stages
        return len(self.stages) // v if _is_divisor(v, len(self.stages)) else len(self.stages)

    @property
    def physical_stages(self) -> list[Stage]:
        """The first chunk of each physical stage (the stage list itself without interleaving)."""
        return self.stages[:self.num_stages]

    @property
    def devices(self) -> list[int]:
        return list(itertools.chain.from_iterable(st.devices for st in self.physical_stages))


def _is_divisor(v: object, n: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and n % v == 0


@dataclass
class ModelRef:
    """Enough to rebuild the ModelSpec: ``source`` is a zoo name, a HF config path or ``pkg.mod:factory``."""

    name: str
    seq_len: int
    num_layers: int
    source: str = ""


@dataclass
class Plan:
    model: ModelRef
    cluster: Cluster
    global_batch_size: int
    pipelines: list[Pipeline]
    schedule: str = "1f1b"
    memory_budget_gib: float | None = None  # per-device cap; None: each device's own memory
    predicted: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise AutoparError("schedule", f"unknown schedule {self.schedule!r}", f"use one of {', '.join(SCHEDULES)}")

    @property
    def precision(self) -> str:
        """The training precision (``cost_models.precision``): the one its cluster's GPUs compute at, so a
        plan derived from another (baselines, sub-clusters) keeps it; absent from a plan file = bf16."""
        return self.cluster.precision

    @property
    def stages(self) -> list[Stage]:
        return [st for p in self.pipelines for st in p.stages]

    @property
    def devices(self) -> list[int]:
        return list(itertools.chain.from_iterable(p.devices for p in self.pipelines))

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def placements(self, layer_name: str) -> list[tuple[int, int, StageLayer]]:
        """(pipeline index, stage index, StageLayer) for every place ``layer_name`` runs."""
        out = []
        for pi, p in enumerate(self.pipelines):
            for si, st in enumerate(p.stages):
                for ly in st.layers:
                    if ly.name == layer_name:
                        out.append((pi, si, ly))
        return out
