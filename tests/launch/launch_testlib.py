"""Hand-built plans for the launch tests: 2-node homogeneous, mixed (hetjob), and CPU ones that really run."""

from __future__ import annotations

from pathlib import Path

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy

A100 = GPUType("A100-80G", memory_gib=80.0, tflops=312.0, hbm_gbps=2039.0, nvlink_gbps=300.0)
RTX3090 = GPUType("RTX3090", memory_gib=24.0, tflops=71.0, hbm_gbps=936.0)
CPU = GPUType("cpu", memory_gib=8.0, tflops=0.5, hbm_gbps=20.0, vendor="cpu")
UNITS = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]


def _layers(names, tp=1):
    return [StageLayer(n, Strategy(tp=tp if n.startswith("layers") else 1)) for n in names]


def _model() -> ModelRef:
    return ModelRef("tiny", 64, len(UNITS), source="tiny")


def two_node_plan() -> Plan:
    """2 nodes x 4 A100: a two-stage pipeline, one stage per node."""
    cluster = Cluster(nodes=[Node(A100, 4), Node(A100, 4)], name="2x4xA100-80G")
    stages = [Stage(list(range(4)), _layers(UNITS[:3], tp=2)), Stage(list(range(4, 8)), _layers(UNITS[3:], tp=4))]
    return Plan(_model(), cluster, 16, [Pipeline(16, 4, 4, stages)])


def mixed_plan() -> Plan:
    """Nodes 4 x A100, 4 x A100, 2 x 3090: pipeline 0 spans the A100 nodes, pipeline 1 the 3090 node."""
    cluster = Cluster(nodes=[Node(A100, 4), Node(A100, 4), Node(RTX3090, 2)], name="8xA100+2x3090")
    p0 = Pipeline(16, 4, 4, [Stage(list(range(4)), _layers(UNITS[:3], 2)), Stage(list(range(4, 8)), _layers(UNITS[3:], 2))])
    p1 = Pipeline(4, 2, 2, [Stage([8, 9], _layers(UNITS))])
    return Plan(_model(), cluster, 20, [p0, p1])


def cpu_plan(counts: list[int]) -> Plan:
    """CPU nodes with ``counts`` processes each; one data-parallel stage over all of them."""
    cluster = Cluster(nodes=[Node(CPU, c) for c in counts], name="+".join(f"{c}xcpu" for c in counts))
    n = sum(counts)
    return Plan(_model(), cluster, 2 * n, [Pipeline(2 * n, n, 2, [Stage(list(range(n)), _layers(UNITS))])])


def fake_tools(bin_dir: Path, tools: dict[str, str]) -> Path:
    """``bin_dir`` holding an executable bash script per ``{name: body}`` (stand-ins for torchrun, srun, ...)."""
    bin_dir.mkdir()
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(0o755)
    return bin_dir
