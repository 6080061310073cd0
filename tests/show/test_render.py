"""Every picture renders for a homogeneous and a heterogeneous plan, as PNG, SVG and HTML, through the CLI too."""

from __future__ import annotations

import re

import pytest

from autopar.cli import main
from autopar.show.page import plan_page
from autopar.show.render import plan_pictures, stacked

PNG = b"\x89PNG\r\n\x1a\n"


def test_each_picture_renders_alone(drawn):
    pictures = plan_pictures(drawn.plan, drawn.model, drawn.est, drawn.params)
    assert [p.name for p in pictures] == ["timeline", "memory", "cluster"]
    for p in pictures:
        assert p.height > 0.5
        assert stacked([p], "png").startswith(PNG)


def test_stacked_png_and_svg(drawn):
    pictures = plan_pictures(drawn.plan, drawn.model, drawn.est, drawn.params)
    assert stacked(pictures, "png").startswith(PNG)
    svg = stacked(pictures, "svg").decode()
    assert svg.count("<svg") == 1 and "pipeline schedule per stage" in svg and "cluster map" in svg


def test_html_page_holds_each_picture_as_inline_svg(drawn):
    page = plan_page(drawn.plan, drawn.est, plan_pictures(drawn.plan, drawn.model, drawn.est, drawn.params), "t")
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 3
    assert "<?xml" not in page and "<img" not in page and "<script" not in page  # self-contained
    for name in ("timeline", "memory", "cluster"):
        assert f'id="{name}"' in page


@pytest.mark.parametrize("ext", [".png", ".svg", ".html"])
def test_show_writes_each_format(drawn, tmp_path, capsys, ext):
    out = tmp_path / f"plan{ext}"
    assert main(["show", drawn.path, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    data = out.read_bytes()
    assert data.startswith(PNG) if ext == ".png" else b"<svg" in data


def test_search_report_page(tmp_path, capsys):
    plan, report = tmp_path / "p.yaml", tmp_path / "r.html"
    argv = ["search", "--model", "gpt3-1.3b", "--cluster", "8xA100-80G", "--global-batch-size", "16", "--seq-len", "512",
            "-o", str(plan), "--report", str(report)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"wrote {report}" in out
    assert re.search(r"^search: \d+\.\d s \(plan\) \+ \d+\.\d s \(baselines\), ", out, re.M), out
    page = report.read_text()
    assert page.count("<svg") == 4  # timeline, memory, cluster, baselines
    for text in ("Why it won", "zero3", "megatron", "pruned", "dominated", "(plan) +"):
        assert text in page, text
