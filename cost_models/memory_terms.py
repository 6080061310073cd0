"""Memory terms of the working set a layer needs beyond its saved activations, each derived from the
code that allocates it (``transient.transient_bytes`` adds them).

**The loss's logits at its backward** (a unit with ``loss_bytes``: the LM head, whose cross entropy
reads fp32 logits of ``loss_bytes`` per sample, ``s * V * 4``, vocabulary-parallel under TP). The
cross entropy runs on fp32 logits (torchtitan's ``loss_fn``: ``F.cross_entropy(pred.flatten(0, 1).float(),
...)``, train.py at pytorch/torchtitan 9dec370, the commit of its 2024-12 H100 benchmark, which frees
the bf16 ``pred`` before ``backward``: ``del pred``; under autocast, as autopar's runtime runs it, torch
autocasts ``cross_entropy`` / ``log_softmax`` to fp32). ``F.cross_entropy`` is ``log_softmax`` then
``nll_loss``; autograd saves the log-softmax output (one logits-sized fp32 tensor). Its backward holds,
at its peak, tensors of the logits' size per rank:

* TP 1 (aten, torch 2.13): ``nll_loss_backward`` returns a gradient of its input's size (its
  decomposition, torch/_decomp/decompositions.py ``_nll_loss_backward``: ``grad_input =
  torch.zeros_like(self)`` then a scatter), and ``_log_softmax_backward_data`` a new one from it and
  the saved output (``_log_softmax_backward_data`` there: ``grad_output - exp(output) * sum``). Saved
  output + its gradient + the gradient of its input: **3 copies**, all live until the log-softmax node
  returns (the autograd engine releases a node's saved tensors and inputs after it has run).
* TP > 1, loss parallel (``torch.distributed.tensor.parallel.loss_parallel``, what torchtitan and
  autopar's runtime use on vocabulary-sharded logits): ``_nll_loss_and_log_softmax_backward``
  (torch/distributed/tensor/parallel/loss.py, torch 2.13) computes ``grad_input = torch.zeros_like(x)``,
  then ``(grad_input + torch.exp(x)) * grad_output``: beside the saved ``x``, ``grad_input``,
  ``exp(x)`` and their sum are live at the addition, and ``grad_input``, the sum and the product at
  the multiplication: **4 copies** of the rank's vocabulary shard.

Megatron-LM's vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py, NVIDIA/Megatron-LM
d98e8a64; the same in Megatron-LM v1.1.5, megatron/mpu/cross_entropy.py, which AMP's and BLOOM's runs used)
works in place: it saves one fp32 tensor (the logits' ``.float()`` turned into the softmax by ``sub_``,
``exp(out=)`` and ``div_``) and its backward multiplies that tensor in place into the gradient, which
autograd casts back to the half-precision logits' dtype: 1 + 1/2 = **1.5 copies**. A run of such a
framework states ``CostParams.loss_copies = 1.5``; 0 (the default) means PyTorch's counts above.

The layer model already counts the logits once in the unit's transient (its ``none`` activations, what
recomputation and backward hold) and once more in its saved activations, whatever its checkpoint mode
(the loss runs after the checkpointed forward, in autopar's runtime as in torchtitan, so ``full`` keeps
the unit's input and the loss's saved logits: ``LayerSpec.saved_bytes``): ``loss_extra_bytes`` is the
rest, the same for every checkpoint mode, negative where the loss holds fewer (Megatron's 1.5 against
the 2 counted).
"""

from __future__ import annotations

LOSS_COPIES_TP1 = 3  # saved log-softmax output, nll_loss's gradient, log_softmax's input gradient
LOSS_COPIES_PARALLEL = 4  # saved x, grad_input, exp(x) / the sum, the product (loss parallel)
COUNTED = 2  # copies the layer model counts: one saved (every ckpt mode), one in the transient


def loss_copies(tp: int, stated: float = 0.0) -> float:
    """Logits-sized fp32 tensors live per rank at the peak of the loss's backward at TP degree ``tp``:
    ``stated`` (``CostParams.loss_copies``) when positive, else PyTorch's cross entropy's (3; 4 under TP)."""
    if stated > 0.0:
        return stated
    return LOSS_COPIES_PARALLEL if tp > 1 else LOSS_COPIES_TP1


def loss_peak_bytes(loss_bytes: float, tp: int, b_local: float, stated: float = 0.0) -> float:
    """Bytes per rank of the logits-sized tensors live at the loss's backward peak: ``loss_copies(tp,
    stated)`` copies of ``loss_bytes`` per sample (fp32 logits at tp 1) sharded ``tp`` ways, for ``b_local``
    samples."""
    return loss_copies(tp, stated) * loss_bytes / tp * b_local


def loss_extra_bytes(layer: object, tp: int, b_local: float, stated: float = 0.0) -> float:
    """What the loss's backward peak holds beyond what the layer model counts for ``layer`` (``COUNTED``:
    one copy in its transient, one in its saved activations), per rank: negative where the loss holds
    fewer (``stated`` below the count); 0 for a unit without a loss (``loss_bytes`` 0 or absent)."""
    loss_bytes = float(getattr(layer, "loss_bytes", 0.0) or 0.0)
    if loss_bytes <= 0.0:
        return 0.0
    return loss_peak_bytes(loss_bytes, tp, b_local, stated) - COUNTED * loss_bytes / tp * b_local
