"""What the profiler takes off a measured unit call is exactly what the estimate adds to compute.

A sample made by the cost model itself (its fwd + bwd on the profiled machine, as ``apply_profile``
builds it) minus ``MachineComm.charged_s`` must leave the model's compute, for TP (with full
recomputation), ZeRO-3 with nothing hidden (CPU) and ZeRO-3 hidden by prefetch (GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.estimate import StageContext, layer_costs
from autopar.modelspec.spec import LayerSpec
from autopar.plan.schema import Strategy
from autopar.profile.charged import MachineComm, comm_fields
from cost_models import CostParams
from cost_models.layer import compute_times, strategy_arrays

BLOCK = LayerSpec("layers.0", "block", params=1_000_000, tp_params=900_000, flops=2e9, attn_core_flops=3e8,
                  act_tp_bytes=1e6, boundary_bytes=1e5, tp_divisors=(4,), tp_comm_bytes=2e5, tp_collectives=2,
                  tp_plan="gpt.block")
HBM, LINK_GBPS, LINK_US = 20e9, 8.0, 30.0
FITS = {2: {"allreduce": {"alpha_s": 1e-4, "beta_s_per_byte": 2e-9},
            "allgather": {"alpha_s": 5e-5, "beta_s_per_byte": 1e-9},
            "reduce_scatter": {"alpha_s": 6e-5, "beta_s_per_byte": 1.5e-9}}}
COMM = {"fits": FITS, "link": {"bw_gbps": LINK_GBPS, "lat_us": LINK_US}}


def _model_sample(strategy: Strategy, rows: int, world: int, device: str, fits=FITS) -> tuple[dict, float]:
    """(sample row as the model predicts it, the model's compute seconds) on the profiled machine."""
    params = CostParams(eff_max=0.3, layer_overhead_s=2e-4, act_traffic=0.0,  # as a profile sets it
                        **comm_fields(fits, 4, device))
    gpu = GPUType("cpu", memory_gib=64, tflops=10.0, hbm_gbps=HBM / 1e9)
    cluster = Cluster([Node(gpu, world, intra_bw_gbps=LINK_GBPS, intra_lat_us=LINK_US)])
    dp = world // strategy.tp
    ctx = StageContext(cluster, tuple(range(world)), rows * dp, 1, params)
    lc = layer_costs(BLOCK, [strategy], ctx)
    tp, zero, ckpt, _ = strategy_arrays([strategy])
    f, b = compute_times(BLOCK, tp, zero, ckpt, np.array([float(dp)]), np.array([float(rows)]), ctx.peak_flops,
                         params)
    row = {"mbs": rows, "tp": strategy.tp, "ckpt": strategy.ckpt, "zero": strategy.zero, "sp": strategy.sp,
           "fwd_s": float(lc.fwd[0]), "bwd_s": float(lc.bwd[0]), "flops": BLOCK.flops * rows,
           "flops_per_rank": BLOCK.flops * rows / strategy.tp,
           "recompute_flops": BLOCK.recompute_flops(strategy.ckpt) * rows / strategy.tp}
    return row, float(f[0] + b[0])


@pytest.mark.parametrize("strategy", [Strategy(tp=2), Strategy(tp=2, ckpt="full"), Strategy(tp=2, sp=True)])
def test_tp_collectives_come_off_exactly(strategy):
    row, compute = _model_sample(strategy, rows=4, world=2, device="cpu")
    machine = MachineComm.of(COMM, 4, "cpu", HBM, 2)
    assert row["fwd_s"] + row["bwd_s"] - machine.charged_s(BLOCK, row) == pytest.approx(compute, rel=1e-12)


@pytest.mark.parametrize("device,rows", [("cpu", 1), ("cpu", 8), ("cuda", 6), ("cuda", 64)])
def test_zero3_traffic_comes_off_as_the_model_exposes_it(device, rows):
    # cpu: nothing hidden; cuda: 6 rows hide the forward gather but not all of backward's traffic, 64 hide all
    row, compute = _model_sample(Strategy(zero=3), rows=rows, world=2, device=device)
    machine = MachineComm.of(COMM, 4, device, HBM, 2)
    assert row["fwd_s"] + row["bwd_s"] - machine.charged_s(BLOCK, row) == pytest.approx(compute, rel=1e-9)


def test_a_call_the_traffic_alone_explains_is_all_traffic():
    # Fully exposed even with prefetch: the time is 2 gathers + a reduce-scatter whatever the compute, so
    # the sample says nothing about compute and everything is taken off (the fit floors what is left).
    row, _ = _model_sample(Strategy(zero=3), rows=1, world=2, device="cuda")
    ag = 5e-5 + 1e-9 * 4e6
    rs = 6e-5 + 1.5e-9 * 4e6
    assert row["fwd_s"] + row["bwd_s"] == pytest.approx(2 * ag + rs, rel=1e-12)
    assert MachineComm.of(COMM, 4, "cuda", HBM, 2).charged_s(BLOCK, row) == pytest.approx(2 * ag + rs, rel=1e-12)


def test_groups_without_a_fit_use_the_formula_with_gamma():
    fits = {4: FITS[2]}  # nothing measured for groups of 2
    row, compute = _model_sample(Strategy(zero=3), rows=2, world=2, device="cpu", fits=fits)
    machine = MachineComm.of({"fits": fits, "link": COMM["link"]}, 4, "cpu", HBM, 2)
    assert row["fwd_s"] + row["bwd_s"] - machine.charged_s(BLOCK, row) == pytest.approx(compute, rel=1e-12)


def test_zero0_and_tp1_charge_nothing():
    row, _ = _model_sample(Strategy(), rows=4, world=2, device="cpu")
    assert MachineComm.of(COMM, 4, "cpu", HBM, 2).charged_s(BLOCK, row) == 0.0


def test_a_profile_prices_its_measured_link_as_measured():
    """The profile's link is measured, not a line rate: its collectives take no link efficiency on top, and its
    latency is a measured call's: no per-call cost on top either."""
    assert comm_fields(FITS, 4, "cuda")["link_efficiency"] == 1.0
    assert comm_fields(FITS, 4, "cuda")["collective_call_s"] == 0.0
    machine = MachineComm.of(COMM, 4, "cpu", HBM, 8)
    g = machine.links(4)  # no fit for 4 ranks: the formula over the measured link
    want = 3 / 4 * 1e6 / (LINK_GBPS * 1e9) + 3 * LINK_US * 1e-6
    assert machine.collectives.time("allgather", 1e6, g) == pytest.approx(want, rel=1e-12)
