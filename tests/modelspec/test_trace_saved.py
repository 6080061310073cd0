"""What the tracer counts as saved for backward is what the same units keep on a device: under
``F.scaled_dot_product_attention`` a fused kernel's query, key, value, output, mask and fp32 statistics, not the s x s
scores of the math fallback the meta device runs (checked against the units running on CPU, whose SDPA is the fused CPU
flash kernel); attention scores told from hidden states by where they come from; each tensor filed the same way in
every identical block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autopar.modelspec.trace import spec_from_module

S, H, A = 64, 32, 4


class Attention(nn.Module):
    def __init__(self, fused: bool, masked: bool = False, h: int = H, norm: bool = False) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.norm = nn.LayerNorm(h) if norm else nn.Identity()
        self.fused, self.masked, self.h = fused, masked, h

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b = x.shape[0]
        x = self.norm(x)
        q, k, v = (t.view(b, S, A, self.h // A).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not self.masked)
        else:
            y = torch.softmax(q @ k.transpose(-1, -2) / (self.h // A) ** 0.5, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, S, self.h))


class Net(nn.Module):
    def __init__(self, fused: bool, masked: bool = False, h: int = H, norm: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Attention(fused, masked, h, norm) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        masked = self.layers[0].masked  # one additive mask, built once and shared by the layers (as HF's)
        mask = torch.zeros(S, S, dtype=x.dtype, device=x.device) if masked else None
        for layer in self.layers:
            x = x + layer(x, mask)
        return x


def measured_saved(model: nn.Module, x: torch.Tensor, grad_input: bool = True) -> dict[str, int]:
    """Bytes each top-level unit's forward makes autograd keep on CPU, each storage once, parameters excluded."""
    seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
    per_unit: dict[str, int] = {}
    running: list[str] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if running and ptr not in seen:
            seen.add(ptr)
            per_unit[running[-1]] = per_unit.get(running[-1], 0) + t.untyped_storage().nbytes()
        return t

    handles = []
    for name, mod in model.layers.named_children():
        handles.append(mod.register_forward_pre_hook(lambda m, a, n=f"layers.{name}": running.append(n)))
        handles.append(mod.register_forward_hook(lambda m, a, o: running.pop() and None))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x.requires_grad_() if grad_input else x)
    finally:
        for h in handles:
            h.remove()
    return per_unit


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_saves_what_the_fused_kernel_keeps(dtype, masked):
    torch.manual_seed(0)
    model = Net(fused=True, masked=masked).to(dtype)
    x = torch.randn(2, S, H, dtype=dtype)
    spec = spec_from_module(model, x)
    measured = measured_saved(model, x.clone())
    for unit in spec.layers:
        assert (unit.saved_bytes("none") - unit.loss_bytes) * 2 == measured[unit.name], unit.name  # no loss here
    # no s x s score tensor: the attention core is the fp32 log-sum-exp of each head's rows; a mask the layers
    # share is kept once, by the first layer that uses it, whole on every TP rank
    assert [u.act_attn_bytes for u in spec.layers] == [A * S * 4] * 2
    mask_bytes = S * S * dtype.itemsize if masked else 0
    assert (spec.layers[0].act_seq_bytes - spec.layers[1].act_seq_bytes) * 2 == mask_bytes
    assert measured["layers.0"] - measured["layers.1"] == mask_bytes


@pytest.mark.parametrize("h", [H, S])
def test_eager_attention_keeps_its_scores_and_only_those_are_scores(h):
    """Q K^T and the softmax are the attention core; with the hidden size equal to the sequence (a 7B model at 4096
    tokens) the hidden states (the norm's input, batch x seq x hidden) are seq x seq too, and stay out of it."""
    model = Net(fused=False, h=h, norm=True)
    x = torch.randn(2, S, h)
    spec = spec_from_module(model, x)
    measured = measured_saved(model, x.clone())
    for unit in spec.layers:
        assert (unit.saved_bytes("none") - unit.loss_bytes) * 2 == measured[unit.name]
        assert unit.act_attn_bytes == A * S * S * 4  # the softmax output, which AV's product keeps too
    assert all(u.act_seq_bytes > 0 for u in spec.layers)  # the norm's input and statistics
    fused = spec_from_module(Net(fused=True, h=h, norm=True), x)
    assert fused.layers[0].saved_bytes("none") < spec.layers[0].saved_bytes("none")
    assert fused.layers[0].act_attn_bytes == A * S * 4


# OPT in fp32: CPU's LayerNorm keeps its mean and rstd in bf16 for bf16 inputs, where CUDA's (and the meta kernel's)
# keep them in fp32
@pytest.mark.parametrize(("model_type", "dtype"), [("olmo2", torch.bfloat16), ("opt", torch.float32)])
def test_a_transformers_model_under_sdpa_traces_to_what_its_layers_keep(model_type, dtype):
    """OLMo 2 (a Llama-like family) and OPT (traced as its own) under their default SDPA attention: each traced
    block keeps what the same block keeps running on CPU, with no s x s score tensor."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from autopar.models import from_transformers

    fields = {"olmo2": {"hidden_size": H, "intermediate_size": 88, "num_attention_heads": A, "num_key_value_heads": 2,
                        "num_hidden_layers": 2, "max_position_embeddings": S},
              "opt": {"hidden_size": H, "ffn_dim": 88, "num_attention_heads": A, "num_hidden_layers": 2,
                      "max_position_embeddings": S, "word_embed_proj_dim": H, "dropout": 0.0}}[model_type]
    cfg = CONFIG_MAPPING[model_type].from_dict({"vocab_size": 128, "pad_token_id": 0, "bos_token_id": 1,
                                                "eos_token_id": 2, **fields})
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(dtype)
    view = from_transformers(hf)
    tokens = torch.randint(0, 128, (2, S))
    spec = spec_from_module(view, tokens, dtype_bytes=dtype.itemsize)
    measured = measured_saved(view, tokens, grad_input=False)
    blocks = [u for u in spec.layers if u.name.startswith("layers.")]
    assert len(blocks) == 2
    for unit in blocks:
        assert (unit.saved_bytes("none") - unit.loss_bytes) * 2 == measured[unit.name], unit.name  # no loss here
        assert unit.act_attn_bytes < S * S  # statistics (and a shared mask) only: no per-head s x s scores


def test_identical_blocks_trace_to_identical_splits():
    """A norm's output is told apart by its storage's identity: storages freed during the trace must not hand that
    identity to a later tensor (which was then filed as a norm's). OLMo 2 7B's blocks, three of them."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from autopar.models import from_transformers

    cfg = CONFIG_MAPPING["olmo2"].from_dict({
        "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 3, "num_attention_heads": 32,
        "num_key_value_heads": 32, "vocab_size": 1024, "max_position_embeddings": 2048, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2})
    with torch.device("meta"):
        view = from_transformers(transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa"))
    spec = spec_from_module(view, torch.zeros(1, 2048, dtype=torch.long, device="meta"), dtype_bytes=2)
    splits = {(u.act_tp_bytes, u.act_seq_bytes, u.act_attn_bytes) for u in spec.layers if u.kind == "block"}
    assert len(splits) == 1


class DropoutAttention(nn.Module):
    """Eager attention with dropout on the probabilities and on the output, both functional (no nn.Dropout)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.qkv, self.out, self.p = nn.Linear(H, 3 * H), nn.Linear(H, H), p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = (t.view(b, S, A, H // A).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        probs = F.dropout(torch.softmax(q @ k.transpose(-1, -2), dim=-1), self.p, training=True)
        return x + F.dropout(self.out((probs @ v).transpose(1, 2).reshape(b, S, H)), self.p, training=True)


def test_a_dropout_mask_is_counted_as_the_bool_mask_cuda_keeps():
    """Meta (and CPU) draw the mask in the input's dtype; CUDA's fused dropout keeps 1 byte an element. The scores'
    mask is attention core, the output's is sequence-sharded (Korthikanti's act_seq)."""
    x = torch.randn(2, S, H)
    with_p, without = (spec_from_module(nn.Sequential(DropoutAttention(p)), x).layers[0] for p in (0.1, 0.0))
    assert with_p.act_seq_bytes - without.act_seq_bytes == S * H  # the output's mask
    assert with_p.act_tp_bytes == without.act_tp_bytes
    # the probabilities' mask, and the dropped probabilities AV's product keeps (fp32) beside softmax's output
    assert with_p.act_attn_bytes - without.act_attn_bytes == A * S * S * (1 + 4)


def test_a_transformers_llama_keeps_more_than_its_formula_by_its_rmsnorms_fp32_copies(tmp_path):
    """docs/models.md: the llama formulas count fused norms; HF's LlamaRMSNorm (what wrap runs) also keeps an fp32
    copy of its input. Traced, Llama 2 7B's block at 4096 tokens keeps twice the formula's sequence-sharded bytes (16
    against 8 a token and hidden unit), the same attention core, and beyond the formula's TP-sharded bytes only the
    rotary cos / sin (2 x 2 bytes a head-dim element): 21.7% more in all."""
    pytest.importorskip("transformers")
    import json
    from pathlib import Path

    from autopar.modelspec.hf import from_hf_config
    from autopar.modelspec.hf_traced import traced_from_hf_config

    h, f, a, s = 4096, 11008, 32, 4096
    cfg = {"model_type": "llama", "hidden_size": h, "intermediate_size": f, "num_attention_heads": a,
           "num_key_value_heads": a, "num_hidden_layers": 1, "vocab_size": 32000, "max_position_embeddings": s,
           "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    traced_spec, formula_spec = traced_from_hf_config(cfg, Path(path), "llama", seq_len=s), from_hf_config(path, seq_len=s)
    # the loss keeps the logits in fp32 in both (the traced head once ignored it)
    assert traced_spec.layers[-1].loss_bytes == formula_spec.layers[-1].loss_bytes == s * 32000 * 4
    traced, formula = traced_spec.layers[1], formula_spec.layers[1]
    assert formula.act_seq_bytes == 8 * s * h
    assert traced.act_seq_bytes == pytest.approx(16 * s * h, rel=1e-3)  # + the norms' fp32 statistics
    assert traced.act_attn_bytes == formula.act_attn_bytes
    assert traced.act_tp_bytes - formula.act_tp_bytes == 2 * 2 * s * (h // a)
    assert traced.saved_bytes("none") / formula.saved_bytes("none") == pytest.approx(1.217, abs=1e-3)
