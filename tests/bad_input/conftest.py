"""Fixtures of the bad-input suite: a searched plan, and a plan searched with the session's quick profile."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from autopar.cli import main
from tests.bad_input.harness import SEARCH


@pytest.fixture(scope="session")
def docs(tmp_path_factory, tiny_profile) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("bad_docs")
    assert main(SEARCH + ["-o", str(d / "plan.yaml"), "--json"]) == 0
    assert main(["search", "--model", "gpt-tiny", "--cluster", "1x2xcpu", "--global-batch-size", "8",
                 "--no-baselines", "--profile", str(tiny_profile), "-o", str(d / "pplan.yaml"), "--json"]) == 0
    return SimpleNamespace(plan=yaml.safe_load((d / "plan.yaml").read_text()),
                           pplan=yaml.safe_load((d / "pplan.yaml").read_text()),
                           profile=str(tiny_profile), profile_doc=yaml.safe_load(tiny_profile.read_text()))
