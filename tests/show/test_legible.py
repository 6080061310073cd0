"""Legible at 8, 64 and 1024 devices: no two labels of a picture overlap, none leaves the picture, none is
smaller than 5 points. Texts are measured by matplotlib's own renderer (Agg) after drawing."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from autopar.cluster import load_cluster
from autopar.estimate import estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.show.render import _figure, plan_pictures
from cost_models import CostParams


def uniform_plan(model, cluster, p: int, tp: int, m: int, mbs: int) -> Plan:
    """One pipeline of ``p`` equal device groups, the layers split evenly; blocks at ``tp``, ZeRO-3, full recompute."""
    n = cluster.num_devices // p
    stages = []
    for i, part in enumerate(np.array_split(np.arange(model.num_layers), p)):
        layers = []
        for j in part:
            ly = model.layers[j]
            t = tp if ly.supports_tp and ly.tp_ok(tp) else 1
            layers.append(StageLayer(ly.name, Strategy(t, 3, "full" if ly.kind == "block" else "none")))
        stages.append(Stage(list(range(i * n, (i + 1) * n)), layers))
    return Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.name), cluster, m * mbs,
                [Pipeline(m * mbs, mbs, m, stages)])


def clashes(picture) -> list[str]:
    fig = _figure(picture.height)
    picture.draw(fig)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    bad = [f"{t.get_text()!r} at {t.get_fontsize()} pt" for t in texts if t.get_fontsize() < 5]
    for i, (ta, a) in enumerate(boxes):
        if a.x0 < -1 or a.y0 < -1 or a.x1 > fig.bbox.width + 1 or a.y1 > fig.bbox.height + 1:
            bad.append(f"{ta!r} leaves the picture")
        bad += [f"{ta!r} overlaps {tb!r}" for tb, b in boxes[i + 1:]
                if a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1]
    return bad


@pytest.mark.parametrize("cluster, p, tp, m, mbs", [
    ("8xA100-80G", 2, 2, 4, 8), ("8x8xA100-80G", 4, 2, 8, 16),
    ("128x8xA100-80G", 16, 2, 32, 64), ("128x8xA100-80G", 1, 8, 2, 128)])
def test_no_label_overlaps_at_8_64_and_1024_devices(cluster, p, tp, m, mbs):
    model = load_model("gpt3-1.3b", 512)
    plan = uniform_plan(model, load_cluster(cluster), p, tp, m, mbs)
    pictures = plan_pictures(plan, model, estimate_plan(plan, model, CostParams()), CostParams())
    for pic in pictures:
        assert clashes(pic) == [], pic.name


def test_no_label_overlaps_on_the_searched_plans(drawn):
    for pic in plan_pictures(drawn.plan, drawn.model, drawn.est, drawn.params):
        assert clashes(pic) == [], pic.name
