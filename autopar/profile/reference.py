"""Runnable models for the profiler: the reference GPT it measures by default, and ``build_module``.

``autopar profile`` must time real layer units, so it needs an ``nn.Module``, not only a ModelSpec:
``build_module(source)`` turns a model name the CLI accepts into one. Zoo entries whose shape
autopar.models implements (family gpt with untied embeddings, family llama) become a GPT / Llama;
``pkg.module:factory`` is called as it is. HF configs have no runnable module here.

``gpt_cpu`` is the default profiling and fidelity-benchmark model: the reference GPT at a size whose
layer units take milliseconds on one CPU core (timings above the noise, a whole plan step well under a
second on 2 processes). Every tensor is divisible by 4, so ZeRO shards over 2 or 4 ranks are even.
"""

from __future__ import annotations

import importlib
import os
import re
import sys

import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.models import GPT, GPTConfig, Llama, LlamaConfig

GPT_CPU = GPTConfig(vocab_size=1024, seq_len=128, dim=256, n_layers=4, n_heads=4, ffn_hidden=1024)
DEFAULT_MODEL = "autopar.profile.reference:gpt_cpu"
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def gpt_cpu() -> nn.Module:
    """The reference GPT the profiler and the fidelity benchmark use (3.7 M parameters, seq 128)."""
    return GPT(GPTConfig(**vars(GPT_CPU)))


def example_input(seq_len: int | None = None) -> torch.Tensor:
    """Token ids ``[1, seq_len]`` for tracing ``gpt_cpu`` (``autopar search --model`` calls this)."""
    return torch.zeros(1, seq_len or GPT_CPU.seq_len, dtype=torch.long)


def _from_zoo(name: str, seq_len: int | None) -> nn.Module:
    from autopar.modelspec.zoo import zoo_entry

    e = zoo_entry(name)
    fix = "profile a zoo model autopar.models implements (gpt-tiny, llama-tiny) or give pkg.module:factory"
    if e["family"] == "gpt" and not e["tied"] and e["arch"] == "decoder":
        vocab = -(-e["vocab"] // e["pad_vocab_to"]) * e["pad_vocab_to"]
        return GPT(GPTConfig(vocab_size=vocab, seq_len=seq_len or e["seq_len"], dim=e["hidden"],
                             n_layers=e["layers"], n_heads=e["heads"], ffn_hidden=e["ffn"]))
    if e["family"] == "llama":
        return Llama(LlamaConfig(vocab_size=e["vocab"], seq_len=seq_len or e["seq_len"], dim=e["hidden"],
                                 n_layers=e["layers"], n_heads=e["heads"], n_kv_heads=e["kv_heads"],
                                 ffn_hidden=e["ffn"]))
    raise AutoparError("model", f"{name} has no runnable module in autopar.models (family {e['family']}, "
                       f"tied {e['tied']})", fix)


def _from_factory(spec: str) -> nn.Module:
    from autopar.modelspec.load import user_code

    with user_code(spec):  # its exit, exception or prints: one line naming it, stdout kept clean
        return _build_factory(spec)


def _build_factory(spec: str) -> nn.Module:
    mod_name, attr = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(mod_name)
    except Exception as err:
        raise AutoparError("model", f"cannot import {mod_name!r} ({type(err).__name__}: {err})",
                           "check the pkg.module part of pkg.module:factory") from err
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise AutoparError("model", f"module {mod_name!r} has no {attr!r}", "name a callable in that module")
    model = obj()
    if not isinstance(model, nn.Module):
        raise AutoparError("model", f"factory {spec} returned a {type(model).__name__}", "return an nn.Module")
    return model


def build_module(source: str, seq_len: int | None = None) -> nn.Module:
    """A runnable ``nn.Module`` (CPU, real weights from the current RNG) for the model named ``source``."""
    from autopar.modelspec.zoo import zoo_names

    if source in zoo_names():
        return _from_zoo(source, seq_len)
    if _FACTORY.fullmatch(source):
        return _from_factory(source)
    raise AutoparError("model", f"cannot run {source!r} to profile it",
                       "give a zoo name (gpt-tiny, llama-tiny) or pkg.module:factory returning an nn.Module")
