"""Small hand-built models and clusters for search tests (independent of the zoo)."""

from autopar.cluster.cluster import Cluster, GPUType, Node
from autopar.modelspec.spec import LayerSpec, ModelSpec


def gpt_like(blocks: int = 2, h: int = 512, s: int = 256, V: int = 4096, a: int = 8, ffn: int = 2048) -> ModelSpec:
    d = 2
    bp = 4 * h * h + 2 * h * ffn + 4 * h
    flops = 2 * s * (4 * h * h + 2 * h * ffn) + 4 * s * s * h

    def block(i):
        return LayerSpec(f"layers.{i}", "block", bp, bp - 4 * h, flops, 4 * s * s * h,
                         act_tp_bytes=s * h * d * 12, act_seq_bytes=s * h * d * 5, act_attn_bytes=5 * a * s * s,
                         boundary_bytes=s * h * d, tp_divisors=(a, ffn), tp_comm_bytes=2 * s * h * d,
                         tp_collectives=2, tp_plan="gpt_block")

    embed = LayerSpec("embed", "embedding", V * h + s * h, V * h, 0.0, 0.0, 0.0, s * h * d, 0.0, s * h * d, (V,),
                      s * h * d, 1, "embedding")
    head = LayerSpec("head", "head", V * h + 2 * h, V * h, 2 * s * h * V, 0.0, s * V * 4, s * h * d, 0.0, s * V * 4,
                     (V,), s * V * 4 / 64, 1, "lm_head")
    return ModelSpec("gpt-test", s, [embed] + [block(i) for i in range(blocks)] + [head], hidden=h, vocab=V,
                     num_heads=a, num_kv_heads=a, ffn=ffn, source="")


SMALL_GPU = GPUType("small", memory_gib=0.5, tflops=50.0, hbm_gbps=500.0, nvlink_gbps=100.0)


def small_cluster(nodes: int = 2, per_node: int = 2, inter_gbps: float = 5.0) -> Cluster:
    return Cluster([Node(SMALL_GPU, per_node, name=f"n{i}") for i in range(nodes)], inter_bw_gbps=inter_gbps,
                   inter_lat_us=20.0, name=f"{nodes}x{per_node}xsmall")
