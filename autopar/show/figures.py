"""The pictures of a plan drawn with matplotlib (Agg, no pyplot state): the pipeline timeline, memory per
device and autopar against the baselines. Each ``draw_*`` draws into a figure or sub-figure it is
given; each ``*_height`` says how many inches that picture needs, so labels stay legible at any size.
"""

from __future__ import annotations

from collections import OrderedDict

from autopar.plan.rules import id_ranges
from autopar.show.memory import PARTS, StageMemory
from autopar.show.timeline import KINDS, Timeline, kind_totals

WIDTH = 11.0  # inches: every picture has this width
KIND_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "recompute": "#DD8452", "p2p": "#8172B3",
               "grad sync": "#C44E52", "bubble": "#E6E6E6"}
PART_COLORS = {"parameters": "#4C72B0", "gradients": "#64B5CD", "optimizer states": "#8172B3",
               "model states": "#4C72B0", "activations": "#55A868", "transient": "#DD8452", "reserve": "#A0A0A0"}
MAX_ROW_LABELS = 64  # rows beyond this are drawn but labelled every k-th
FONT = 8
TOP_IN, BOTTOM_IN = 0.85, 0.5  # inches above the axes (title, legend) and below them (axis label)


def axes_in(fig, height: float, left: float, right: float = 0.97, top_in: float = TOP_IN,
            bottom_in: float = BOTTOM_IN):
    """Axes in ``fig`` (``height`` inches tall) with margins in inches above and below, so a title, a
    legend and an axis label keep their room whatever the picture's height."""
    return fig.add_axes((left, bottom_in / height, right - left, 1 - (top_in + bottom_in) / height))


def head(fig, height: float, title: str, handles: list) -> None:
    """The picture's title on its first line and its legend on the second, right-aligned."""
    fig.suptitle(title, fontsize=FONT + 1, x=0.02, y=1 - 0.08 / height, ha="left", va="top")
    if handles:
        fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=FONT - 1, frameon=False,
                   bbox_to_anchor=(0.99, 1 - 0.3 / height))


def devices_label(devices: list[int]) -> str:
    """'0-7 (8)' for a run of devices; long lists keep their first ranges."""
    text = id_ranges(devices, ",")
    if len(text) > 24:
        text = text[:21] + "..."
    return f"{text} ({len(devices)})"


# -- (1) pipeline timeline -------------------------------------------------------------------------
def timeline_height(tl: Timeline) -> float:
    return TOP_IN + BOTTOM_IN + 0.3 + 0.28 * min(len(tl.rows), 80)


def draw_timeline(fig, tl: Timeline, title: str) -> None:
    """One row per stage (pipeline p, stage s), coloured segments per kind, the step marked."""
    height = timeline_height(tl)
    ax = axes_in(fig, height, 0.17, 0.95)
    n = len(tl.rows)
    end = max(tl.step_s, tl.simulated_s)
    for y, row in enumerate(tl.rows):
        by_kind: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
        for kind, a, b, _ in row.segments:
            by_kind[kind].append((a, b - a))
        for kind in KINDS:
            if by_kind[kind]:
                ax.broken_barh(by_kind[kind], (y - 0.4, 0.8), facecolors=KIND_COLORS[kind], linewidth=0)
        if n <= 16:
            _label_microbatches(ax, row, y, end)
    step = f"{tl.step_s:.4g} s"
    ax.axvline(tl.step_s, color="black", linewidth=1.2)
    ax.text(tl.step_s, -0.55, f"step {step} (estimate)", fontsize=FONT, va="bottom", ha="right")
    differs = abs(tl.simulated_s - tl.step_s) > tl.step_s * 0.002
    if differs:
        ax.axvline(tl.simulated_s, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlim(0, end * 1.005)
    ticks_within(ax)
    ax.set_ylim(n - 0.5, -0.5)
    labels = [f"p{r.pipeline} s{r.stage}  dev {devices_label(r.devices)}" for r in tl.rows]
    _row_ticks(ax, labels)
    note = "" if not differs else (f"; dotted: the simulated schedule ends at {tl.simulated_s:.4g} s "
                                   f"({tl.simulated_s / tl.step_s - 1:+.1%}: the estimate's closed form approximates it)")
    ax.set_xlabel(f"seconds into the step{note}", fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    totals = [kind_totals(r) for r in tl.rows]
    idle = sum(t["bubble"] for t in totals) / max(sum(sum(t.values()) for t in totals), 1e-30)
    head(fig, height, f"{title}: pipeline schedule per stage, {idle:.0%} idle",
         [_patch(KIND_COLORS[k], k) for k in KINDS])


def ticks_within(ax) -> None:
    """Keep only the x ticks inside the view (matplotlib keeps, undrawn, labels for ticks past its ends)."""
    lo, hi = ax.get_xlim()
    ax.set_xticks([t for t in ax.get_xticks() if lo <= t <= hi])


def _label_microbatches(ax, row, y: float, end: float) -> None:
    """Micro-batch numbers inside forward/backward segments wide enough to hold them."""
    for kind, a, b, k in row.segments:
        if kind in ("forward", "backward") and k >= 0 and (b - a) > end * 0.018:
            ax.text((a + b) / 2, y, str(k), fontsize=FONT - 2, ha="center", va="center", color="white")


def _row_ticks(ax, labels: list[str]) -> None:
    step = max(1, -(-len(labels) // MAX_ROW_LABELS))
    ax.set_yticks(range(0, len(labels), step))
    ax.set_yticklabels(labels[::step], fontsize=FONT if len(labels) <= 40 else FONT - 2)


def _patch(color: str, label: str, edge: str = "none"):
    from matplotlib.patches import Patch

    return Patch(facecolor=color, edgecolor=edge, label=label)


# -- (2) memory per device ------------------------------------------------------------------------
def memory_groups(mems: list[StageMemory]) -> list[tuple[str, StageMemory, int]]:
    """Stages with equal GPU, parts and budget folded into one bar: (label, a representative, devices)."""
    groups: OrderedDict = OrderedDict()
    for s in mems:
        key = (s.gpu, round(s.budget_gib, 3), tuple(round(s.parts[p], 3) for p in PARTS))
        groups.setdefault(key, []).append(s)
    out = []
    for members in groups.values():
        devices = sorted(d for s in members for d in s.devices)
        names = [f"p{s.pipeline} s{s.stage}" for s in members]
        who = names[0] if len(names) == 1 else f"{names[0]} +{len(names) - 1} stages"
        out.append((f"{who}  dev {devices_label(devices)} {members[0].gpu}", members[0], len(devices)))
    return out


def memory_height(mems: list[StageMemory]) -> float:
    return TOP_IN + BOTTOM_IN + 0.2 + 0.3 * min(len(memory_groups(mems)), 80)


def draw_memory(fig, mems: list[StageMemory], title: str) -> None:
    """Horizontal stacked bars per stage (its every device), the device's budget marked."""
    groups = memory_groups(mems)
    n = len(groups)
    height = memory_height(mems)
    ax = axes_in(fig, height, 0.3)
    used = [p for p in PARTS if any(g[1].parts[p] > 0 for g in groups)]
    for y, (_, s, _) in enumerate(groups):
        left = 0.0
        for part in used:
            v = s.parts[part]
            ax.barh(y, v, left=left, height=0.7, color=PART_COLORS[part], linewidth=0)
            left += v
        ax.plot([s.budget_gib, s.budget_gib], [y - 0.45, y + 0.45], color="black", linewidth=1.5)
        ax.text(left, y, f" {s.total_gib:.1f} / {s.budget_gib:.0f} GiB", fontsize=FONT - 1, va="center")
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, max(max(g[1].budget_gib, g[1].summed_gib) for g in groups) * 1.22)
    ticks_within(ax)
    _row_ticks(ax, [g[0] for g in groups])
    ax.set_xlabel("GiB per device (black tick: the device's budget)", fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    head(fig, height, f"{title}: memory per device at its peak (one bar per stage; equal stages folded)",
         [_patch(PART_COLORS[p], p) for p in used])


# -- (4) autopar vs the baselines ------------------------------------------------------------------
def baselines_height(rows: list) -> float:
    return TOP_IN + BOTTOM_IN + 0.2 + 0.32 * len(rows)


def draw_baselines(fig, rows: list[tuple[str, float | None, float | None]], title: str) -> None:
    """``rows``: (name, step seconds, peak GiB per device; None where it does not fit), autopar first."""
    height = baselines_height(rows)
    axes = [axes_in(fig, height, 0.2, 0.56), None]
    axes[1] = axes_in(fig, height, 0.62, 0.97)
    axes[1].sharey(axes[0])
    axes[1].tick_params(labelleft=False)
    names = [r[0] for r in rows]
    best = rows[0][1]
    for ax, col, label in ((axes[0], 1, "step time, s (lower is better)"), (axes[1], 2, "peak GiB per device")):
        vals = [r[col] for r in rows]
        top = max((v for v in vals if v is not None), default=1.0)
        for y, v in enumerate(vals):
            color = "#4C72B0" if y == 0 else "#A0A0A0"
            if v is None:
                ax.text(0, y, " does not fit", fontsize=FONT, va="center", color="#C44E52")
                continue
            ax.barh(y, v, height=0.6, color=color)
            extra = f"  (autopar {v / best:.2f}x faster)" if col == 1 and y and best else ""
            ax.text(v, y, f" {v:.4g}{extra}", fontsize=FONT - 1, va="center")
        ax.set_xlim(0, top * 1.35)
        ticks_within(ax)
        ax.set_xlabel(label, fontsize=FONT)
        ax.tick_params(labelsize=FONT)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].set_yticks(range(len(names)))
    axes[0].set_yticklabels(names, fontsize=FONT)
    axes[0].set_ylim(len(names) - 0.5, -0.5)
    head(fig, height, f"{title}: autopar against the baselines (same cost model)", [])
