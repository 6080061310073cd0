"""How a zero-bubble schedule splits a layer's backward into B (input gradient) and W (weight gradient).

For a linear layer of forward FLOPs F, the input gradient and the weight gradient are each about F
(Qi et al. 2024, section 2): so W is the forward's compute time of the layer's weight-bearing part, i.e.
the forward less its attention core (QK^T, softmax, .V hold no weights: their backward is all B).
Everything else of the backward stays in B: the recomputation a checkpoint asks for (it runs when the
backward first reaches the layer), TP collectives on the input gradient, ZeRO traffic and the
memory-bound kernels. This module is pure: no autopar, no torch.
"""

from __future__ import annotations

from cost_models.layer import Layer, Stage, Strategy, compute_times, strategy_arrays


def weight_grad_time(layer: Layer, strategy: Strategy, stage: Stage) -> float:
    """Seconds of ``layer``'s W pass (weight gradients) for one micro-batch per rank under ``strategy``:
    the forward compute of its FLOPs outside the attention core; 0 for a layer of no FLOPs (an embedding
    lookup's gradient is a scatter, priced with B)."""
    if layer.flops <= 0:
        return 0.0
    tp, zero, ckpt, _ = strategy_arrays([strategy])
    dp = stage.n / tp
    b_local = stage.micro_batch_size / dp
    f_comp, _ = compute_times(layer, tp, zero, ckpt, dp, b_local, stage.peak_flops, stage.params,
                              stage.attn_peak_flops, stage.sms, stage.matmul_ratios)
    linear = max(0.0, 1.0 - layer.attn_core_flops / layer.flops)
    return float(f_comp[0]) * linear
