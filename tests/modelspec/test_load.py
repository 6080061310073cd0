"""load_model: zoo names, HF config.json files, pkg.module:factory; round trips through ``source``; bad input."""

import json
import sys
import textwrap

import pytest

from autopar.errors import AutoparError
from autopar.modelspec import from_zoo, load_model

from . import refmodels

LLAMA3_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
             "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
             "max_position_embeddings": 8192, "tie_word_embeddings": False, "hidden_act": "silu",
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0}
GPT2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None, "vocab_size": 50257,
        "n_positions": 1024, "resid_pdrop": 0.1, "activation_function": "gelu_new"}
BERT_BASE = {"model_type": "bert", "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
             "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
             "hidden_dropout_prob": 0.1}


def _write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_llama_style_config_equals_zoo(tmp_path):
    (tmp_path / "llama3").mkdir()
    path = _write(tmp_path / "llama3", LLAMA3_8B)
    m = load_model(str(path))
    z = from_zoo("llama3-8b")
    assert m.name == "llama3" and m.source == str(path.resolve()) and m.seq_len == 8192
    assert [ly for ly in m.layers] == [ly for ly in z.layers]
    assert load_model(str(tmp_path / "llama3"), seq_len=2048).flops_per_sample == from_zoo("llama3-8b", 2048).flops_per_sample


def test_gpt2_style_config(tmp_path):
    m = load_model(str(_write(tmp_path, GPT2)))
    assert m.num_params == 124_439_808  # GPT2LMHeadModel "gpt2", tied LM head
    assert m.seq_len == 1024 and m.vocab == 50257 and m.ffn == 3072 and m.meta["tied_embeddings"]
    assert m.layers[1].tp_plan == "gpt.block" and m.layers[1].act_seq_bytes == 1024 * 768 * (4 * 2 + 2)
    with pytest.raises(AutoparError, match="^seq_len: .*up to 1024"):
        load_model(str(tmp_path / "config.json"), seq_len=2048)


def test_neox_and_mistral_configs(tmp_path):
    pythia = {"model_type": "gpt_neox", "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
              "intermediate_size": 3072, "vocab_size": 50304, "max_position_embeddings": 2048,
              "rotary_pct": 0.25, "use_parallel_residual": True, "tie_word_embeddings": False}
    m = load_model(str(_write(tmp_path, pythia, "pythia-160m.json")))
    assert m.name == "pythia-160m" and m.num_params == 162_322_944  # Pythia paper, table 1
    assert m.num_params - m.layers[0].params - 50304 * 768 == 85_056_000  # its non-embedding count
    mistral = {**LLAMA3_8B, "model_type": "mistral", "vocab_size": 32000, "max_position_embeddings": 32768,
               "_name_or_path": "mistralai/Mistral-7B-v0.1"}
    m = load_model(str(_write(tmp_path, mistral)))
    assert m.name == "mistralai/Mistral-7B-v0.1" and m.num_params == 7_241_732_096
    assert m.seq_len == 8192  # max_position_embeddings capped: pass --seq-len for long context


QWEN2_7B = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
            "max_position_embeddings": 32768, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
            "use_sliding_window": False, "_name_or_path": "Qwen/Qwen2-7B"}


def test_qwen2_config_counts_its_qkv_biases(tmp_path):
    m = load_model(str(_write(tmp_path, QWEN2_7B)))
    assert m.name == "Qwen/Qwen2-7B" and m.num_params == 7_615_616_512  # Qwen2ForCausalLM's own count
    llama = load_model(str(_write(tmp_path, {**QWEN2_7B, "model_type": "llama"}, "as-llama.json")))
    assert m.num_params - llama.num_params == 28 * (3584 + 2 * 512)  # q, k and v biases of every block
    blk, lblk = m.layer("layers.0"), llama.layer("layers.0")
    assert blk.tp_params - lblk.tp_params == 3584 + 2 * 512  # sharded with their columns under TP
    assert blk.flops == lblk.flops


@pytest.mark.parametrize("tied", [False, True])
def test_qwen2_config_equals_the_transformers_model(tmp_path, tied):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {**QWEN2_7B, "num_hidden_layers": 2, "tie_word_embeddings": tied}
    with torch.device("meta"):
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **{k: v for k, v in cfg.items() if k not in ("model_type", "_name_or_path")}))
    assert load_model(str(_write(tmp_path, cfg))).num_params == sum(p.numel() for p in hf.parameters())


def test_bert_config_equals_zoo(tmp_path):
    m = load_model(str(_write(tmp_path, BERT_BASE)))
    assert m.layers == from_zoo("bert-base").layers


def test_vit_config(tmp_path):
    cfg = {"model_type": "vit", "num_hidden_layers": 32, "hidden_size": 1280, "num_attention_heads": 16,
           "intermediate_size": 5120, "image_size": 224, "patch_size": 14, "num_channels": 3,
           "id2label": {str(i): str(i) for i in range(1000)}}
    assert load_model(str(_write(tmp_path, cfg))).layers == from_zoo("vit-huge").layers


@pytest.mark.parametrize("spec", ["llama2-70b", "gpt-tiny"])
def test_zoo_round_trip(spec):
    m = load_model(spec, seq_len=16)
    again = load_model(m.source, m.seq_len)
    assert again.layers == m.layers and again.seq_len == 16


def test_hf_round_trip(tmp_path):
    m = load_model(str(_write(tmp_path, LLAMA3_8B)), seq_len=512)
    assert load_model(m.source, m.seq_len).layers == m.layers


def test_factory_round_trip():
    spec = f"{refmodels.__name__}:gpt_tiny"
    m = load_model(spec)  # seq_len from the model's config; built on the meta device
    assert m.seq_len == 32
    assert m.source == spec and [ly.name for ly in m.layers] == ["embed", "layers.0", "layers.1", "layers.2",
                                                                  "layers.3", "head"]
    assert m.num_params == from_zoo("gpt-tiny").num_params
    assert m.layers[1].tp_plan == "gpt.block" and m.layers[1].tp_divisors == (4, 256)
    assert load_model(m.source, m.seq_len).layers == m.layers


@pytest.fixture
def factory_dir(tmp_path, monkeypatch):
    """A project folder with factory modules, as the cwd (load_model imports from it like `python -m`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("autopar_fac_")]:
        del sys.modules[name]


def _module(folder, name, body):
    (folder / f"{name}.py").write_text(textwrap.dedent(body))


def test_factory_with_example_input(factory_dir):
    _module(factory_dir, "autopar_fac_img", """
        import torch
        from torch import nn
        def build():
            return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
        def example_input():
            return torch.randn(4, 3, 16, 16)
    """)
    m = load_model("autopar_fac_img:build")
    assert [ly.name for ly in m.layers] == ["0", "1", "2", "3"]
    assert m.layers[0].flops == 2 * 8 * 3 * 9 * 16 * 16 and m.layers[3].flops == 2 * 8 * 16 * 16 * 10
    assert m.seq_len == 1 and load_model(m.source, m.seq_len).layers == m.layers


def test_factory_seq_len_from_example_input(factory_dir):
    _module(factory_dir, "autopar_fac_seq", """
        import torch
        from torch import nn
        def build():
            return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
        def example_input(seq_len):
            return torch.zeros(2, seq_len or 12, dtype=torch.long)
    """)
    assert load_model("autopar_fac_seq:build").seq_len == 12
    m = load_model("autopar_fac_seq:build", seq_len=20)
    assert m.seq_len == 20 and m.layers[1].flops == 2 * 20 * 8 * 50


BAD_FACTORIES = {
    "autopar_fac_nomod_xyz:build": "cannot import 'autopar_fac_nomod_xyz'",
    "autopar_fac_bad:missing": "has no 'missing'",
    "autopar_fac_bad:NUMBER": "not a callable",
    "autopar_fac_bad:not_module": "returned a dict, not an nn.Module",
    "autopar_fac_bad:raises": "raised RuntimeError: broken",
    "autopar_fac_bad:data_dependent": "tracing autopar_fac_bad:data_dependent on the meta device failed",
}


@pytest.mark.parametrize("spec", sorted(BAD_FACTORIES))
def test_bad_factories(factory_dir, spec):
    _module(factory_dir, "autopar_fac_bad", """
        import torch
        from torch import nn
        NUMBER = 3
        def not_module():
            return {}
        def raises():
            raise RuntimeError("broken")
        class DataDependent(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(10, 4)
            def forward(self, ids):
                x = self.emb(ids)
                return x if x.sum() > 0 else -x
        def data_dependent():
            return DataDependent()
    """)
    with pytest.raises(AutoparError, match="^model: ") as err:
        load_model(spec, seq_len=8)
    assert BAD_FACTORIES[spec] in str(err.value) and "\n" not in str(err.value)


def test_factory_needs_a_length_or_an_example(factory_dir):
    _module(factory_dir, "autopar_fac_len", """
        from torch import nn
        def lm():
            return nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
        def mlp():
            return nn.Sequential(nn.Linear(4, 4))
    """)
    with pytest.raises(AutoparError, match="^seq_len: cannot tell"):
        load_model("autopar_fac_len:lm")
    assert load_model("autopar_fac_len:lm", seq_len=6).seq_len == 6
    with pytest.raises(AutoparError, match="^model: .*no example_input"):
        load_model("autopar_fac_len:mlp", seq_len=6)


@pytest.mark.parametrize(("content", "problem"), [
    (None, "not found"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"model_type": "mamba"}), "model_type 'mamba' is not supported"),
    (json.dumps({**LLAMA3_8B, "num_hidden_layers": None}), "'num_hidden_layers' is missing"),
    (json.dumps({**LLAMA3_8B, "num_key_value_heads": 5}), "5 KV heads do not divide 32 heads"),
])
def test_bad_configs(tmp_path, content, problem):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(AutoparError, match="^model") as err:
        load_model(str(path))
    assert problem in str(err.value)


@pytest.mark.parametrize("spec", ["", "   ", "llama-7b", "no such thing"])
def test_unknown_names(spec):
    with pytest.raises(AutoparError, match="^model: .*autopar list models"):
        load_model(spec)


def test_attn_implementation_decides_the_score_memory(tmp_path):
    """eager keeps the s x s scores (memory, and the cost model's traffic); sdpa/flash and the default don't."""
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128, "n_positions": 256}

    def block(impl):
        doc = {**cfg, "attn_implementation": impl} if impl else cfg
        path = tmp_path / f"{impl}.json"
        path.write_text(json.dumps(doc))
        return load_model(str(path)).layers[1]

    eager, sdpa, default = block("eager"), block("sdpa"), block(None)
    assert default.act_attn_bytes == sdpa.act_attn_bytes == block("flash_attention_2").act_attn_bytes
    assert eager.act_attn_bytes >= 4 * 256 * 256 * 2 > sdpa.act_attn_bytes  # heads x s^2 at 2 bytes at least
    with pytest.raises(AutoparError, match="attn_implementation.*unknown attention implementation 'magic'"):
        block("magic")


# (model_type, transformers config class, causal LM class, the published model's shape): each config's
# parameter count equals the transformers model's own (built on the meta device).
FAMILIES = {
    "qwen3-0.6b": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM",
                   dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)),
    "mistral-nemo-12b": ("mistral", "MistralConfig", "MistralForCausalLM",  # head_dim 128, not 5120 / 32
                         dict(hidden_size=5120, intermediate_size=14336, num_hidden_layers=40, num_attention_heads=32,
                              num_key_value_heads=8, head_dim=128, vocab_size=131072, tie_word_embeddings=False)),
    "phi-3-mini": ("phi3", "Phi3Config", "Phi3ForCausalLM",
                   dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=32, vocab_size=32064, tie_word_embeddings=False)),
    "gemma-7b": ("gemma", "GemmaConfig", "GemmaForCausalLM",
                 dict(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28, num_attention_heads=16,
                      num_key_value_heads=16, head_dim=256, vocab_size=256000)),
    "gemma-2-9b": ("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
                   dict(hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=256, vocab_size=256000)),
    "gemma-3-1b": ("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM",
                   dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, vocab_size=262144)),
}
FAMILIES.update({
    "deepseek-v3": ("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
                         num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
                         num_experts_per_tok=8, first_k_dense_replace=3, kv_lora_rank=512, q_lora_rank=1536,
                         qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, vocab_size=129280,
                         n_group=8, topk_group=4, tie_word_embeddings=False)),
    "deepseek-v2-lite": ("deepseek_v2", "DeepseekV2Config", "DeepseekV2ForCausalLM",  # no query latent
                         dict(hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                              num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
                              n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512,
                              q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                              vocab_size=102400, tie_word_embeddings=False)),
})
PUBLISHED = {"deepseek-v3": 671_026_404_352, "deepseek-v2-lite": 15_706_484_224, "mistral-nemo-12b": 12_247_782_400, "qwen3-0.6b": 596_049_920, "phi-3-mini": 3_821_079_552, "gemma-7b": 8_537_680_896,
             "gemma-2-9b": 9_241_705_984, "gemma-3-1b": 999_885_952}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_config_families_count_what_the_transformers_model_holds(tmp_path, name):
    model_type, config_cls, model_cls, shape = FAMILIES[name]
    spec = load_model(str(_write(tmp_path, {"model_type": model_type, "max_position_embeddings": 4096, **shape})))
    assert spec.num_params == PUBLISHED[name]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        hf = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**shape))
    assert spec.num_params == sum(p.numel() for p in hf.parameters())


def test_gemma2_blocks_hold_and_save_two_norms_more_than_gemma(tmp_path):
    shape = {"max_position_embeddings": 4096, **FAMILIES["gemma-2-9b"][3]}
    g1 = load_model(str(_write(tmp_path, {"model_type": "gemma", **shape}, "g1.json")), seq_len=1024)
    g2 = load_model(str(_write(tmp_path, {"model_type": "gemma2", **shape}, "g2.json")), seq_len=1024)
    b1, b2 = g1.layer("layers.0"), g2.layer("layers.0")
    assert b2.params - b1.params == 2 * 3584  # post-attention and post-feedforward norms
    assert b2.act_seq_bytes - b1.act_seq_bytes == 2 * 1024 * 3584 * 2  # their bf16 inputs, kept for backward
    assert (b2.flops, b2.tp_params) == (b1.flops, b1.tp_params)


def test_deepseek_latent_attention_splits_its_heads_and_keeps_its_latents_whole(tmp_path):
    shape = {"model_type": "deepseek_v3", "max_position_embeddings": 4096, **FAMILIES["deepseek-v3"][3]}
    m = load_model(str(_write(tmp_path, shape)), seq_len=4096)
    assert m.active_params == pytest.approx(37.55e9, rel=1e-3)  # DeepSeek-V3: 37B activated of 671B
    dense, moe = m.layer("layers.0"), m.layer("layers.3")  # first_k_dense_replace = 3
    assert dense.moe is None and moe.moe.num_experts == 256 and moe.moe.top_k == 8
    a, h, qk, v, s = 128, 7168, 192, 128, 4096
    latent = 7168 * 1536 + 1536 + 7168 * (512 + 64) + 512  # q_a_proj, its norm, kv_a_proj_with_mqa, its norm
    heads = 1536 * a * qk + 512 * a * (128 + v) + a * v * h  # q_b_proj, kv_b_proj, o_proj: split by heads
    assert dense.params - dense.tp_params == latent + 2 * h  # whole on every TP rank, with the block's two norms
    assert dense.tp_params == heads + 3 * h * 18432
    assert dense.attn_core_flops == 2.0 * s * s * a * (qk + v)  # QK^T over 192 wide heads, AV over 128
    assert dense.kv_bytes == s * a * (qk + v) * 2  # the up-projected keys and values a CP all-gather moves
    assert 128 in dense.tp_divisors


@pytest.mark.parametrize("attention_bias, mlp_bias", [(True, False), (False, True), (True, True)])
def test_llama_biases_are_the_attentions_or_the_mlps_as_the_config_says(tmp_path, attention_bias, mlp_bias):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {**LLAMA3_8B, "num_hidden_layers": 2, "vocab_size": 1000, "attention_bias": attention_bias,
           "mlp_bias": mlp_bias}
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    assert load_model(str(_write(tmp_path, cfg))).num_params == sum(p.numel() for p in hf.parameters())
