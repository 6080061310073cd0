"""A config.json of a family the formulas do not cover but wrap runs (OLMo 2, gpt-oss, ...) is read by tracing its
transformers model on the meta device: the search, the plan it writes and every command that reloads that plan
see the model's own parameters, and a family neither covers is still refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from autopar.cli import main

transformers = pytest.importorskip("transformers")

# allenai/OLMo-2-1124-7B config.json (the fields that shape the model)
OLMO2_7B = {"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 100352, "max_position_embeddings": 4096, "rope_theta": 500000, "rms_norm_eps": 1e-06,
            "tie_word_embeddings": False, "attention_bias": False, "pad_token_id": 100277, "eos_token_id": 100257}
# openai/gpt-oss-20b config.json (the fields that shape the model; its MXFP4 quantization is for inference: the
# model is traced as trained, in bf16); layer_types alternate sliding and full attention
GPT_OSS_20B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
               "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
               "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
               "sliding_window": 128, "attention_bias": True, "tie_word_embeddings": False, "rope_theta": 150000,
               "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                                "rope_type": "yarn", "truncate": False},
               "swiglu_limit": 7.0, "pad_token_id": 199999, "eos_token_id": 200002,
               "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                   "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
GPT_OSS_20B["layer_types"] = ["sliding_attention", "full_attention"] * 12
TINY_GPT_OSS = {"model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 64, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"], "pad_token_id": 0, "eos_token_id": 1}


def _write(tmp_path, cfg: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _hf_params(cfg: dict) -> int:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(CONFIG_MAPPING[cfg["model_type"]].from_dict(cfg))
    return sum(p.numel() for p in model.parameters())


def test_an_olmo2_config_is_traced_to_its_models_parameters(tmp_path):
    from autopar.modelspec.load import load_model

    spec = load_model(_write(tmp_path, OLMO2_7B))
    assert sum(layer.params for layer in spec.layers) == _hf_params(OLMO2_7B) == 7_298_617_344
    assert spec.seq_len == 4096 and [layer.name for layer in spec.layers[:2]] == ["embed", "layers.0"]
    again = load_model(spec.source, spec.seq_len)  # what a plan's model reference reloads
    assert [(a.params, a.flops) for a in again.layers] == [(b.params, b.flops) for b in spec.layers]


def test_olmo2_blocks_are_priced_with_the_tensor_parallel_wrap_runs(tmp_path):
    """Q/K norms on head shards (autopar.models.hf_llama): every block parameter but its two sublayer norms is
    sharded, and each forward pays the two Megatron all-reduces plus one statistics all-reduce per Q/K norm."""
    from autopar.modelspec.load import load_model

    block = load_model(_write(tmp_path, OLMO2_7B)).layers[1]
    assert block.tp_plan == "hf-olmo2.block" and block.tp_divisors == (32, 32, 11008)
    assert block.params - block.tp_params == 2 * 4096 and block.tp_collectives == 4


def test_a_gpt_oss_config_is_traced_with_its_routed_experts(tmp_path):
    from autopar.modelspec.load import load_model

    spec = load_model(_write(tmp_path, TINY_GPT_OSS), seq_len=16)
    assert sum(layer.params for layer in spec.layers) == _hf_params(TINY_GPT_OSS)
    assert [(layer.moe.num_experts, layer.moe.top_k) for layer in spec.layers[1:3]] == [(4, 2), (4, 2)]


def test_the_gpt_oss_20b_config_traces_to_its_published_parameter_count(tmp_path):
    from autopar.modelspec.load import load_model

    spec = load_model(_write(tmp_path, GPT_OSS_20B), seq_len=4096)
    assert sum(layer.params for layer in spec.layers) == 20_914_757_184  # "21B parameters" (20.91B)
    assert {(layer.moe.num_experts, layer.moe.top_k) for layer in spec.layers[1:-1]} == {(32, 4)}


def test_search_on_a_traced_config_writes_a_plan_estimate_reads_as_one_number(tmp_path, capsys):
    config, plan = _write(tmp_path, OLMO2_7B), str(tmp_path / "plan.yaml")
    assert main(["search", "--model", config, "--cluster", "8xA100-80G", "--global-batch-size", "64", "--seq-len",
                 "2048", "--no-baselines", "-o", plan, "--json"]) == 0
    searched = json.loads(capsys.readouterr().out)["predicted"]
    assert main(["validate", plan]) == 0
    capsys.readouterr()
    assert main(["estimate", plan, "--json"]) == 0
    estimated = json.loads(capsys.readouterr().out)["predicted"]
    assert estimated["step_time_s"] == searched["step_time_s"] > 0


def test_a_family_neither_the_formulas_nor_the_view_cover_is_refused_in_one_line(tmp_path, capsys):
    config = _write(tmp_path, {"model_type": "mpt", "d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 64})
    plan = tmp_path / "plan.yaml"  # (-o: a search that did run must not write into the working directory)
    assert main(["search", "--model", config, "--cluster", "8xA100-80G", "--global-batch-size", "8", "-o",
                 str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert "model_type 'mpt' is not supported" in err and "\n" not in err and not plan.exists()


# meta-llama/Llama-2-7b-hf config.json (the fields that shape the model)
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-05, "tie_word_embeddings": False}
TINY_LLAMA = {**LLAMA2_7B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": 128, "max_position_embeddings": 64}


def test_trace_reads_a_formula_family_as_the_transformers_model_wrap_runs(tmp_path):
    """--trace on a llama config: the same parameters and FLOPs as the formulas, the activations HF's modules keep
    (LlamaRMSNorm's fp32 copy of its input: twice the formula's sequence-sharded bytes, tests/modelspec/
    test_trace_saved.py), a source that reloads the traced spec, and the formula entry's architecture for export."""
    from autopar.modelspec.hf import TRACED, counts_fused_kernels
    from autopar.modelspec.load import load_model

    config, s, h = _write(tmp_path, TINY_LLAMA), 64, 64
    formula, traced = load_model(config, s), load_model(config, s, trace=True)
    assert traced.source == TRACED + str((tmp_path / "config.json").resolve()) and formula.source == traced.source[7:]
    assert [ly.params for ly in traced.layers] == [ly.params for ly in formula.layers]
    assert traced.layers[1].flops == pytest.approx(formula.layers[1].flops, rel=1e-9)
    assert formula.layers[1].act_seq_bytes == 8 * s * h and traced.layers[1].act_seq_bytes > 16 * s * h
    assert counts_fused_kernels(formula) and not counts_fused_kernels(traced)
    assert (traced.meta["family"], traced.meta["norm"], traced.meta["mlp"]) == ("llama", "rms", "swiglu")
    assert (traced.hidden, traced.num_heads, traced.ffn) == (formula.hidden, formula.num_heads, formula.ffn) == (64, 4, 128)
    again = load_model(traced.source, s)  # what a plan's model reference reloads
    assert [ly.act_seq_bytes for ly in again.layers] == [ly.act_seq_bytes for ly in traced.layers]
    olmo = load_model(_write(tmp_path, OLMO2_7B), 256, trace=True)  # traced anyway: --trace changes nothing
    assert olmo.source == str((tmp_path / "config.json").resolve())


def test_search_trace_plans_the_memory_wrap_needs_and_estimate_reads_it_as_one_number(tmp_path, capsys):
    """Llama 2 7B on 8 A100-80G: the plan searched with --trace is estimated, from its file, at the number the
    search printed; the plan searched on the formulas needs more than it was promised once traced (what wrap keeps),
    and its search says to use --trace; estimate --trace says so of the formulas' plan file."""
    from autopar.estimate import estimate_plan
    from autopar.plan.io import load_plan, save_plan
    from autopar.planned import load_planned

    config = _write(tmp_path, LLAMA2_7B)
    args = ["search", "--model", config, "--cluster", "8xA100-80G", "--global-batch-size", "64", "--seq-len", "4096",
            "--no-baselines"]
    fused, traced = str(tmp_path / "fused.yaml"), str(tmp_path / "traced.yaml")
    assert main(args + ["-o", fused]) == 0
    assert "search with --trace" in capsys.readouterr().out
    assert main(args + ["--trace", "-o", traced, "--json"]) == 0
    searched = json.loads(capsys.readouterr().out)["predicted"]
    assert main(["validate", traced]) == 0
    capsys.readouterr()
    assert main(["estimate", traced, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted"]["step_time_s"] == searched["step_time_s"]
    plan = load_plan(fused)
    as_wrap = tmp_path / "as_wrap.yaml"
    save_plan(replace(plan, model=replace(plan.model, source="traced:" + config)), as_wrap)
    run = load_planned(str(as_wrap))
    traced_gib = estimate_plan(run.plan, run.model, run.params).max_memory_gib
    assert traced_gib > plan.predicted["max_memory_gib"] * 1.05
    assert main(["estimate", fused, "--trace", "--json"]) == 0  # the same question from the command line
    assert json.loads(capsys.readouterr().out)["predicted"]["max_memory_gib"] == pytest.approx(traced_gib, rel=1e-12)


def test_trace_prices_the_tensor_parallelism_wrap_runs_for_a_moe_family(tmp_path):
    """Mixtral: the formulas price Megatron's expert TP (the experts split over TP); wrap runs the attention
    column / row parallel and the router and experts whole on every rank, on its tokens (moe_local): traced, the
    block's TP shards the attention only, divides its heads alone, needs sequence parallelism, and the search's plan
    has it wherever a block runs TP."""
    from autopar.modelspec.load import load_model

    cfg = {**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    config = _write(tmp_path, cfg)
    formula, traced = load_model(config, 64), load_model(config, 64, trace=True)
    f, t = formula.layers[1], traced.layers[1]
    assert f.tp_params > f.moe.expert_params and not f.tp_needs_sp  # Megatron's expert TP shards the experts
    assert t.moe.num_experts == f.moe.num_experts == 4 and t.tp_divisors == (4, 4) and t.tp_needs_sp
    assert t.tp_params == 4 * 64 * 64  # q, k, v, o
    assert t.tp_local_params == t.moe.expert_params + 64 * 4  # the experts and the router, whole on every rank
    assert t.tp_collectives == 1  # the attention's (the MLP gathers nothing)
    plan = str(tmp_path / "plan.yaml")
    assert main(["search", "--model", config, "--trace", "--cluster", "8xA100-80G", "--global-batch-size", "16",
                 "--no-baselines", "-o", plan, "--json"]) == 0
    from autopar.plan.io import load_plan

    blocks = [ly.strategy for st in load_plan(plan).pipelines[0].stages for ly in st.layers
              if ly.name.startswith("layers.")]
    assert all(s.sp for s in blocks if s.tp > 1)
