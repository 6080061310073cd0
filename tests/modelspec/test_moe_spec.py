"""MoE units in the model spec: zoo entries, HF configs and a traced HF Mixtral give the same experts, with
parameters counting every expert and FLOPs the top_k a token runs (dropless)."""

import json

import pytest

from autopar.errors import AutoparError
from autopar.modelspec import MoESpec, from_hf_config, from_zoo
from autopar.modelspec.hf import entry_from_hf_config
from autopar.modelspec.zoo import spec_from_entry

TINY = {"model_type": "mixtral", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
        "num_experts_per_tok": 2, "max_position_embeddings": 64, "tie_word_embeddings": False}


@pytest.mark.parametrize("name, total, active", [("mixtral-8x7b", 46.70e9, 12.88e9), ("mixtral-8x22b", 140.63e9, 39.16e9),
                                                 ("qwen1.5-moe-a2.7b", 14.32e9, 2.69e9)])
def test_zoo_moe_models_have_the_published_total_and_active_parameters(name, total, active):
    m = from_zoo(name)
    assert m.num_params == pytest.approx(total, rel=1e-3)
    assert m.active_params == pytest.approx(active, rel=1e-3)
    assert set(m.num_experts) == {ly.name for ly in m.layers if ly.kind == "block"}


def test_dense_models_have_no_experts():
    m = from_zoo("llama2-7b")
    assert m.num_experts == {} and m.active_params == m.num_params


def test_tiny_mixtral_config_block_counts_every_expert_and_runs_top_k():
    s, h, f, E, k, kvw = 16, 32, 64, 4, 2, 2 * 8
    m = spec_from_entry(entry_from_hf_config(TINY, "tiny"), seq_len=s)
    blk = m.layer("layers.0")
    attn = h * (h + 2 * kvw) + h * h
    expert = 3 * h * f
    assert blk.moe == MoESpec(E, k, E * expert, expert_flops=2.0 * s * k * expert, dispatch_bytes=k * s * h * 2,
                              expert_act_bytes=k * s * h * 2 + 4 * k * s * f * 2)
    assert blk.params == attn + h * E + E * expert + 2 * h  # attention, router, experts, two RMSNorms
    assert blk.flops == 2.0 * s * (attn + h * E) + 4.0 * s * s * h + 2.0 * s * k * expert
    assert blk.moe.expert_act_bytes <= blk.act_tp_bytes


def test_qwen2_moe_config_has_shared_gated_expert_and_dense_layers(tmp_path):
    cfg = {"model_type": "qwen2_moe", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 48,
           "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 6, "num_experts_per_tok": 2,
           "decoder_sparse_step": 1, "mlp_only_layers": [1], "max_position_embeddings": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = from_hf_config(path, seq_len=8)
    assert sorted(m.num_experts) == ["layers.0", "layers.2"]  # layers.1 is in mlp_only_layers: dense
    blk, dense = m.layer("layers.0"), m.layer("layers.1")
    assert blk.moe.expert_params == 6 * 3 * 32 * 16
    shared = 3 * 32 * 24 + 32  # the shared expert and its sigmoid gate (h -> 1)
    qkv_bias = 3 * 32  # Qwen2MoeAttention's biased q/k/v_proj
    assert blk.params == 4 * 32 * 32 + qkv_bias + 32 * 6 + 6 * 3 * 32 * 16 + shared + 2 * 32
    assert dense.moe is None and dense.params == 4 * 32 * 32 + qkv_bias + 3 * 32 * 48 + 2 * 32


def test_qwen3_moe_head_dim_wider_than_hidden_over_heads():
    cfg = {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 48,
           "moe_intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 64}
    blk = spec_from_entry(entry_from_hf_config(cfg, "q3"), seq_len=8).layer("layers.0")
    q, kv = 4 * 16, 2 * 16
    assert blk.params == 32 * (q + 2 * kv) + q * 32 + 32 * 4 + 4 * 3 * 32 * 16 + 2 * 32 + 2 * 16  # + q/k norms


@pytest.mark.parametrize("field, value, message", [("num_experts_per_tok", 5, "top_k"),
                                                   ("num_local_experts", "eight", "experts")])
def test_bad_moe_config_is_one_line_naming_the_field(field, value, message):
    cfg = {**TINY, field: value}
    with pytest.raises(AutoparError) as e:
        spec_from_entry(entry_from_hf_config(cfg, "bad"), seq_len=8)
    assert message in e.value.field


def test_moe_spec_refuses_top_k_above_experts():
    with pytest.raises(AutoparError, match="1..4"):
        MoESpec(num_experts=4, top_k=5, expert_params=10)


def test_traced_hf_mixtral_equals_its_config():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from autopar.models import from_transformers
    from autopar.modelspec.trace import spec_from_module

    cfg = transformers.MixtralConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    traced = spec_from_module(from_transformers(transformers.MixtralForCausalLM(cfg)), torch.randint(0, 128, (2, 16)),
                              dtype_bytes=2)
    config = spec_from_entry(entry_from_hf_config(TINY, "tiny"), seq_len=16)
    for name in ("layers.0", "layers.1"):
        t, c = traced.layer(name), config.layer(name)
        assert t.moe is not None
        assert (t.moe.num_experts, t.moe.top_k, t.moe.expert_params) == (4, 2, c.moe.expert_params)
        assert t.params == c.params
        # meta tracing counts no FLOPs for grouped_mm; the trace adds dropless top-k expert FLOPs exactly
        assert t.flops == c.flops and t.moe.expert_flops == c.moe.expert_flops
        assert t.moe.dispatch_bytes == c.moe.dispatch_bytes
    assert traced.num_experts == {"layers.0": 4, "layers.1": 4}
