"""transformers' Llama and GPT-2 through the runtime (skipped when transformers is not installed):
tied embeddings stay tied, a raw HF model is wrapped and traced under the same units."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, same, token_data
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def llama_model(attn: str = "sdpa"):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                   attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg)


def gpt2_model(attn: str = "sdpa"):
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                  attn_implementation=attn)
    return transformers.GPT2LMHeadModel(cfg)


def hf_llama():
    from autopar.models.hf import from_transformers

    return from_transformers(llama_model())


def hf_gpt2():
    from autopar.models.hf import from_transformers

    return from_transformers(gpt2_model())


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("build", [llama_model, gpt2_model])
def test_units_view_equals_the_hf_model(build, attn):
    """Same logits as the HF forward (eager attention only masks what it is given: the units pass a causal mask)."""
    from autopar.models.hf import from_transformers
    from autopar.units import units

    torch.manual_seed(0)
    hf = build(attn).eval()
    x = token_data()[0]
    expected = hf(x).logits
    wrapped = from_transformers(hf)
    assert [n for n, _ in units(wrapped)] == GPT_UNITS
    torch.testing.assert_close(wrapped(x), expected)


def test_hf_llama_tensor_and_sequence_parallel():
    x, y = token_data()
    assert_matches_reference(hf_llama, make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))])]), x, y)


def test_hf_llama_asymmetric_pipelines():
    x, y = token_data()
    plan = make_plan([(2, 2, [([0, 1], same([E, L0], tp=2)), ([2], same([L1, H], ckpt="selective"))]),
                      (4, 1, [([3], same(GPT_UNITS, zero=0))])])
    assert_matches_reference(hf_llama, plan, x, y)


def test_hf_gpt2_pipeline_with_zero_and_checkpointing():
    x, y = token_data()
    plan = make_plan([(2, 4, [([0, 1], [(E, {"zero": 1}), (L0, {"zero": 3, "ckpt": "selective"})]),
                              ([2], same([L1, H], ckpt="full"))])])
    assert_matches_reference(hf_gpt2, plan, x, y)


@pytest.mark.parametrize("build", [hf_gpt2, hf_llama], ids=["gpt2", "llama"])
def test_hf_op_checkpointing(build):
    """Op-level selective checkpointing on Hugging Face blocks (GPT-2's Conv1D runs addmm), TP on Llama."""
    x, y = token_data()
    tp = 2 if build is hf_llama else 1
    plan = make_plan([(4, 2, [([0, 1], [(E, {}), (L0, {"ckpt": "op", "tp": tp}), (L1, {"ckpt": "op", "zero": 3}),
                                        (H, {})])])])
    assert_matches_reference(build, plan, x, y)


def tied_llama():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                   tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("build", [gpt2_model, tied_llama], ids=["gpt2", "llama-tied"])
def test_tied_embeddings_stay_tied(build):
    from autopar.models.hf import from_transformers

    view = from_transformers(build())
    emb = next(p for n, p in view.embed.named_parameters() if n.endswith("weight") and p.shape[0] == 64)
    assert view.head.proj.weight is emb  # the one tensor of the HF model, not a copy


@pytest.mark.parametrize("plan", [
    [(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])],
    [(4, 2, [([0, 1], [(E, {"zero": 1}), (L0, {"zero": 3}), (L1, {}), (H, {"zero": 3})])])],
], ids=["pp2-embed-and-head-on-two-stages", "zero"])
def test_hf_gpt2_tied_trains_like_the_tied_model(plan):
    x, y = token_data()
    assert_matches_reference(hf_gpt2, make_plan(plan), x, y)


def hf_tied_llama():
    from autopar.models.hf import from_transformers

    return from_transformers(tied_llama())


def test_hf_llama_tied_with_tensor_parallel_embed_and_head():
    x, y = token_data()
    plan = make_plan([(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2, sp=True))])])
    assert_matches_reference(hf_tied_llama, plan, x, y)


def _raw_rank(rank, world, plan, x, y):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(llama_model(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))  # no from_transformers
    return [pm.step(x, y) for _ in range(3)], pm.full_state_dict()


def test_a_raw_hf_model_is_wrapped_under_the_units_the_tracer_gives_its_view():
    """wrap takes the HF model as it is (through from_transformers, weights kept); the tracer names
    the view's units the same and refuses the raw model with the fix (the planner never imports models)."""
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers
    from autopar.modelspec.trace import spec_from_module
    from autopar.runtime.local_ranks import run_distributed
    from tests.runtime.reference import reference_train

    x, y = token_data()
    assert [ly.name for ly in spec_from_module(from_transformers(llama_model()), x[:1]).layers] == GPT_UNITS
    with pytest.raises(AutoparError, match=r"^model: LlamaForCausalLM is a transformers model: .*; trace "
                       r"autopar.models.from_transformers\(model\), or give its config.json$"):
        spec_from_module(llama_model(), x[:1])
    plan = make_plan([(4, 2, [([0, 1], same(GPT_UNITS, tp=2))])])
    out = run_distributed(_raw_rank, 2, plan, x, y, timeout_s=60)
    ref_losses, ref_state = reference_train(hf_llama, x, y, 3, 0.1)
    torch.testing.assert_close(torch.tensor(out[0][0]), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
    for name, p in ref_state.items():
        torch.testing.assert_close(out[0][1][name], p, atol=1e-5, rtol=1e-5)


def mixtral_model():
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                     num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(cfg)


def bert_model():
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(cfg)


@pytest.mark.parametrize("build", [mixtral_model, bert_model], ids=["mixtral", "bert-mlm"])
def test_more_families_view_equals_the_hf_model(build):
    from autopar.models.hf import from_transformers
    from autopar.units import units

    torch.manual_seed(0)
    hf = build().eval()
    x = token_data()[0]
    wrapped = from_transformers(hf)
    assert [n for n, _ in units(wrapped)] == GPT_UNITS
    torch.testing.assert_close(wrapped(x), hf(x).logits)


def hf_mixtral():
    from autopar.models.hf import from_transformers

    return from_transformers(mixtral_model())


def hf_bert():
    from autopar.models.hf import from_transformers

    return from_transformers(bert_model())


def mlm_labels() -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-LM targets: about one position in four carries a label, the rest are -100."""
    x, y = token_data()
    keep = torch.rand(y.shape, generator=torch.Generator().manual_seed(3)) < 0.25
    return x, torch.where(keep, y, torch.full_like(y, -100))


@pytest.mark.parametrize("build,data", [(hf_mixtral, token_data), (hf_bert, mlm_labels)], ids=["mixtral", "bert-mlm"])
def test_more_families_train_like_single_process(build, data):
    x, y = data()
    plan = make_plan([(2, 4, [([0, 1], [(E, {"zero": 1}), (L0, {"zero": 3, "ckpt": "selective"})]),
                              ([2], same([L1, H], ckpt="full"))])])
    assert_matches_reference(build, plan, x, y)


def test_mixtral_traces_in_bf16_and_names_the_fix_in_fp32():
    """torch's meta grouped_mm takes bf16 only: the fp32 trace says so and how to trace instead."""
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers
    from autopar.modelspec.trace import spec_from_module

    view, x = from_transformers(mixtral_model()), token_data()[0][:1]
    assert [ly.name for ly in spec_from_module(view, x, dtype_bytes=2).layers] == GPT_UNITS
    with pytest.raises(AutoparError, match=r"grouped_mm takes bf16 only; trace in bf16 \(dtype_bytes=2"):
        spec_from_module(view, x)
