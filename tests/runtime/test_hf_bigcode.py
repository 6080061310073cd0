"""transformers' GPT-BigCode (SantaCoder, StarCoder 1) through the runtime: GPT-2's structure with nn.Linear
projections; with multi-head attention its c_attn is laid out per head, so TP splits it by plain columns; with
multi-query attention (one K and V head) the queries are split and the K / V head kept whole on every rank, its
gradients summed over TP. Checkpoints: test_hf_save.py."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, drawn_away, same, token_data, view_logits
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def bigcode(**fields):
    """Tiny GPT-BigCode, dropout off, biases and norms drawn away from their initial values."""
    cfg = transformers.GPTBigCodeConfig(**{**dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), **fields})
    return drawn_away(transformers.GPTBigCodeForCausalLM(cfg))


def view(**fields):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(bigcode(**fields).double())


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("multi_query", [True, False], ids=["multi-query", "multi-head"])
def test_the_units_view_gives_the_hf_logits(multi_query, attn):
    torch.manual_seed(0)
    torch.testing.assert_close(*view_logits(bigcode(multi_query=multi_query, attn_implementation=attn)))


TP_PLANS = {
    "tp2-sp-zero3": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])],
    "pp2-tp2-full-ckpt": [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, ckpt="full")),
                                  ([2, 3], same([L1, H], tp=2, ckpt="full"))])],
    "tp4-selective": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=4, ckpt="selective"))])],  # one query head a rank
}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(TP_PLANS))
@pytest.mark.parametrize("multi_query", [True, False], ids=["multi-query", "multi-head"])
def test_bigcode_under_tp_trains_like_one_process(multi_query, name, attn):
    """Multi-query: without the K / V head's input gradient summed over TP the embedding drifts, without its weight
    gradient summed the head's weights do (both checked by hand when the style was written)."""
    x, y = token_data()
    assert_matches_reference(view(multi_query=multi_query, attn_implementation=attn), make_plan(TP_PLANS[name]), x,
                             y, tol=1e-6)


def test_multi_query_bigcode_trains_like_one_process_without_tp():
    x, y = token_data()
    plan = make_plan([(2, 4, [([0, 1], same([E, L0], zero=3)), ([2, 3], same([L1, H], zero=1, ckpt="selective"))])])
    assert_matches_reference(view(multi_query=True), plan, x, y, tol=1e-6)


def test_search_traces_what_wrap_runs(tmp_path):
    """`search --model config.json` traces GPT-BigCode's view: the model's parameters, TP limits from the heads and
    the MLP width (multi-query's one K / V head is whole on every rank, no limit), and that head's weights counted
    as replicated."""
    from autopar.modelspec.hf import from_hf_config

    tp_params = {}
    for multi_query in (True, False):
        hf = bigcode(multi_query=multi_query, n_inner=48)
        hf.config.save_pretrained(tmp_path)
        spec = from_hf_config(tmp_path / "config.json", seq_len=16)
        assert sum(ly.params for ly in spec.layers) == sum(p.numel() for p in hf.parameters())
        assert spec.layers[1].tp_divisors == (4, 48)
        tp_params[multi_query] = spec.layers[1].tp_params
    assert tp_params[False] - tp_params[True] == 2 * (32 * 32 + 32)  # MHA splits its K and V; MQA keeps its head whole


@pytest.mark.parametrize("multi_query", [True, False], ids=["multi-query", "multi-head"])
def test_bigcode_built_on_the_meta_device_trains_like_one_process(multi_query):
    x, y = token_data()
    plan = make_plan([(2, 4, [([0, 1], same([E, L0], tp=2, zero=3)), ([2, 3], same([L1, H], tp=2))])])
    assert_matches_reference(view(multi_query=multi_query), plan, x, y, tol=1e-6, meta=True)


def _block_backward_all_reduces(rank: int, world: int, multi_query: bool) -> int:
    """All-reduces of one TP 2 block's backward (no sequence parallelism) on this rank."""
    from autopar.runtime.wrap import wrap
    from tests.runtime.test_op_checkpoint_collectives import _Count

    torch.manual_seed(0)
    plan = make_plan([(2, 1, [([0, 1], [(E, {}), (L0, {"tp": 2}), (L1, {"tp": 2}), (H, {})])])])
    pm = wrap(view(multi_query=multi_query)(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    y = pm.local_units[L0](torch.randn(2, 8, 32, dtype=torch.float64, requires_grad=True))
    with _Count() as count:
        (y[0] if isinstance(y, tuple) else y).sum().backward()
    return count.calls["all_reduce"]


def test_multi_query_sums_its_input_gradient_in_one_all_reduce():
    """The queries and the whole K / V head read one replicated input (replicated_input on c_attn), so their input
    gradients are added before one all-reduce, as multi-head attention's column-parallel c_attn does: a block's
    backward all-reduces as often either way (each part converting its own input would all-reduce three times)."""
    from autopar.runtime.local_ranks import run_distributed

    mq, mh = (run_distributed(_block_backward_all_reduces, 2, m, timeout_s=120)[0] for m in (True, False))
    assert mq == mh > 0
