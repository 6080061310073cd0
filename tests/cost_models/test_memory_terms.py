"""The loss's logits at its backward (cost_models/memory_terms.py): the copy counts against PyTorch's own
cross entropy on CPU, and the bytes ``transient_bytes`` adds against hand-computed values."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autopar.modelspec.zoo import spec_from_entry, zoo_entry
from cost_models import CostParams
from cost_models.layer import transient_bound, transient_bytes
from cost_models.memory_terms import LOSS_COPIES_TP1, loss_copies, loss_extra_bytes, loss_peak_bytes
from tests.cost_models.fakes import OneNodeStage, Strat, Unit

LOSS = 4e6  # fp32 logits per sample


@dataclass(frozen=True)
class Head(Unit):
    kind: str = "head"
    loss_bytes: float = LOSS


def _stage(act_mem_factor: float = 1.0) -> OneNodeStage:
    p = CostParams(act_mem_factor=act_mem_factor)
    return OneNodeStage(n=4, micro_batch_size=4, num_microbatches=1, params=p)  # 1 sample per rank at tp 1


class _LiveLogits(TorchDispatchMode):
    """Most storages of at least ``nbytes`` alive at once over the ops run under it (each storage once,
    counted from the op that made it until PyTorch frees it)."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes, self.live, self.peak = nbytes, set(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= self.nbytes:
                st = t.untyped_storage()
                if st.data_ptr() not in self.live:
                    self.live.add(st.data_ptr())
                    weakref.finalize(st, self.live.discard, st.data_ptr())
        self.peak = max(self.peak, len(self.live))
        return out


def test_cross_entropy_on_fp32_logits_keeps_one_copy_and_its_backward_holds_three():
    """torchtitan's loss (``F.cross_entropy(pred.float(), labels)`` after ``del pred``) on CPU: the forward
    leaves the saved log-softmax output; backward adds nll_loss's gradient and log_softmax's."""
    tokens, vocab = 64, 4096
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,))
    mode = _LiveLogits(tokens * vocab * 4)
    with mode:
        loss = F.cross_entropy(logits.float(), target)
        assert len(mode.live) == 1
        mode.peak = 0
        loss.backward()
    assert mode.peak == LOSS_COPIES_TP1 == loss_copies(1) == 3
    assert loss_copies(8) == 4  # loss parallel: x, grad_input, exp(x) and their sum (torch's tensor/parallel/loss.py)


@pytest.mark.parametrize("tp,ckpt,copies", [(1, "none", 1), (1, "selective", 1), (1, "full", 2),
                                            (2, "none", 2), (2, "full", 3)])
def test_transient_adds_the_copies_the_layer_model_does_not_count(tp, ckpt, copies):
    """One copy is the transient's (the unit's ``none`` activations), one the saved activations' under
    ``none`` / ``selective``: 3 or 4 at the peak leave 1-3 to add. At tp 2 a rank holds 2 samples (dp 2)
    of half the vocabulary: 4e6 bytes per copy, as at tp 1."""
    st, s = _stage(), Strat(tp=tp, ckpt=ckpt)
    added = transient_bytes(Head(), st, s) - transient_bytes(Head(loss_bytes=0.0), st, s)
    assert added == pytest.approx(copies * 4e6, rel=1e-12)
    assert loss_extra_bytes(Head(), tp, ckpt, 4 * tp / 4) == pytest.approx(copies * 4e6, rel=1e-12)
    assert loss_peak_bytes(LOSS, tp, 4 * tp / 4) == pytest.approx(loss_copies(tp) * 4e6, rel=1e-12)


def test_the_term_scales_with_act_mem_factor_and_the_search_reserves_it():
    st, s = _stage(act_mem_factor=1.5), Strat()
    assert transient_bytes(Head(), st, s) - transient_bytes(Head(loss_bytes=0.0), st, s) == pytest.approx(1.5 * 4e6)
    assert transient_bound(Head(), st, [Strat(), Strat(tp=2)]) == transient_bytes(Head(), st, Strat(tp=2))


def test_units_without_a_loss_are_unchanged():
    assert loss_extra_bytes(Unit(), 1, "none", 1.0) == 0.0
    assert loss_extra_bytes(Head(loss_bytes=0.0), 2, "full", 1.0) == 0.0


def test_zoo_lm_head_states_its_fp32_logits():
    """Llama-style zoo head: s * V * 4 bytes per sample; blocks and the embedding have no loss."""
    spec = spec_from_entry(zoo_entry("llama3-8b"), seq_len=128)
    head = spec.layers[-1]
    assert head.kind == "head" and head.loss_bytes == 128 * spec.vocab * 4
    assert all(ly.loss_bytes == 0.0 for ly in spec.layers[:-1])
    st = OneNodeStage(n=8, micro_batch_size=16, num_microbatches=1)  # 2 samples per rank at tp 1
    added = transient_bytes(head, st, Strat(zero=3)) - transient_bytes(replace(head, loss_bytes=0.0), st, Strat(zero=3))
    assert added == 2 * 128 * spec.vocab * 4  # one copy of 2 samples' logits
