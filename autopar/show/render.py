"""Pictures into files: one PNG or SVG with the pictures stacked, or SVG text to inline in a page.

matplotlib is imported here only (``autopar show`` and ``search --report`` need it; nothing else
does) and always on its Agg backend, through ``Figure`` objects: no pyplot state, no display.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError
from autopar.estimate import PlanEstimate
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from cost_models import CostParams

FORMATS = (".png", ".svg", ".html")
INSTALL = "pip install 'autopar[show]'"
DPI = 100


@dataclass
class Picture:
    name: str  # timeline | memory | cluster | baselines
    height: float  # inches (the width is figures.WIDTH)
    draw: Callable  # draw(fig): into a Figure or SubFigure


def output_format(path: str, field: str = "-o") -> str:
    """The format of ``path`` by its extension (.png, .svg or .html); one line naming it otherwise."""
    ext = Path(path).suffix.lower()
    if ext not in FORMATS:
        raise AutoparError(field, f"cannot tell the format of {path!r} (extension {ext or 'none'})",
                           f"give a file ending in {', '.join(FORMATS)}")
    return ext


def need_matplotlib(field: str) -> None:
    """Refuse, in one line, when matplotlib is missing (the ``show`` extra)."""
    try:
        import matplotlib
    except ImportError:
        raise AutoparError(field, "needs matplotlib", INSTALL) from None
    matplotlib.use("Agg", force=True)


def undrawable(plan: Plan) -> str | None:
    """Why ``plan``'s pictures cannot be drawn (None: they can)."""
    if any(p.virtual_stages > 1 for p in plan.pipelines):
        return ("interleaved pipelines (virtual_stages > 1) are not drawn yet: the timeline, memory and cluster "
                "pictures place one stage per device group")
    return None


def plan_pictures(plan: Plan, model: ModelSpec, est: PlanEstimate, params: CostParams,
                  title: str | None = None) -> list[Picture]:
    """The timeline, memory and cluster pictures of ``plan``, from ``est`` (its estimate with ``params``);
    none for a plan ``undrawable`` refuses (a report then shows its tables only)."""
    from autopar.show import cluster_map, figures
    from autopar.show.memory import stage_memory
    from autopar.show.timeline import build_timeline

    if undrawable(plan) is not None:
        return []
    title = title or f"{model.name} on {plan.world_size} devices"
    tl = build_timeline(plan, model, est, params)
    mem = stage_memory(plan, model, est, params)
    return [Picture("timeline", figures.timeline_height(tl), lambda fig: figures.draw_timeline(fig, tl, title)),
            Picture("memory", figures.memory_height(mem), lambda fig: figures.draw_memory(fig, mem, title)),
            Picture("cluster", cluster_map.cluster_height(plan), lambda fig: cluster_map.draw_cluster(fig, plan, title))]


def baselines_picture(est: PlanEstimate, baselines: dict, title: str) -> Picture | None:
    """autopar against the baselines (None without baselines): step time and peak memory side by side."""
    from autopar.show import figures

    if not baselines:
        return None
    rows = [("autopar", est.step_time_s, est.max_memory_gib)]
    rows += [(name, v[1].step_time_s, v[1].max_memory_gib) if v else (name, None, None) for name, v in baselines.items()]
    return Picture("baselines", figures.baselines_height(rows), lambda fig: figures.draw_baselines(fig, rows, title))


def _figure(height: float):
    from matplotlib.figure import Figure

    from autopar.show.figures import WIDTH

    return Figure(figsize=(WIDTH, height))


def _save(fig, fmt: str) -> bytes:
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "autopar"}):
        fig.savefig(buf, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else {"Software": None})
    return buf.getvalue()


def stacked(pictures: list[Picture], fmt: str) -> bytes:
    """The pictures one under the other in one PNG or SVG (``fmt``: "png" or "svg")."""
    fig = _figure(sum(p.height for p in pictures))
    subs = fig.subfigures(len(pictures), 1, height_ratios=[p.height for p in pictures]) if len(pictures) > 1 else [fig]
    for sub, p in zip(subs, pictures):
        p.draw(sub)
    return _save(fig, fmt)


def inline_svg(picture: Picture) -> str:
    """One picture as an ``<svg>`` element (no XML prolog) to put in an HTML page."""
    fig = _figure(picture.height)
    picture.draw(fig)
    text = _save(fig, "svg").decode("utf-8")
    return text[text.index("<svg"):]
