"""The precision table: its rows agree with CostParams' defaults, its peaks are GPU fields, its bytes add up."""

from __future__ import annotations

from dataclasses import fields

from autopar.cli import build_parser
from autopar.cluster.cluster import GPUType
from cost_models import CostParams
from cost_models.precision import DEFAULT, NAMES, PEAK_COLUMNS, PRECISIONS, precision, with_precision


def test_the_default_row_is_costparams_defaults():
    """CostParams' byte counts describe bf16 mixed precision: the default precision leaves them as they are."""
    assert DEFAULT == "bf16"
    assert with_precision(CostParams(), PRECISIONS[DEFAULT]) == CostParams()


def test_every_peak_column_is_a_gpu_field_and_every_row_names_one():
    gpu_fields = {f.name for f in fields(GPUType)}
    assert set(PEAK_COLUMNS) <= gpu_fields
    assert PEAK_COLUMNS[0] == "tflops"  # the catalogue's required column: bf16/fp16
    assert {p.peak for p in PRECISIONS.values()} == set(PEAK_COLUMNS)


def test_rows_state_their_bytes_consistently():
    for p in PRECISIONS.values():
        assert precision(p.name) is p
        assert p.param_bytes == p.act_bytes  # compute dtype: activations and the parameters used in GEMMs
        assert p.grad_comm_bytes >= p.param_bytes  # reduced at least in the compute dtype
    bf16, fp32 = PRECISIONS["bf16"], PRECISIONS["fp32"]
    assert bf16.state_bytes == 2 + 4 + 4 + 4 + 4  # bf16 param, fp32 grad, fp32 master + m + v
    fp16 = PRECISIONS["fp16"]
    assert (fp16.state_bytes, fp16.grad_bytes) == (2 + 2 + 4 + 4 + 4 + 4, 2)  # + fp32 main-grad copy
    assert fp32.state_bytes == 4 + 4 + 4 + 4  # fp32 param + grad + m + v, no master copy
    assert PRECISIONS["fp8"].act_bytes == bf16.act_bytes and PRECISIONS["fp8"].state_bytes == bf16.state_bytes
    assert PRECISIONS["tf32"].act_bytes == fp32.act_bytes and PRECISIONS["tf32"].peak == "tflops_tf32"
    assert precision("fp64") is None


def test_with_precision_sets_only_the_byte_counts():
    base = CostParams(eff_max=0.5, reserve_gib=3.0)
    out = with_precision(base, PRECISIONS["fp32"])
    assert (out.param_bytes, out.grad_comm_bytes, out.state_bytes, out.grad_bytes) == (4, 4, 16, 4)
    assert (out.eff_max, out.reserve_gib, out.opt_bytes_touched) == (0.5, 3.0, base.opt_bytes_touched)


def test_the_cli_offers_exactly_the_table():
    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices
    for cmd in ("search", "estimate"):
        opt = next(a for a in sub[cmd]._actions if a.dest == "precision")
        assert tuple(opt.choices) == NAMES
