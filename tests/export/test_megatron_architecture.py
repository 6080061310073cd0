"""The Megatron-LM export states the model's architecture, not only its shape (pretrain_gpt.py's defaults are GPT's:
a Llama exported as its shape alone would train with LayerNorm, GeLU, learned positions and biases), read back
through megatron-core's own config classes; what pretrain_gpt.py does not build is refused in one line."""

from __future__ import annotations

import json

import pytest

from autopar.export import prepare, render
from autopar.export.megatron import args
from tests.export.children import MEGATRON, needs, run_child
from tests.export.conftest import search

TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
CONFIGS = {
    "qwen2": {**TINY, "model_type": "qwen2", "rope_theta": 1000000.0},
    "qwen3": {**TINY, "model_type": "qwen3", "head_dim": 32},  # 4 heads x 32 on a 64 hidden state
    "deepseek_v3": {**TINY, "model_type": "deepseek_v3", "num_key_value_heads": 4, "moe_intermediate_size": 32,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "v_head_dim": 16},
}


def _plan(tmp_path, model: str) -> str:
    if model in CONFIGS:
        path = tmp_path / f"{model}.json"
        path.write_text(json.dumps(CONFIGS[model]))
        model = str(path)
    return search(tmp_path / f"{tmp_path.name}-plan.yaml",
                  ["--model", model, "--cluster", "1x4xH100", "--global-batch-size", "8", "--seq-len", "256"])


@needs("megatron.core")
def test_the_architecture_reaches_megatron_cores_config(tmp_path):
    plans = {m: _plan(tmp_path / m, m) for m in ("llama3-8b", *CONFIGS) if (tmp_path / m).mkdir() is None}
    exports = {m: prepare(p, "megatron") for m, p in plans.items()}
    got = run_child(MEGATRON, [{"name": m, "args": args(ex), "world": ex.world} for m, ex in exports.items()], tmp_path)
    assert all("arch" in got[m] for m in plans), got
    arch = {m: got[m]["arch"] for m in plans}
    for m, a in arch.items():  # every one a Llama-style decoder: RMSNorm, SwiGLU, no linear biases, no dropout
        assert (a["normalization"], a["glu"], a["bias"], a["dropout"]) == ("RMSNorm", True, False, [0.0, 0.0]), m
    assert "--rotary-base" in args(exports["llama3-8b"]) and "500000" in args(exports["llama3-8b"])
    assert arch["qwen2"]["qkv_bias"] and not arch["llama3-8b"]["qkv_bias"]
    assert "1000000" in args(exports["qwen2"])  # its rope_theta
    assert arch["qwen3"]["kv_channels"] == 32 and arch["qwen3"]["qk_layernorm"]
    assert arch["deepseek_v3"]["mla"] == [24, 16, 16, 8, 16]  # q / kv latents, nope / rope / value head widths


@pytest.mark.parametrize("model, words", [
    ("bert-large", "encoder or image model"),
    ("gemma2", "Gemma's GeGLU"),
])
def test_what_pretrain_gpt_does_not_build_is_refused(tmp_path, model, words):
    from autopar.errors import AutoparError

    if model == "gemma2":
        path = tmp_path / "gemma2.json"
        path.write_text(json.dumps({**TINY, "model_type": "gemma2", "head_dim": 16}))
        model = str(path)
    plan = search(tmp_path / "plan.yaml", ["--model", model, "--cluster", "1x4xH100", "--global-batch-size", "8",
                                           "--seq-len", "256"])
    with pytest.raises(AutoparError, match=words) as e:
        render(prepare(plan, "megatron"))
    assert "\n" not in str(e.value) and "deepspeed or accelerate" in str(e.value)
