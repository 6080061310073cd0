"""The bad-input contract, shared by every file of this suite: a refused command exits 2 with exactly one
stderr line ``autopar: error: ...``, nothing on stdout, no file written or changed, nothing injected.

A case is ``(d, docs) -> argv``: ``d`` is the test's folder (inputs go under ``d/in``; ``OUT`` in an
argument becomes ``d/out/x``), ``docs`` the fixtures' documents (``docs.plan``: a searched plan,
``docs.pplan``: a plan searched with a profile, ``docs.profile``: that profile's path)."""

from __future__ import annotations

from pathlib import Path

import yaml

from autopar.cli import main

SEARCH = ["search", "--model", "gpt3-1.3b", "--cluster", "2x4xA100-80G", "--global-batch-size", "16",
          "--seq-len", "512", "--no-baselines"]
NODE = {"gpu": "A100", "count": 4}


def copy(doc):
    return yaml.safe_load(yaml.safe_dump(doc))


def write(d: Path, name: str, text: str) -> str:
    path = d / "in" / name
    path.write_text(text)
    return str(path)


def edited(d: Path, doc: dict, edit, name: str = "bad.yaml") -> str:
    """``doc`` (deep-copied) after ``edit(doc)``, written under ``d/in``."""
    doc = copy(doc)
    edit(doc)
    return write(d, name, yaml.safe_dump(doc))


def setter(path: str, value):
    """An edit that sets the dotted ``path`` (list indices as numbers) to ``value``."""
    def edit(doc):
        *keys, last = path.split(".")
        node = doc
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


def deleter(path: str):
    def edit(doc):
        *keys, last = path.split(".")
        node = doc
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        del node[int(last) if isinstance(node, list) else last]
    return edit


def cluster_file(d: Path, doc) -> str:
    return write(d, "c.yaml", yaml.safe_dump(doc))


def search_on(cluster: str) -> list[str]:
    return [*SEARCH[:3], "--cluster", cluster, *SEARCH[5:], "-o", "OUT"]


def _listing(d: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in d.rglob("*") if not p.is_symlink()}


def check_refused(build, docs, tmp_path: Path, capsys, monkeypatch) -> str:
    """Run the case; assert the contract; return the error line."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "in")
    monkeypatch.syspath_prepend(str(tmp_path / "in"))
    argv = [a.replace("OUT", str(tmp_path / "out" / "x")) for a in build(tmp_path, docs)]
    before = _listing(tmp_path)
    capsys.readouterr()
    rc = main(argv)
    got = capsys.readouterr()
    lines = got.err.splitlines()
    assert rc == 2, (rc, got.err)
    assert len(lines) == 1 and lines[0].startswith("autopar: error: "), got.err
    assert got.out == ""
    assert _listing(tmp_path) == before, "a refused command wrote or changed a file"
    assert not (tmp_path / "in" / "PWNED").exists()
    return lines[0]
