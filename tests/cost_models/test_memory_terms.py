"""The loss's logits at its backward (cost_models/memory_terms.py): the copy counts against PyTorch's own
cross entropy on CPU, and the bytes ``transient_bytes`` adds against hand-computed values."""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autopar.modelspec.zoo import spec_from_entry, zoo_entry
from cost_models import CostParams
from cost_models.memory_terms import LOSS_COPIES_TP1, loss_copies, loss_extra_bytes, loss_peak_bytes
from cost_models.transient import head_excess, transient_bound, transient_bytes
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


@pytest.mark.parametrize("tp,ckpt,copies", [(1, "none", 1), (1, "selective", 1), (1, "full", 1),
                                            (2, "none", 2), (2, "full", 2)])
def test_transient_adds_the_copies_the_layer_model_does_not_count(tp, ckpt, copies):
    """One copy is the transient's (the unit's ``none`` activations), one the saved activations' (every
    checkpoint mode: the loss runs outside the checkpoint): 3 or 4 at the peak leave 1 or 2 to add, the
    same for every mode. At tp 2 a rank holds 2 samples (dp 2) of half the vocabulary: 4e6 bytes per
    copy, as at tp 1."""
    st, s = _stage(), Strat(tp=tp, ckpt=ckpt)
    added = transient_bytes(Head(), st, s) - transient_bytes(Head(loss_bytes=0.0), st, s)
    assert added == pytest.approx(copies * 4e6, rel=1e-12)
    assert loss_extra_bytes(Head(), tp, 4 * tp / 4) == pytest.approx(copies * 4e6, rel=1e-12)
    assert loss_peak_bytes(LOSS, tp, 4 * tp / 4) == pytest.approx(loss_copies(tp) * 4e6, rel=1e-12)


def test_the_term_scales_with_act_mem_factor_and_the_search_reserves_it():
    st, s = _stage(act_mem_factor=1.5), Strat()
    assert transient_bytes(Head(), st, s) - transient_bytes(Head(loss_bytes=0.0), st, s) == pytest.approx(1.5 * 4e6)
    assert transient_bound(Head(), st, [Strat(), Strat(tp=2)]) == transient_bytes(Head(), st, Strat(tp=2))


def test_units_without_a_loss_are_unchanged():
    assert loss_extra_bytes(Unit(), 1, 1.0) == 0.0
    assert loss_extra_bytes(Head(loss_bytes=0.0), 2, 1.0) == 0.0


def test_zoo_lm_head_states_its_fp32_logits():
    """Llama-style zoo head: s * V * 4 bytes per sample; blocks and the embedding have no loss."""
    spec = spec_from_entry(zoo_entry("llama3-8b"), seq_len=128)
    head = spec.layers[-1]
    assert head.kind == "head" and head.loss_bytes == 128 * spec.vocab * 4
    assert all(ly.loss_bytes == 0.0 for ly in spec.layers[:-1])
    st = OneNodeStage(n=8, micro_batch_size=16, num_microbatches=1)  # 2 samples per rank at tp 1
    added = transient_bytes(head, st, Strat(zero=3)) - transient_bytes(replace(head, loss_bytes=0.0), st, Strat(zero=3))
    assert added == 2 * 128 * spec.vocab * 4  # one copy of 2 samples' logits


def test_a_stated_loss_copies_replaces_pytorchs_count():
    """Megatron-LM's in-place vocab-parallel cross entropy: 1.5 copies at any tp, half a copy fewer than the
    layer model's two (the transient gives it back)."""
    p = CostParams(loss_copies=1.5)
    st = OneNodeStage(n=4, micro_batch_size=4, num_microbatches=1, params=p)
    for tp, ckpt in [(1, "none"), (2, "none"), (1, "full")]:
        s = Strat(tp=tp, ckpt=ckpt)
        got = transient_bytes(Head(), st, s) - transient_bytes(Head(loss_bytes=0.0), st, s)
        assert got == pytest.approx(-0.5 * 4e6, rel=1e-12)
        assert loss_copies(tp, 1.5) == 1.5
    assert transient_bytes(Head(), st, Strat()) > 0  # the unit's own activations still count


def test_full_checkpointing_keeps_the_losss_logits():
    """The loss runs after the checkpointed forward (autopar's runtime, torchtitan): ``full`` keeps the
    head's input and the loss's saved fp32 logits, vocabulary-sharded under TP."""
    spec = spec_from_entry(zoo_entry("llama3-8b"), seq_len=128)
    head, block = spec.layers[-1], spec.layers[1]
    assert head.saved_bytes("full", 1) == head.boundary_bytes + 128 * spec.vocab * 4
    assert head.saved_bytes("full", 8, sp=True) == head.boundary_bytes / 8 + 128 * spec.vocab * 4 / 8
    assert block.saved_bytes("full", 1) == block.boundary_bytes


def test_the_search_prices_the_strategy_dependent_copies_and_reserves_the_rest():
    """tp 1 adds one copy (4e6), tp 2 two (8e6): the excess over the least (0, 4e6) goes to each strategy's
    own memory, the reservation keeps the rest: 7e6 instead of 11e6, and reservation + excess still
    covers every strategy's transient."""
    st, strategies = _stage(), [Strat(), Strat(tp=2)]
    excess = head_excess(Head(), st, strategies)
    assert list(excess) == pytest.approx([0.0, 4e6], rel=1e-12)
    bound = transient_bound(Head(), st, strategies, excess)
    assert transient_bound(Head(), st, strategies) == pytest.approx(3e6 / 2 * 2 + 8e6, rel=1e-12)
    assert bound == pytest.approx(3e6 + 4e6, rel=1e-12)
    for s, x in zip(strategies, excess):
        assert bound + x >= transient_bytes(Head(), st, s) * (1 - 1e-12)
    assert list(head_excess(Unit(), st, strategies)) == [0.0, 0.0]


def test_a_heads_zero3_gather_is_priced_in_its_strategy_not_reserved_for_every_plan():
    """ZeRO-3 gathers the head's parameters (two copies: the running unit and the prefetched next) on top of
    the transient the other strategies need: the excess of that strategy alone, so the reservation is the
    plain strategy's transient and a plan whose head runs without ZeRO-3 is not charged the gathered copies."""
    st, strategies = _stage(), [Strat(), Strat(zero=3)]
    gathered = 2 * Head().params * CostParams().param_bytes
    excess = head_excess(Head(), st, strategies)
    assert list(excess) == pytest.approx([0.0, gathered], rel=1e-12)
    assert transient_bound(Head(), st, strategies, excess) == pytest.approx(transient_bytes(Head(), st, Strat()))


def test_stored_loss_copies_is_checked_and_older_plans_load_without_it():
    from autopar.errors import AutoparError
    from autopar.plan.cost_params import read_cost_params

    stored = json.loads(json.dumps(CostParams().to_dict()))  # as a plan file holds it (lists, not tuples)
    assert read_cost_params({**stored, "loss_copies": 1.5}, "search.cost_params", "fix")["loss_copies"] == 1.5
    older = {k: v for k, v in stored.items() if k != "loss_copies"}
    assert CostParams(**read_cost_params(older, "search.cost_params", "fix")).loss_copies == 0.0
    with pytest.raises(AutoparError, match="loss_copies"):
        read_cost_params({**stored, "loss_copies": -1}, "search.cost_params", "fix")
