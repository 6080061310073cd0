"""Encoder-decoder (seq2seq) transformers models are refused by ``from_transformers`` in one line
naming the family and why (their decoder blocks read the encoder's output), not a traceback."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError

transformers = pytest.importorskip("transformers")


def t5():
    cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4)
    return transformers.T5ForConditionalGeneration(cfg)


def bart():
    cfg = transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                  decoder_ffn_dim=32, max_position_embeddings=16)
    return transformers.BartForConditionalGeneration(cfg)


@pytest.mark.parametrize("build,kind,cls", [(t5, "t5", "T5ForConditionalGeneration"),
                                            (bart, "bart", "BartForConditionalGeneration")], ids=["t5", "bart"])
def test_seq2seq_models_are_refused_naming_the_family(build, kind, cls):
    from autopar.models import from_transformers

    with pytest.raises(AutoparError) as err:
        from_transformers(build())
    msg = str(err.value)
    assert msg.startswith(f"model: transformers model type '{kind}' ({cls}) is an encoder-decoder (seq2seq) model, "
                          "which autopar does not run")
    assert "\n" not in msg and "; train a decoder-only causal LM" in msg
