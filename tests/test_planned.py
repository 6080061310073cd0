"""load_planned: the library's estimate of a loaded plan is the number the search wrote and the CLI prints."""

from __future__ import annotations

import json
import math

import pytest

from autopar.cli import main
from autopar.estimate import estimate_plan
from autopar.planned import load_planned
from cost_models import CostParams


def _search(tmp_path, capsys, *extra) -> tuple[str, dict]:
    out = tmp_path / "plan.yaml"
    rc = main(["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size", "8", "--no-baselines",
               "-o", str(out), "--json", *extra])
    assert rc == 0
    return str(out), json.loads(capsys.readouterr().out)["predicted"]


def _cli_estimate(path: str, capsys, *extra) -> dict:
    assert main(["estimate", path, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["predicted"]


@pytest.mark.parametrize("profiled, precision", [(False, "bf16"), (True, "bf16"), (False, "fp32")],
                         ids=["catalogue", "profiled", "fp32"])
def test_library_estimate_equals_the_plan_and_the_cli(tiny_profile, tmp_path, capsys, profiled, precision):
    path, searched = _search(tmp_path, capsys, "--precision", precision,
                             *(["--profile", str(tiny_profile)] if profiled else []))
    planned = load_planned(path)
    assert planned.plan.precision == precision
    assert precision != "fp32" or (planned.model.dtype_bytes, planned.params.param_bytes) == (4, 4)
    lib = estimate_plan(planned.plan, planned.model, planned.params).predicted()
    cli = _cli_estimate(path, capsys)
    for key in ("step_time_s", "tokens_per_s", "mfu", "max_memory_gib"):
        assert math.isclose(lib[key], searched[key], rel_tol=1e-12), key
        assert math.isclose(cli[key], searched[key], rel_tol=1e-12), key
        assert math.isclose(planned.plan.predicted[key], searched[key], rel_tol=1e-12), key


def test_profile_rebases_a_catalogue_plan_as_the_cli_does(tiny_profile, tmp_path, capsys):
    path, searched = _search(tmp_path, capsys)
    plan, model, params = load_planned(path, profile=tiny_profile)
    lib = estimate_plan(plan, model, params).predicted()
    cli = _cli_estimate(path, capsys, "--profile", str(tiny_profile))
    assert math.isclose(lib["step_time_s"], cli["step_time_s"], rel_tol=1e-12)
    assert not math.isclose(lib["step_time_s"], searched["step_time_s"], rel_tol=1e-3)  # measured numbers differ
    assert plan.search["profile"]["sha256"]


def test_estimate_plan_defaults_to_the_plans_own_cost_parameters(tiny_profile, tmp_path, capsys):
    """A profiled plan's figures come back from the plan alone: no CostParams to rebuild by hand."""
    path, searched = _search(tmp_path, capsys, "--profile", str(tiny_profile))
    planned = load_planned(path)
    assert planned.params.comm_fit  # the profile's measured fits travelled in the plan
    default = estimate_plan(planned.plan, planned.model)
    assert math.isclose(default.step_time_s, searched["step_time_s"], rel_tol=1e-12)
    catalogue = estimate_plan(planned.plan, planned.model, CostParams())
    assert not math.isclose(catalogue.step_time_s, searched["step_time_s"], rel_tol=1e-3)


def test_estimate_precision_rebases_a_plan_as_a_search_at_that_precision_would(tmp_path, capsys):
    """``estimate --precision fp32`` of a bf16 plan = the library at fp32 = the same plan searched at fp32."""
    bf16_path, bf16 = _search(tmp_path, capsys)
    rebased = _cli_estimate(bf16_path, capsys, "--precision", "fp32")
    planned = load_planned(bf16_path, precision="fp32")
    assert planned.plan.precision == "fp32" and planned.params.param_bytes == 4 and planned.model.dtype_bytes == 4
    lib = estimate_plan(*planned).predicted()
    assert math.isclose(lib["step_time_s"], rebased["step_time_s"], rel_tol=1e-12)
    assert rebased["step_time_s"] > bf16["step_time_s"]
    assert math.isclose(_cli_estimate(bf16_path, capsys)["step_time_s"], bf16["step_time_s"], rel_tol=1e-12)


def test_a_precision_with_a_profile_is_refused(tiny_profile, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["search", "--model", "gpt-tiny", "--cluster", "2xcpu", "--global-batch-size", "8",
                 "--no-baselines", "-o", str(out), "--profile", str(tiny_profile), "--precision", "fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autopar: error: precision: fp32 cannot be combined with a profile") and "\n" not in err
    assert not out.exists()
