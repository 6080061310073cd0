"""(3) The cluster map: every node a box, every device a cell coloured by its pipeline and stage, TP
groups outlined (the degree most of a stage's layers use), and each pipeline's stage-to-stage links
drawn: red and dashed where they leave a node (inter-node links are the slow ones), the slowest
bandwidth the plan's stage links and data-parallel groups use named under the title."""

from __future__ import annotations

import math

from autopar.estimate.context import stage_link
from autopar.plan.schema import Plan
from autopar.show.figures import FONT, WIDTH, _patch, devices_label

PER_ROW = 8  # device cells per row inside a node box
MAX_CELLS_ACROSS = 96  # cells across the picture: at 11 inches, at least ~0.11 inch per cell
QUALITATIVE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
               "#CCB974", "#64B5CD", "#1F3A5F", "#9C5B2E", "#2E6B3A", "#7A2D2F", "#4B3F72", "#5C4A3A",
               "#B0558F", "#505050", "#8A7D2E", "#2F7F93")


def _layout(plan: Plan) -> tuple[int, int, int, float]:
    """(node box width and height in cells, columns of nodes, inches per cell)."""
    c = plan.cluster
    k = max(nd.count for nd in c.nodes)
    w, h = min(k, PER_ROW) + 1, math.ceil(k / PER_ROW) + 1
    cols = max(1, min(c.num_nodes, MAX_CELLS_ACROSS // w))
    if c.num_nodes > cols:  # balance the rows
        cols = math.ceil(c.num_nodes / math.ceil(c.num_nodes / cols))
    cell = min(0.4, (WIDTH - 0.6) / (cols * w))
    return w, h, cols, cell


TITLE_IN = 0.5
LEGEND_COLS = 4


def cluster_height(plan: Plan) -> float:
    return TITLE_IN + _map_inches(plan) + _legend_inches(plan)


def _map_inches(plan: Plan) -> float:
    w, h, cols, cell = _layout(plan)
    return math.ceil(plan.cluster.num_nodes / cols) * h * cell


def _legend_inches(plan: Plan) -> float:
    n = len(plan.stages)
    entries = (2 if n > len(QUALITATIVE) else n) + 1
    return 0.15 + 0.18 * math.ceil(entries / LEGEND_COLS)


def _colours(plan: Plan) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Device -> colour, and the legend: per stage (<= 20 stages), else per stage index of a pipeline."""
    out, legend = {}, []
    stages = [(pi, si, st) for pi, p in enumerate(plan.pipelines) for si, st in enumerate(p.stages)]
    if len(stages) <= len(QUALITATIVE):
        for j, (pi, si, st) in enumerate(stages):
            out.update(dict.fromkeys(st.devices, QUALITATIVE[j]))
            legend.append((QUALITATIVE[j], f"p{pi} s{si}: dev {devices_label(st.devices)}"))
        return out, legend
    from matplotlib import colormaps

    deepest = max(len(p.stages) for p in plan.pipelines)
    cmap = colormaps["viridis"]
    for _, si, st in stages:
        out.update(dict.fromkeys(st.devices, cmap(si / max(deepest - 1, 1))))
    legend = [(cmap(0.0), "stage 0 of each pipeline"), (cmap(1.0), f"stage {deepest - 1}")]
    return out, legend


def draw_cluster(fig, plan: Plan, title: str) -> None:
    """The cluster map of ``plan`` (see the module docstring)."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import FancyArrowPatch, Rectangle

    c = plan.cluster
    w, h, cols, cell = _layout(plan)
    rows = math.ceil(c.num_nodes / cols)
    height = cluster_height(plan)
    ax = fig.add_axes((0.03, _legend_inches(plan) / height, cols * w * cell / WIDTH, _map_inches(plan) / height))
    ax.set_xlim(0, cols * w)
    ax.set_ylim(rows * h, 0)
    ax.set_axis_off()
    colour, legend = _colours(plan)
    pos: dict[int, tuple[float, float]] = {}  # device -> cell's top-left corner
    zones = sorted({nd.zone for nd in c.nodes})
    few = c.num_devices <= 64
    boxes, cells = [], []  # one collection each: thousands of patches drawn as two artists
    for n, nd in enumerate(c.nodes):
        x0, y0 = (n % cols) * w, (n // cols) * h
        edge = QUALITATIVE[zones.index(nd.zone) % len(QUALITATIVE)] if len(zones) > 1 else "#606060"
        boxes.append(Rectangle((x0 + 0.1, y0 + 0.1), w - 0.2, h - 0.2, fill=False, edgecolor=edge, linewidth=0.8))
        name = f"n{n}" + (f" {nd.gpu.name}" if c.num_nodes <= 16 else "")
        if len(zones) > 1 and c.num_nodes <= 16:
            name += f" [{nd.zone}]"
        ax.text(x0 + 0.5, y0 + 0.55, name, fontsize=FONT - 1 if cell > 0.15 else FONT - 3, va="center")
        for j, d in enumerate(c.node_devices(n)):
            x, y = x0 + 0.5 + j % PER_ROW, y0 + 0.9 + j // PER_ROW
            pos[d] = (x, y)
            cells.append(Rectangle((x + 0.06, y + 0.06), 0.88, 0.88, facecolor=colour.get(d, "#FFFFFF"),
                                   edgecolor="#FFFFFF", linewidth=0.3))
            if few and cell >= 0.2:
                ax.text(x + 0.5, y + 0.5, str(d), fontsize=FONT - 2, ha="center", va="center", color="white")
    tp = _tp_outlines(plan, pos, Rectangle)
    for patches in (boxes, cells, tp):
        if patches:
            ax.add_collection(PatchCollection(patches, match_original=True))
    slow = _stage_links(ax, plan, pos, FancyArrowPatch)
    handles = [_patch(col, text) for col, text in legend]
    if tp:
        handles.append(_patch("white", "outlined: a TP group (most layers' degree)", "black"))
    fig.legend(handles=handles, loc="lower left", ncol=LEGEND_COLS, fontsize=FONT - 1, frameon=False,
               bbox_to_anchor=(0.02, 0.0))
    fig.suptitle(f"{title}: cluster map, {c.num_devices} devices in {c.num_nodes} nodes ({c.describe()})\n{slow}",
                 fontsize=FONT + 1, x=0.02, y=1 - 0.04 / height, ha="left", va="top")


def _tp_outlines(plan: Plan, pos: dict, Rectangle) -> list:
    """A black outline around each TP group of the TP degree most layers of each stage use."""
    out = []
    for st in plan.stages:
        degrees = [ly.strategy.tp for ly in st.layers]
        tp = max(set(degrees), key=lambda t: (degrees.count(t), t))
        if tp <= 1:
            continue
        for group in st.tp_groups(tp):
            xs = [pos[d][0] for d in group]
            ys = [pos[d][1] for d in group]
            out.append(Rectangle((min(xs) + 0.02, min(ys) + 0.02), max(xs) - min(xs) + 0.96,
                                 max(ys) - min(ys) + 0.96, fill=False, edgecolor="black", linewidth=0.9))
    return out


def _centre(devices: list[int], pos: dict) -> tuple[float, float]:
    return (sum(pos[d][0] for d in devices) / len(devices) + 0.5,
            sum(pos[d][1] for d in devices) / len(devices) + 0.5)


def _stage_links(ax, plan: Plan, pos: dict, FancyArrowPatch) -> str:
    """Arrows from each stage to the next; returns a sentence on the slowest links the plan uses."""
    c = plan.cluster
    arrows = [(p.stages[i].devices, p.stages[i + 1].devices) for p in plan.pipelines for i in range(len(p.stages) - 1)]
    inter = 0
    slowest = math.inf
    for src, dst in arrows:
        bw, _ = stage_link(c, src, dst)
        crosses = set(c.nodes_of(src)) != set(c.nodes_of(dst)) or len(set(c.nodes_of(src))) > 1
        inter += crosses
        slowest = min(slowest, bw)
        a, b = _centre(src, pos), _centre(dst, pos)
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=8, color="#C44E52" if crosses else "#303030",
                                     linestyle="--" if crosses else "-", linewidth=0.9, alpha=0.8,
                                     connectionstyle="arc3,rad=0.2", clip_on=False))
    dp_nodes = max(len(set(c.nodes_of(st.devices))) for st in plan.stages)
    parts = []
    if arrows:
        parts.append(f"{inter} of {len(arrows)} stage links leave a node (red, dashed)"
                     + (f", slowest {slowest / 1e9:.3g} GB/s" if inter else ""))
    if dp_nodes > 1:
        bw = min(c.group_links(st.devices)[2] for st in plan.stages)
        parts.append(f"data-parallel groups span up to {dp_nodes} nodes over {bw / 1e9:.3g} GB/s links")
    return "; ".join(parts) or "every stage inside one node"
