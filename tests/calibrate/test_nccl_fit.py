"""The fit of nccl-tests tables: tables generated from a known formula (in nccl-tests' exact text) give
that formula's parameters back, through the reader; published tables give the figures they print."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autopar.calibrate.nccl_fit import Links, alpha_beta, bus_factor, calibrate_tables, charged
from autopar.calibrate.nccl_tests import read_nccl_tests
from autopar.errors import AutoparError
from cost_models import CostParams
from tests.calibrate.nccl_synthetic import SIZES, nccl_text

REF = Links(intra_bw_gbps=300.0, intra_lat_us=3.0, inter_bw_gbps=200.0, inter_lat_us=5.0)  # A100 defaults
HBM = 2039.0


def _tables(tmp_path, name: str, collective: str, hosts: list[str], time_s, sizes=SIZES):
    p = tmp_path / name
    p.write_text(nccl_text(collective, hosts, time_s, sizes))
    return read_nccl_tests(str(p))


def test_alpha_beta_recovered_from_a_generated_table(tmp_path):
    alpha, beta = 23e-6, 1 / 45e9
    (t,) = _tables(tmp_path, "ar.txt", "allreduce", ["h"] * 4, lambda s: alpha + beta * s)
    cal = calibrate_tables([t], REF, HBM)
    (c, n, a, b), = cal.comm_fit
    assert (c, n) == ("allreduce", 4)
    assert a == pytest.approx(alpha, rel=0.01) and b == pytest.approx(beta, rel=0.01)
    fit = cal.fits[0]
    assert fit.busbw_gbps == pytest.approx(45 * 2 * 3 / 4, rel=0.01) and fit.rel_rms < 0.01
    assert bus_factor("allgather", 8) == 7 / 8 and bus_factor("sendrecv", 2) == 1.0
    # the calibrated time of a one-host all-reduce is the row itself (no gamma term on top), as the estimate charges
    got = charged(t, [1 << 20], cal.links(REF), cal.params(CostParams()), HBM)
    assert got[0] == pytest.approx(a + b * (1 << 20), rel=1e-12)


def test_the_fit_is_robust_to_one_odd_size():
    sizes = np.array(SIZES, dtype=float)
    times = 20e-6 + sizes / 40e9
    times[14] *= 10  # one size hit by something else
    a, b, _ = alpha_beta(sizes, times)
    assert a == pytest.approx(20e-6, rel=0.03) and b == pytest.approx(1 / 40e9, rel=0.03)


def test_tables_of_one_collective_and_size_pool_into_one_row(tmp_path):
    t1 = _tables(tmp_path, "a.txt", "allgather", ["h"] * 8, lambda s: 10e-6 + s / 100e9, SIZES[:14])
    t2 = _tables(tmp_path, "b.txt", "allgather", ["h"] * 8, lambda s: 10e-6 + s / 100e9, SIZES[14:])
    cal = calibrate_tables(t1 + t2, REF, HBM)
    assert len(cal.comm_fit) == 1 and cal.comm_fit[0][:2] == ["allgather", 8]
    assert cal.comm_fit[0][3] == pytest.approx(1 / 100e9, rel=0.01)
    assert cal.link is None and cal.inter_link is None


def test_links_recovered_through_the_cost_model_formulas(tmp_path):
    """One-host sendrecv fixes the intra-node link; multi-host tables, priced with it, the network."""
    true = Links(intra_bw_gbps=40.0, intra_lat_us=6.0, inter_bw_gbps=50.0, inter_lat_us=8.0)
    sr = _tables(tmp_path, "sendrecv_perf.txt", "sendrecv", ["h"] * 2, lambda s: 6e-6 + s / 40e9)
    two_hosts = ["a"] * 4 + ["b"] * 4
    tables = sr
    for c in ("allreduce", "allgather", "reduce_scatter"):
        probe = read_nccl_tests(str(_write(tmp_path, c, two_hosts)))[0]
        tables += _tables(tmp_path, f"{c}.txt", c, two_hosts,
                          lambda s, p=probe: float(charged(p, [s], true, CostParams(), HBM)[0]))
    cal = calibrate_tables(tables, REF, HBM)
    assert cal.link["bw_gbps"] == pytest.approx(40.0, rel=0.01) and cal.link["lat_us"] == pytest.approx(6.0, rel=0.02)
    assert cal.inter_link["bw_gbps"] == pytest.approx(50.0, rel=0.02)
    assert cal.inter_link["lat_us"] == pytest.approx(8.0, rel=0.05)
    assert cal.comm_fit == [] and all(f.applied for f in cal.fits)


def _write(tmp_path, collective: str, hosts: list[str]) -> Path:
    p = tmp_path / f"probe_{collective}.txt"
    p.write_text(nccl_text(collective, hosts, lambda s: 1e-5 + s / 1e10, SIZES[:3]))
    return p


def test_sendrecv_over_hosts_needs_one_gpu_per_host(tmp_path):
    t = _tables(tmp_path, "sr.txt", "sendrecv", ["a", "a", "b", "b"], lambda s: 1e-5 + s / 1e10)
    with pytest.raises(AutoparError, match=r"sr.txt devices: sendrecv over 2 hosts with 2 GPUs on each"):
        calibrate_tables(t, REF, HBM)


def test_published_pcie_table_far_slower_than_the_catalogue_assumes():
    """8 RTX 5090 on PCIe (data/): about 26 us per all-reduce at small sizes and 46 GB/s bus bandwidth at large
    ones, where nccl-tests itself prints 45.70 at 32 MiB."""
    (t,) = read_nccl_tests(str(Path(__file__).with_name("data") / "all_reduce_perf_rtx5090_1x8.txt"))
    cal = calibrate_tables([t], Links(16.0, 10.0, 12.5, 30.0), 1792.0)
    fit = cal.fits[0]
    assert 22e-6 < fit.alpha_s < 30e-6 and 40 < fit.busbw_gbps < 50
