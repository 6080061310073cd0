"""Models, data and plan shorthands shared by the runtime tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autopar.models import GPT, GPTConfig, Llama, LlamaConfig

GPT_UNITS = ["embed", "layers.0", "layers.1", "head"]
# The shape of the tiny transformers decoders the runtime tests build (Llama-family configs)
HF_TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=16)
MLP_UNITS = [str(i) for i in range(5)]


def gpt() -> nn.Module:
    return GPT(GPTConfig(vocab_size=64, seq_len=8, dim=32, n_layers=2, n_heads=4, ffn_hidden=64))


def llama() -> nn.Module:
    return Llama(LlamaConfig(vocab_size=64, seq_len=8, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64))


def mlp() -> nn.Module:
    # Odd widths: ZeRO / FSDP shards come out uneven.
    return nn.Sequential(nn.Linear(6, 13), nn.Tanh(), nn.Linear(13, 7), nn.GELU(), nn.Linear(7, 3))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def token_data(batch: int = 8, seq: int = 8, vocab: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g)


def float_data(batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(batch, 6, generator=g), torch.randn(batch, 3, generator=g)


# name -> (builder, unit names, (inputs, targets), loss_fn)
MODELS = {
    "gpt": (gpt, GPT_UNITS, token_data(), None),
    "llama": (llama, GPT_UNITS, token_data(), None),
    "mlp": (mlp, MLP_UNITS, float_data(), mse),
}


def drawn_away(model: nn.Module, norms: tuple[str, ...] = ("norm", ".ln_")) -> nn.Module:
    """``model`` with its biases and norms (parameters whose names hold one of ``norms``) drawn away from their
    initial zeros and ones, so a bias a TP split put in the wrong place, or added on every rank, shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or any(n in name for n in norms):
                p.normal_(0.3, 0.5)
    return model


def view_logits(hf_model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(the units view's logits, the transformers model's own) on ``token_data``'s tokens, in eval mode. The view
    is made after the model's forward (making it splits fused projections in place)."""
    from autopar.models.hf import from_transformers

    hf_model.eval()
    x = token_data()[0]
    want = hf_model(x).logits
    return from_transformers(hf_model)(x), want


def same(units: list[str], **strategy) -> list[tuple[str, dict]]:
    """Every unit with the same strategy."""
    return [(u, dict(strategy)) for u in units]
