"""Session fixtures: one quick 2-process profile of gpt-tiny, written by the real CLI (profile and plan-loading tests)."""

from __future__ import annotations

import contextlib
import io

import pytest

from autopar.cli import main


@pytest.fixture(scope="session")
def tiny_profile(tmp_path_factory):
    """Path of a quick profile (gpt-tiny, 2 processes) written by ``autopar profile``."""
    path = tmp_path_factory.mktemp("profile") / "profile.yaml"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # the refusal, if any, goes into the failure's first line
        rc = main(["profile", "--model", "gpt-tiny", "--nproc", "2", "--quick", "-o", str(path), "--json"])
    assert rc == 0, f"autopar profile exited {rc}: {err.getvalue().strip()}"
    return path
