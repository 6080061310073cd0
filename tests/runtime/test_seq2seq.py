"""transformers' T5 (encoder-decoder) under dp, ZeRO, pipelined and mixed plans on 2 and 4 processes
equals single-process training: the (encoder states, decoder states) pair crosses stages as a tuple,
the tied embedding / LM head and each stack's shared position-bias table stay tied. BART is refused
on every rank in one line."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, same
from tests.runtime.reference import assert_matches_reference, wrap_outcomes

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist
U = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]


def hf_t5():
    from autopar.models import from_transformers
    from tests.models.test_hf_seq2seq import t5

    return from_transformers(t5())


PLANS = {
    "dp2-zero3": [(4, 2, [([0, 1], same(U, zero=3))])],
    "pp2-encoder-decoder": [(4, 2, [([0], same(U[:3])), ([1], same(U[3:], ckpt="full"))])],
    "pp2-inside-the-encoder-gpipe": [(2, 4, [([0], same(U[:2])), ([1], same(U[2:], ckpt="selective"))])],
    "pp4": [(2, 4, [([0], same(U[:2])), ([1], same(U[2:3])), ([2], same(U[3:4])), ([3], same(U[4:]))])],
    "dp2-pp2-zero1-zero2": [(4, 2, [([0, 1], same(U[:3], zero=1)), ([2, 3], same(U[3:], zero=2))])],
}


@pytest.mark.parametrize("plan", list(PLANS))
def test_t5_trains_like_single_process(plan):
    from tests.models.test_hf_seq2seq import seq2seq_data

    x, y = seq2seq_data()
    schedule = "gpipe" if "gpipe" in plan else "1f1b"
    assert_matches_reference(hf_t5, make_plan(PLANS[plan], schedule=schedule), x, y)


def test_bart_is_refused_on_every_rank():
    from tests.models.test_hf_seq2seq import bart

    out = wrap_outcomes(bart, make_plan([(4, 2, [([0, 1], same(GPT_UNITS))])]))
    assert out[0] == out[1]
    assert out[0].startswith("model: transformers model type 'bart' (BartForConditionalGeneration) is an "
                             "encoder-decoder")


def test_t5_built_on_meta_trains_like_init_weights():
    """Built on the meta device: each rank runs HF's T5 init on its units (children before parents, so
    T5's attention and feed-forward scaling wins), the tied copies take their first unit's value."""
    from tests.models.test_hf_seq2seq import seq2seq_data

    x, y = seq2seq_data()
    assert_matches_reference(hf_t5, make_plan(PLANS["dp2-pp2-zero1-zero2"]), x, y, meta=True)


def test_t5_meta_init_is_t5s_own():
    from autopar.runtime.materialize import init_weights

    with torch.device("meta"):
        view = hf_t5()
    init_weights(view, seed=1)
    attn = view.layers[0].block.layer[0].SelfAttention
    assert abs(attn.q.weight.std().item() - (16 * 4) ** -0.5) < 0.03  # T5Attention's, not the generic std 1.0
    assert abs(attn.k.weight.std().item() - 16 ** -0.5) < 0.05
    assert view.layers[1].bias.relative_attention_bias.weight is attn.relative_attention_bias.weight  # still tied
    assert view.head.lm_head.weight is view.embed.shared.weight


def test_a_searched_plan_for_t5_wraps_and_trains_exactly():
    from autopar.cluster.parse import load_cluster
    from autopar.modelspec.trace import spec_from_module
    from autopar.search import SearchOptions, search
    from tests.models.test_hf_seq2seq import seq2seq_data

    x, y = seq2seq_data()
    spec = spec_from_module(hf_t5(), x[:1], name="t5")
    res = search(spec, load_cluster("2xcpu"), 8, SearchOptions(), with_baselines=False)
    assert [ly.name for st in res.plan.pipelines[0].stages for ly in st.layers] == U
    assert_matches_reference(hf_t5, res.plan, x, y)
