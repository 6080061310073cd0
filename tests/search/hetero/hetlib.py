"""Small mixed clusters and models for the heterogeneous planner tests (no catalogue needed)."""

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.plan.schema import Plan
from autopar.search import SearchOptions
from cost_models import CostParams
from tests.search.tiny import gpt_like

SLOW = GPUType("slow", memory_gib=0.5, tflops=50.0, hbm_gbps=500.0, nvlink_gbps=100.0)
FAST = GPUType("fast", memory_gib=1.0, tflops=120.0, hbm_gbps=1000.0, nvlink_gbps=200.0)
PARAMS = CostParams(reserve_gib=0.0)


def mixed(inter_gbps: float = 5.0, per_node: int = 2, slow_nodes: int = 1, fast_nodes: int = 1) -> Cluster:
    """``slow_nodes`` nodes of the slow GPU then ``fast_nodes`` of the fast one, ``per_node`` GPUs each."""
    nodes = [Node(SLOW, per_node, name=f"s{i}") for i in range(slow_nodes)]
    nodes += [Node(FAST, per_node, name=f"f{i}") for i in range(fast_nodes)]
    return Cluster(nodes, inter_bw_gbps=inter_gbps, inter_lat_us=20.0,
                   name=f"{slow_nodes}x{per_node}xslow+{fast_nodes}x{per_node}xfast")


def model(blocks: int = 2, h: int = 512, s: int = 256):
    return gpt_like(blocks=blocks, h=h, s=s)


def opts(budget=None, **kw) -> SearchOptions:
    return SearchOptions(memory_budget_gib=budget, params=PARAMS, **kw)


def covered(plan: Plan) -> list[int]:
    return sorted(d for p in plan.pipelines for st in p.stages for d in st.devices)
