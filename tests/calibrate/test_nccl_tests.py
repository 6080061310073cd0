"""The nccl-tests reader on published outputs (tests/calibrate/data, transcribed verbatim with their source)
and on the inputs it must refuse, each with one line naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.calibrate.nccl_tests import collective_of, read_nccl_tests
from autopar.errors import AutoparError
from tests.calibrate.nccl_synthetic import SIZES, nccl_text

DATA = Path(__file__).with_name("data")
OCI = DATA / "all_reduce_perf_oci_a100_2x8.txt"
RTX = DATA / "all_reduce_perf_rtx5090_1x8.txt"


def test_two_hosts_of_eight_a100_with_launcher_noise_and_no_collective_line():
    """The older header (no version line, no '# Collective test starting'): the collective from the file name."""
    (t,) = read_nccl_tests(str(OCI))
    assert (t.collective, t.ranks, t.n_nodes, t.n_local) == ("allreduce", 16, 2, 8)
    assert t.gpu == "NVIDIA A100-SXM4-40GB" and t.avg_busbw_gbps == pytest.approx(66.4834)
    assert len(t.rows) == 31 and [r.size for r in t.rows] == [8 << k for k in range(31)]
    first, last = t.rows[0], t.rows[-1]
    assert (first.time_s, first.inplace_s) == (pytest.approx(36.47e-6), pytest.approx(34.74e-6))
    assert (last.size, last.time_s, last.inplace_s) == (8589934592, pytest.approx(67689e-6), pytest.approx(67811e-6))
    assert t.hosts[:8] == ("nccl-allreduce-job0-mpiworker-0",) * 8


def test_one_host_of_eight_pcie_gpus_names_its_collective_and_has_no_footer():
    (t,) = read_nccl_tests(str(RTX))
    assert (t.collective, t.ranks, t.n_nodes, t.n_local, len(t.rows)) == ("allreduce", 8, 1, 8, 25)
    assert t.gpu == "NVIDIA GeForce RTX 5090" and t.avg_busbw_gbps is None
    assert t.rows[9].size == 4096 and t.rows[9].time_s == pytest.approx(36.29e-6)


def test_the_collective_given_on_the_command_line_wins(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text(OCI.read_text())
    with pytest.raises(AutoparError, match=r"out.txt collective: is not named.*all_reduce="):
        read_nccl_tests(str(p))
    assert read_nccl_tests(f"all_reduce={p}")[0].collective == "allreduce"
    assert collective_of("x/reduce_scatter_perf.log") == "reduce_scatter" and collective_of("perf.txt") is None


def test_mpirun_tagged_output_and_two_runs_in_one_file(tmp_path):
    one = nccl_text("allgather", ["a"] * 4, lambda s: 2e-5 + s / 1e11, SIZES[:10])
    two = nccl_text("reduce_scatter", ["a"] * 4, lambda s: 3e-5 + s / 1e11, SIZES[:12])
    p = tmp_path / "both.log"
    p.write_text("".join(f"[1,0]<stdout>:{line}\n" for line in (one + two).splitlines()))
    got = read_nccl_tests(str(p))
    assert [(t.collective, t.ranks, len(t.rows)) for t in got] == [("allgather", 4, 10), ("reduce_scatter", 4, 12)]


def _refused(tmp_path, text: str, name: str = "all_reduce_perf.txt") -> str:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(AutoparError) as e:
        read_nccl_tests(str(p))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_refusals_name_the_file_and_the_field(tmp_path):
    text = RTX.read_text()
    row = "        4096          1024     float     sum      -1    36.29    0.11    0.20       0"
    assert row in text
    assert ":32 #wrong: is 3" in _refused(tmp_path, text.replace(row + "    35.21", row[:-1] + "3    35.21"))
    assert ":32 size: is '40x6'" in _refused(tmp_path, text.replace("        4096          1024", "        40x6          1024"))
    assert ":32 algbw: is 9.11 GB/s" in _refused(tmp_path, text.replace(row, row.replace("  0.11", "  9.11")))
    assert "rows: holds no nccl-tests table" in _refused(tmp_path, "\n".join(text.splitlines()[:22]))
    assert "nGpus: holds runs over different GPU counts [8, 16]" in _refused(tmp_path, text + OCI.read_text())
    dup = text.replace("#  Rank  1 Group  0 Pid  27238 on", "#  Rank  0 Group  0 Pid  27238 on")
    assert "Rank: rank 0 is listed twice" in _refused(tmp_path, dup)
    assert "cputime: the run reports CPU time" in _refused(tmp_path, text.replace("   time   algbw", "cputime   algbw"))
    mixed = text.replace("device  7 [0000:f1:00] NVIDIA GeForce RTX 5090", "device  7 [0000:f1:00] NVIDIA RTX A6000")
    assert "device: mixes GPU types" in _refused(tmp_path, mixed)
    headless = "\n".join("#" if line.startswith("#       size") else line for line in text.splitlines())
    assert ":23 size: a table row comes before any column header" in _refused(tmp_path, headless)
    assert ":32 time (us): is 0.00" in _refused(tmp_path, text.replace(row, row.replace("36.29", " 0.00")))


def test_a_published_table_without_its_device_lines_is_refused():
    with pytest.raises(AutoparError, match=r"sendrecv_perf_a100_no_devices.txt devices: lists no"):
        read_nccl_tests(str(DATA / "sendrecv_perf_a100_no_devices.txt"))


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(AutoparError, match=r"^--nccl-tests: cannot read .*nope.txt"):
        read_nccl_tests(str(tmp_path / "nope.txt"))
