"""``-o`` outputs (autopar.fileio): regular files only, symlinks written through, the umask honoured, no
temporary file left behind by an error or a kill before the rename; and the CLI's quiet edges
(BrokenPipe, a factory's prints kept off ``--json``, ``launch --force``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autopar.cli import main
from autopar.errors import AutoparError
from autopar.fileio import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ["search", "--model", "gpt3-1.3b", "--cluster", "2x4xA100-80G", "--global-batch-size", "16",
          "--seq-len", "512", "--no-baselines", "--json"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}


def test_symlink_is_written_through(tmp_path):
    target = tmp_path / "real.yaml"
    target.write_text("old")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    write_text_atomic(link, "new", "plan")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "made.yaml")
    write_text_atomic(dangling, "x", "plan")
    assert dangling.is_symlink() and (tmp_path / "made.yaml").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.yaml", "link.yaml", "made.yaml", "real.yaml"]


@pytest.mark.parametrize("path, kind", [("/dev/full", "a device"), ("/dev/null", "a device"), (".", "a directory")])
def test_devices_and_directories_are_refused(path, kind):
    with pytest.raises(AutoparError, match=rf"^plan: {path} is {kind}; only regular files are written"):
        write_text_atomic(path, "x", "plan")
    assert Path("/dev/null").is_char_device()


def test_new_files_honour_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    old = os.umask(0o077)
    try:
        assert main(SEARCH + ["-o", str(tmp_path / "p.yaml")]) == 0
        assert (tmp_path / "p.yaml").stat().st_mode & 0o777 == 0o600
        os.umask(0o002)
        assert write_text_atomic(tmp_path / "q.yaml", "x", "plan").stat().st_mode & 0o777 == 0o664
        (tmp_path / "q.yaml").chmod(0o640)
        write_text_atomic(tmp_path / "q.yaml", "y", "plan")
        assert (tmp_path / "q.yaml").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_an_error_before_the_rename_leaves_no_temporary_file(tmp_path, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(AutoparError, match="No space left on device"):
        write_text_atomic(tmp_path / "p.yaml", "x", "plan")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_kill_just_before_the_rename_leaves_no_temporary_file(tmp_path, sig):
    code = ("import os, signal, sys\n"
            "from autopar.cli import main\n"
            f"os.replace = lambda a, b: os.kill(os.getpid(), signal.{sig})\n"
            f"sys.exit(main({SEARCH + ['-o', str(tmp_path / 'p.yaml')]!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 128 + getattr(signal, sig), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_broken_pipe_is_quiet():
    # stdout is a pipe whose reader has gone (what `autopar list gpus | head -1` becomes once head exits)
    code = ("import os, sys\nr, w = os.pipe()\nos.close(r)\nos.dup2(w, 1)\n"
            "from autopar.cli import main\nsys.exit(main(['list', 'gpus']))\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr) == (141, "")


def test_factory_prints_stay_off_json_stdout(tmp_path, capsys, monkeypatch):
    (tmp_path / "chatty_models.py").write_text(
        "import torch\nfrom torch import nn\nprint('importing chatty')\n"
        "def mlp():\n    print('building')\n    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))\n"
        "def example_input():\n    return torch.zeros(4, 32)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["search", "--model", "chatty_models:mlp", "--cluster", "2xcpu", "--global-batch-size", "8",
               "-o", "p.yaml", "--json", "--no-baselines"])
    got = capsys.readouterr()
    assert rc == 0
    assert json.loads(got.out)["plan"] == "p.yaml"  # stdout is the one JSON object
    assert "importing chatty" in got.err and "building" in got.err


def test_launch_force_writes_an_over_budget_plan(tmp_path, capsys):
    assert main(SEARCH + ["-o", str(tmp_path / "p.yaml")]) == 0
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    doc["global_batch_size"] = 1024
    doc["pipelines"][0].update(batch_share=1024, micro_batch_size=1024)
    del doc["predicted"]  # a hand-edited plan states no figures (stale ones would be refused as tampered)
    (tmp_path / "over.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "t.py").write_text("")
    argv = ["launch", str(tmp_path / "over.yaml"), "--script", str(tmp_path / "t.py"), "-o", str(tmp_path / "L")]
    capsys.readouterr()
    assert main(argv) == 2
    assert "exceeds the budget" in capsys.readouterr().err and not (tmp_path / "L").exists()
    assert main(argv + ["--force"]) == 0
    assert (tmp_path / "L" / "node1.sh").is_file()
