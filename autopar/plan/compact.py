"""A Plan from a compact description, on a one-node CPU cluster: for profiling runs and tests."""

from __future__ import annotations

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy

LayerArg = tuple  # (unit name, Strategy) or (unit name, dict of Strategy fields)


def cpu_cluster(n: int) -> Cluster:
    """A one-node cluster of ``n`` CPU "devices" (plans need a cluster; the runtime ignores its speeds)."""
    return Cluster(nodes=[Node(gpu=GPUType("cpu", memory_gib=16.0, tflops=1.0, hbm_gbps=50.0), count=n)])


def make_plan(pipelines: list[tuple[int, int, list[tuple[list[int], list[LayerArg]]]]],
              schedule: str = "1f1b", name: str = "test", virtual_stages: int = 1) -> Plan:
    """Plan from ``[(micro_batch_size, num_microbatches, [(devices, [(unit, strategy), ...]), ...]), ...]``
    (with ``virtual_stages`` v, each pipeline's stage list is its p * v chunks, chunk k on chunk k mod p's devices)."""
    pipes = []
    for mbs, m, stages in pipelines:
        sts = [Stage(devices=list(devs), layers=[StageLayer(n, s if isinstance(s, Strategy) else Strategy(**s))
                                                  for n, s in layers]) for devs, layers in stages]
        pipes.append(Pipeline(batch_share=mbs * m, micro_batch_size=mbs, num_microbatches=m, stages=sts,
                              virtual_stages=virtual_stages))
    n_layers = sum(len(st.layers) for st in pipes[0].stages)
    world = sum(len(p.devices) for p in pipes)
    return Plan(model=ModelRef(name, seq_len=1, num_layers=n_layers), cluster=cpu_cluster(world),
                global_batch_size=sum(p.batch_share for p in pipes), pipelines=pipes, schedule=schedule)
