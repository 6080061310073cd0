"""transformers' T5 as units (autopar.models.hf_seq2seq): the units view computes exactly the HF
forward; other encoder-decoder families are refused in one line naming the family."""

from __future__ import annotations

import pytest
import torch

from autopar.errors import AutoparError

transformers = pytest.importorskip("transformers")
T5_UNITS = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]


def t5(attn: str = "sdpa", tie: bool = True):
    cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2,
                                num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                                tie_word_embeddings=tie, attn_implementation=attn)
    return transformers.T5ForConditionalGeneration(cfg)


def seq2seq_data(batch: int = 8, seq: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids ``[B, 2, S]``: encoder input ids and T5's shifted decoder input ids, labels with -100s)."""
    g = torch.Generator().manual_seed(11)
    src = torch.randint(1, 64, (batch, seq), generator=g)
    labels = torch.randint(1, 64, (batch, seq), generator=g)
    labels[::3, -2:] = -100
    dec = torch.cat([torch.zeros(batch, 1, dtype=labels.dtype), labels[:, :-1]], 1)  # T5's _shift_right
    dec = dec.masked_fill(dec == -100, 0)
    return torch.stack([src, dec], 1), labels


def bart():
    cfg = transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                  decoder_ffn_dim=32, max_position_embeddings=16)
    return transformers.BartForConditionalGeneration(cfg)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_t5_units_view_equals_the_hf_model(attn, tie):
    from autopar.models import from_transformers
    from autopar.units import units

    torch.manual_seed(0)
    hf = t5(attn, tie).eval()
    ids, labels = seq2seq_data()
    out = hf(input_ids=ids[:, 0], labels=labels)
    assert torch.equal(hf._shift_right(labels), ids[:, 1])
    view = from_transformers(hf)
    assert [n for n, _ in units(view)] == T5_UNITS
    logits = view(ids)
    torch.testing.assert_close(logits, out.logits, atol=1e-6, rtol=1e-6)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1))
    torch.testing.assert_close(loss, out.loss)


def test_t5_is_searched_under_the_same_units():
    from autopar.models import from_transformers
    from autopar.modelspec.trace import spec_from_module

    spec = spec_from_module(from_transformers(t5()), seq2seq_data()[0][:1], name="t5")
    assert [ly.name for ly in spec.layers] == T5_UNITS


def test_other_seq2seq_families_are_refused_naming_the_family():
    from autopar.models import from_transformers

    with pytest.raises(AutoparError) as err:
        from_transformers(bart())
    msg = str(err.value)
    assert msg.startswith("model: transformers model type 'bart' (BartForConditionalGeneration) is an encoder-decoder "
                          "(seq2seq) model other than T5ForConditionalGeneration, which autopar does not run")
    assert "\n" not in msg
