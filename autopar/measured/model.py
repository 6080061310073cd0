"""A measured file's ``hf_config`` and sequence length into the ModelSpec autopar estimates.

The config goes through the HF reader (``autopar.modelspec.hf``). BLOOM (not an HF type the reader
knows) is read as the GPT shape it has (layers, hidden, heads, ffn = 4h, vocab, tied embeddings):
its ALiBi positions and embedding layernorm are not modelled, and the returned note says so.
"""

from __future__ import annotations

import json

from autopar.errors import AutoparError
from autopar.fields import Fields
from autopar.modelspec.hf import entry_from_hf_config
from autopar.modelspec.spec import ModelSpec
from autopar.modelspec.zoo import spec_from_entry

BLOOM_NOTE = "bloom read as a GPT shape (ffn 4h, tied embeddings); ALiBi and the embedding layernorm are not modelled"


def _as_gpt2(f: Fields, seq_len: int) -> dict:
    """A BLOOM config as the GPT-2 config of the same shape."""
    h = f.req_int("hidden_size", low=1)
    return {"model_type": "gpt2", "n_layer": f.req_int("n_layer", low=1), "n_embd": h,
            "n_head": f.req_int("n_head", low=1), "n_inner": 4 * h, "vocab_size": f.req_int("vocab_size", low=1),
            "n_positions": seq_len, "tie_word_embeddings": bool(f.raw("tie_word_embeddings", True)),
            **({"attn_implementation": f.raw("attn_implementation")} if f.has("attn_implementation") else {})}


def model_from_config(cfg: object, seq_len: int, where: str, cache: dict, dtype_bytes: int | None = None
                      ) -> tuple[ModelSpec, list[str]]:
    """(ModelSpec, notes) of the HF-style config ``cfg`` at ``seq_len`` with activations of ``dtype_bytes``
    (the case's precision; None: the reader's default, 2); errors name ``where`` (the field).

    ``cache`` maps a config (seq_len, dtype) to its result, so a file of many cases builds each model once.
    """
    f = Fields(cfg, where, kind="hf_config")
    key = (json.dumps(f.doc, sort_keys=True, default=str), seq_len, dtype_bytes)
    if key in cache:
        return cache[key]
    mtype = f.req_str("model_type")
    notes = []
    doc = dict(f.doc)
    if mtype == "bloom":
        doc = _as_gpt2(f, seq_len)
        notes.append(BLOOM_NOTE)
    try:
        entry = entry_from_hf_config(doc, f"{mtype} {doc.get('n_layer') or doc.get('num_hidden_layers')}L")
        model = spec_from_entry(entry, seq_len=seq_len, dtype_bytes=dtype_bytes)
    except AutoparError as err:
        raise AutoparError(where, f"{err.field}: {err.problem}", err.fix) from err
    cache[key] = (model, notes)
    return model, notes
