"""A Hugging Face ``config.json`` of a family the formulas (``modelspec.hf.HF_TYPES``) do not cover but autopar's
units view runs (``autopar.models.hf_llama.LLAMA_LIKE``: OLMo, Granite, Cohere, GLM-4.5, gpt-oss, ...; and
``autopar.models.hf.TRACED_OTHERS``: OPT, GPT-BigCode, GPT-Neo, BLOOM): the
transformers model is built from the config on the meta device (no memory) and its units view traced, so the
search sees that model's own parameters, FLOPs and activations, exactly what ``wrap`` would run.

Needs ``transformers`` (imported here only); the zoo and the formula families load without it.
"""

from __future__ import annotations

from pathlib import Path

from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec

DEFAULT_SEQ_CAP = 8192  # as the formula families: long-context maxima are rarely the training length


def traceable(model_type: object) -> bool:
    """Whether configs of ``model_type`` are traced (the units view runs that family)."""
    from autopar.models.hf import TRACED_OTHERS
    from autopar.models.hf_llama import LLAMA_LIKE

    return model_type in LLAMA_LIKE or model_type in TRACED_OTHERS


def traced_from_hf_config(cfg: dict, file: Path, name: str, seq_len: int | None = None,
                          dtype_bytes: int | None = None, source: str | None = None) -> ModelSpec:
    """ModelSpec of the config ``cfg`` (read from ``file``) by tracing its transformers model's units view on
    the meta device at ``seq_len`` tokens (None: ``max_position_embeddings`` capped at ``DEFAULT_SEQ_CAP``);
    its ``source`` is ``source`` (None: ``file``)."""
    mtype = cfg["model_type"]
    try:
        import torch
        import transformers
    except ImportError as err:
        raise AutoparError("model", f"config model_type {mtype!r} is read by tracing its transformers model, and "
                           f"{err.name} is not installed", "pip install transformers (and torch)") from err
    from autopar.models.hf import from_transformers
    from autopar.modelspec.trace import spec_from_module

    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        config = CONFIG_MAPPING[mtype].from_dict(cfg)
        impl = cfg.get("attn_implementation", cfg.get("_attn_implementation"))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, **({"attn_implementation": impl} if impl
                                                                             else {}))
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise AutoparError(f"model ({name})", f"transformers cannot build a {mtype} causal LM from {file} "
                           f"({type(err).__name__}: {err})", "check the config's fields against the model's "
                           "transformers config class") from err
    seq = seq_len or min(int(getattr(config, "max_position_embeddings", 0) or 2048), DEFAULT_SEQ_CAP)
    tokens = torch.zeros(1, seq, dtype=torch.long, device="meta")
    return spec_from_module(from_transformers(model), tokens, name=name, seq_len=seq, dtype_bytes=dtype_bytes or 2,
                            source=source or str(file))
