"""Hand-built clusters, models and plans for the plan tests (no catalogue or zoo needed)."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.modelspec.spec import CKPT_MODES, LayerSpec, ModelSpec
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy

A100 = GPUType("A100-80G", memory_gib=80.0, tflops=312.0, hbm_gbps=2039.0, nvlink_gbps=300.0)
RTX3090 = GPUType("RTX3090", memory_gib=24.0, tflops=71.0, hbm_gbps=936.0, pcie_gbps=16.0)
CPU = GPUType("cpu", memory_gib=8.0, tflops=0.5, hbm_gbps=20.0, vendor="cpu")

UNITS = ["embed"] + [f"layers.{i}" for i in range(6)] + ["head"]


def two_node_cluster() -> Cluster:
    return Cluster(nodes=[Node(A100, 4), Node(A100, 4)], name="2x4xA100-80G")


def model_spec() -> ModelSpec:
    """8 units: embed (vocab-split TP), 6 blocks (8 heads, 4 KV heads: tp 1/2/4), head without TP."""
    layers = [LayerSpec("embed", kind="embedding", params=1000, tp_params=1000, tp_divisors=(32000,))]
    layers += [LayerSpec(f"layers.{i}", kind="block", params=5000, tp_params=4800, tp_divisors=(8, 4, 1024))
               for i in range(6)]
    layers.append(LayerSpec("head", kind="head", params=100))
    return ModelSpec("tiny", seq_len=128, layers=layers)


def base_plan() -> Plan:
    """Valid homogeneous plan: 2 stages of 4 devices, per-layer tp 1/2/4, dp dividing mbs 4."""
    s0 = [StageLayer("embed", Strategy(tp=1, zero=3))]
    s0 += [StageLayer(f"layers.{i}", Strategy(tp=2, zero=2, ckpt="full", sp=True)) for i in range(3)]
    s1 = [StageLayer(f"layers.{i}", Strategy(tp=4, zero=1, ckpt="selective")) for i in range(3, 6)]
    s1.append(StageLayer("head", Strategy(tp=1, zero=0)))
    return Plan(model=ModelRef("tiny", 128, 8, source="tiny"), cluster=two_node_cluster(), global_batch_size=32,
                pipelines=[Pipeline(32, 4, 8, [Stage([0, 1, 2, 3], s0), Stage([4, 5, 6, 7], s1)])])


def asym_plan() -> Plan:
    """Valid asymmetric plan on a mixed cluster: a 2-stage pipeline on A100s, 1 stage on two 3090s."""
    cluster = Cluster(nodes=[Node(A100, 4), Node(RTX3090, 2)], name="4xA100+2x3090")
    p0 = Pipeline(24, 2, 12, [
        Stage([0, 1], [StageLayer(n, Strategy(tp=2 if n.startswith("layers") else 1)) for n in UNITS[:5]]),
        Stage([2, 3], [StageLayer(n, Strategy(tp=1, zero=3)) for n in UNITS[5:]]),
    ])
    p1 = Pipeline(8, 2, 4, [Stage([4, 5], [StageLayer(n, Strategy(tp=1, zero=2, ckpt="full")) for n in UNITS])])
    return Plan(model=ModelRef("tiny", 128, 8), cluster=cluster, global_batch_size=32, pipelines=[p0, p1],
                schedule="gpipe", memory_budget_gib=20.0)


# -- hypothesis: random valid plans ---------------------------------------------------------------
GPUS = [A100, RTX3090, CPU, GPUType("A100-80G", 80.0, 312.0, 2039.0, nvlink_gbps=600.0)]  # same name, other GPU
PREFIXES = ["layers.", "h.", "", "blocks.1.", "block-", "transformer.h."]
_floats = st.floats(allow_nan=False, width=64)


@st.composite
def clusters(draw) -> Cluster:
    nodes = []
    for _ in range(draw(st.integers(1, 3))):
        nodes.append(Node(gpu=draw(st.sampled_from(GPUS)), count=draw(st.sampled_from([1, 2, 4])),
                          intra_bw_gbps=draw(st.sampled_from([0.0, 64.0, 12.5])),
                          intra_lat_us=draw(st.sampled_from([3.0, 0.7])),
                          zone=draw(st.sampled_from(["default", "eu"])), name=draw(st.sampled_from(["", "n", "gpu-a"]))))
    n = len(nodes)
    matrix = None
    if n > 1 and draw(st.booleans()):
        pair = {(i, j): draw(st.floats(0.5, 400.0)) for i in range(n) for j in range(i + 1, n)}
        matrix = [[0.0 if i == j else pair[min(i, j), max(i, j)] for j in range(n)] for i in range(n)]
    return Cluster(nodes=nodes, inter_bw_gbps=draw(st.sampled_from([25.0, 100.0, 3.125])), bw_matrix_gbps=matrix,
                   name=draw(st.sampled_from(["", "mix", "2x8xA100-80G"])),
                   meta=draw(st.sampled_from([{}, {"preset": "x", "source": ["a", 1]}])))


def _split(draw, n: int, parts: int) -> list[int]:
    """n items into ``parts`` non-empty contiguous chunks: the chunk sizes."""
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=parts - 1, max_size=parts - 1))) if parts > 1 else []
    edges = [0] + cuts + [n]
    return [b - a for a, b in zip(edges, edges[1:])]


@st.composite
def valid_plans(draw) -> Plan:
    """Plans that pass the validator: stages are node-aligned chunks, tp divides the chunk, mbs fits every dp."""
    cluster = draw(clusters())
    chunks: list[list[int]] = []
    for i, nd in enumerate(cluster.nodes):
        devs = cluster.node_devices(i)
        k = draw(st.sampled_from([d for d in (1, 2, 4) if nd.count % d == 0]))
        size = nd.count // k
        chunks += [devs[j:j + size] for j in range(0, nd.count, size)]
    prefix = draw(st.sampled_from(PREFIXES))
    blocks = draw(st.integers(max(1, len(chunks)), 12))
    units = (["embed"] if draw(st.booleans()) else []) + [f"{prefix}{i}" for i in range(blocks)]
    units += ["head"] if prefix != "" or draw(st.booleans()) else []
    pipe_sizes = _split(draw, len(chunks), draw(st.integers(1, len(chunks))))
    pipelines, start = [], 0
    for size in pipe_sizes:
        stage_devs = chunks[start:start + size]
        start += size
        layer_counts = _split(draw, len(units), len(stage_devs))
        stages, u, dps = [], 0, []
        for devs, cnt in zip(stage_devs, layer_counts):
            layers = []
            run_strategy = None
            for name in units[u:u + cnt]:
                if run_strategy is None or draw(st.integers(0, 3)) == 0:  # runs of equal strategies
                    tp = draw(st.sampled_from([t for t in (1, 2, 4) if len(devs) % t == 0]))
                    zero = draw(st.integers(0, 3))
                    run_strategy = Strategy(tp=tp, zero=zero, ckpt=draw(st.sampled_from(CKPT_MODES)),
                                            sp=tp > 1 and draw(st.booleans()),
                                            reshard=zero != 3 or draw(st.booleans()),
                                            zero_overlap=zero in (1, 2) and draw(st.booleans()))
                layers.append(StageLayer(name, run_strategy))
                dps.append(len(devs) // run_strategy.tp)
            stages.append(Stage(list(devs), layers))
            u += cnt
        mbs = math.lcm(*dps) * draw(st.integers(1, 3))
        nmb = draw(st.integers(1, 8))
        pipelines.append(Pipeline(mbs * nmb, mbs, nmb, stages))
    predicted = draw(st.dictionaries(st.sampled_from(["step_time_s", "tps", "mfu", "tokens_per_s"]), _floats))
    if draw(st.booleans()):
        predicted["memory_gib"] = {"per_stage": draw(st.lists(_floats, max_size=4))}
    search = draw(st.sampled_from([{}, {"seconds": 0.25, "candidates": 1200, "autopar_version": "0.1.0"}]))
    return Plan(model=ModelRef(draw(st.sampled_from(["tiny", "llama2-7b"])), draw(st.integers(1, 8192)), len(units),
                               source=draw(st.sampled_from(["", "llama2-7b", "pkg.mod:factory"]))),
                cluster=cluster.with_memory_margin(draw(st.sampled_from([0.0, 0.1, 0.25]))),
                global_batch_size=sum(p.batch_share for p in pipelines), pipelines=pipelines,
                schedule=draw(st.sampled_from(["1f1b", "gpipe"])),
                memory_budget_gib=draw(st.sampled_from([None, 20.0, 75])), predicted=predicted, search=search)
