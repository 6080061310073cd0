"""One plan builder for the estimate tests: an even pipeline over a cluster's devices in order."""

from __future__ import annotations

from autopar.cluster.cluster import Cluster
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy


def even_pipeline_plan(model: ModelSpec, cluster: Cluster, p: int, m: int, strategy: Strategy, schedule: str,
                       gbs: int, v: int = 1) -> Plan:
    """``p`` stages of ``cluster.num_devices // p`` devices in device order, every unit at ``strategy``, the
    units cut into ``p * v`` near-equal chunks (chunk k on stage k mod p), ``m`` micro-batches of ``gbs``."""
    n = cluster.num_devices // p
    units = [StageLayer(ly.name, strategy) for ly in model.layers]
    cuts = [round(i * len(units) / (p * v)) for i in range(p * v + 1)]
    stages = [Stage(list(range((k % p) * n, (k % p + 1) * n)), units[cuts[k]:cuts[k + 1]]) for k in range(p * v)]
    return Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), cluster, gbs,
                [Pipeline(gbs, gbs // m, m, stages, virtual_stages=v)], schedule=schedule)
