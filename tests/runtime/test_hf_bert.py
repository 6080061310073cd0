"""transformers' BERT masked LM through the runtime (autopar.models.hf_bert): tensor parallel as Megatron's BERT, with
and without sequence parallelism (post-norm blocks: the residual adds and LayerNorms on the rank's tokens), trains as
one process; the decoder's bias, the MLM head's tied ``bias`` twin, is one trained tensor written under both names."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, drawn_away, same, token_data
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def bert(tied: bool = True):
    """Tiny BERT MLM, dropout off, biases and LayerNorms drawn away from their initial values."""
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, tie_word_embeddings=tied)
    return drawn_away(transformers.BertForMaskedLM(cfg), norms=("LayerNorm",))


def view(tied: bool = True):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(bert(tied).double())


def mlm_labels() -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-LM targets: about one position in four carries a label, the rest are -100."""
    x, y = token_data()
    keep = torch.rand(y.shape, generator=torch.Generator().manual_seed(3)) < 0.25
    return x, torch.where(keep, y, torch.full_like(y, -100))


PLANS = {
    "tp2": [(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])],
    "tp2-sp-zero3": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])],
    "pp2-tp2-sp-ckpt": [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, ckpt="full")),
                                ([2, 3], same([L1, H], tp=2, sp=True, ckpt="selective", zero=1))])],
}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_bert_under_tp_trains_like_one_process(plan, tied):
    x, y = mlm_labels()
    assert_matches_reference(view(tied), make_plan(PLANS[plan]), x, y, tol=1e-6)


def test_the_head_holds_the_decoder_bias_once():
    """``cls.predictions.bias`` and ``cls.predictions.decoder.bias`` are one tensor: the head unit holds it as the
    decoder's, so TP splits the only copy the unit trains, and both checkpoint names map to it."""
    from autopar.models.hf import from_transformers

    hf = bert()
    view_ = from_transformers(hf)
    names = [n for n, _ in view_.head.named_parameters()]
    assert "decoder.bias" in names and not any(n.endswith("predictions.bias") for n in names)
    assert set(view_.hf_source.names["head.decoder.bias"]) == {"cls.predictions.bias", "cls.predictions.decoder.bias"}


def _train_and_save(rank, world, plan, path):
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap

    torch.manual_seed(3)
    pm = wrap(from_transformers(bert(tied=True)), plan, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    x, y = mlm_labels()
    for _ in range(2):
        pm.step(x, y)
    pm.save_hf(path)
    return pm.full_state_dict()


def test_save_hf_writes_the_trained_bias_under_both_names(tmp_path):
    plan = make_plan(PLANS["tp2-sp-zero3"])
    trained = run_distributed(_train_and_save, 4, plan, str(tmp_path))[0]
    torch.manual_seed(3)
    before = bert(tied=True).cls.predictions.bias.detach().clone()
    loaded = transformers.BertForMaskedLM.from_pretrained(str(tmp_path)).state_dict()
    bias = trained["head.decoder.bias"]
    assert not torch.equal(bias, before)  # trained
    for key in ("cls.predictions.bias", "cls.predictions.decoder.bias"):
        torch.testing.assert_close(loaded[key], bias, atol=0, rtol=0, msg=key)
    torch.testing.assert_close(loaded["cls.predictions.transform.dense.weight"],
                               trained["head.transform.dense.weight"], atol=0, rtol=0)


def test_bert_built_on_the_meta_device_trains_like_one_process_under_tp():
    """HF's _init_weights sets each unit's tensors on the ranks that hold them, the decoder's bias included (the
    head unit holds the decoder, not the module whose bias HF's init zeroes by name)."""
    from autopar.models.hf import from_transformers

    cfg = bert().config

    def on_meta():
        with torch.device("meta"):
            return from_transformers(transformers.BertForMaskedLM(cfg))

    x, y = mlm_labels()
    assert_matches_reference(on_meta, make_plan(PLANS["tp2-sp-zero3"]), x, y, meta=True)
