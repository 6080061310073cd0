"""ParallelModel.load_hf: a save_pretrained folder read into a transformers model wrapped from the meta device,
each rank reading its own pieces: afterwards every tensor equals the checkpoint's, and training equals the same
plan wrapped around the model built with those weights (so ZeRO masters and tied copies were refreshed too)."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.models.test_hf_families import build
from tests.runtime.cases import GPT_UNITS, same, token_data

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
PLANS = {
    "tp2-sp-zero3": ("llama", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "pp2-tp2-zero3": ("gemma2", [(2, 4, [([0, 1], same([E, L0], tp=2, zero=3)), ([2, 3], same([L1, H], tp=2))])]),
    # OLMo 2's Q/K norms sharded with their heads (tp_norm)
    "olmo2-pp2-tp2-sp": ("olmo2", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                           ([2, 3], same([L1, H], tp=2, sp=True))])]),
    # GPT-NeoX's checkpoints name its head embed_out (transformers renames it lm_head on load)
    "gpt_neox-tp2-sp": ("gpt_neox", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True))])]),
    # Phi-3's fused qkv_proj / gate_up_proj held as parts: each rank reads its rows of every part
    "phi3-pp2-tp2-zero3": ("phi3", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, zero=3)),
                                            ([2, 3], same([L1, H], tp=2, zero=1))])]),
    # GPT-2's transposed Conv1D weights, its fused c_attn held as parts: each rank reads its columns of every part
    "gpt2-pp2-tp2-zero3": ("gpt2", [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, zero=3)),
                                            ([2, 3], same([L1, H], tp=2, zero=1))])]),
    # OPT: learned positions (offset by 2) in the embedding unit, its MLP on flattened tokens; OPT-350M's layout
    # (projections in and out, its head's project_out whole under TP)
    "opt-pp2-tp2-sp-zero3": ("opt", [(2, 4, [([0, 1], same([E, L0], tp=2, zero=3)),
                                              ([2, 3], same([L1, H], tp=2, sp=True))])]),
    "bloom-tp2-sp-zero3": ("bloom", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    # GPT-BigCode's multi-query c_attn: the queries' columns per rank, the K / V head whole on every rank
    "gpt_bigcode-mq-tp2-sp-zero3": ("gpt_bigcode", [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "dp2-zero2-ckpt": ("qwen3", [(4, 2, [([0, 1], same(GPT_UNITS, zero=2, ckpt="full"))])]),
    # MoE checkpoints store each expert apart: each rank assembles the packed experts of its own shard
    "olmoe-ep2-zero3": ("olmoe", [(4, 2, [([0, 1, 2, 3], [(E, {"zero": 3}), (L0, {"ep": 2, "zero": 3}),
                                                           (L1, {"ep": 2, "zero": 3}), (H, {"zero": 3})])])]),
    "mixtral-ep2-zero1": ("mixtral", [(4, 2, [([0, 1, 2, 3], [(E, {"zero": 1}), (L0, {"ep": 2, "zero": 1}),
                                                               (L1, {"ep": 2}), (H, {})])])]),
    "mixtral-pp2": ("mixtral", [(2, 4, [([0], same([E, L0])), ([1], same([L1, H]))])]),
}
MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2)
# fields a family's tests set: GPT-2's dropout off (transformers' from_pretrained returns a model in eval mode)
EXTRA = {"mixtral": MIXTRAL, "gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
         "opt": dict(ffn_dim=64, dropout=0.0, word_embed_proj_dim=16, do_layer_norm_before=False),
         "bloom": dict(hidden_dropout=0.0, attention_dropout=0.0),
         "gpt_bigcode": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, multi_query=True)}


def _saved(kind: str, path: str, tied: bool) -> None:
    torch.manual_seed(7)
    model = build(kind, tie_word_embeddings=tied, **EXTRA.get(kind, {}))
    model.config.tie_word_embeddings = tied
    model.tie_weights()
    model.save_pretrained(path)


def _train(rank, world, kind, plan, path, from_checkpoint):
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap

    cfg = transformers.AutoConfig.from_pretrained(path)
    if from_checkpoint:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path)
    pm = wrap(from_transformers(model), plan, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    if from_checkpoint:
        pm.load_hf(path)
    start = pm.full_state_dict()
    x, y = token_data()
    return start, [pm.step(x, y) for _ in range(3)], pm.full_state_dict()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_load_hf_gives_the_checkpoints_tensors_and_trains_as_the_model_built_with_them(name, tied, tmp_path):
    kind, pipelines = PLANS[name]
    plan = make_plan(pipelines)
    _saved(kind, str(tmp_path), tied)
    loaded = run_distributed(_train, plan.world_size, kind, plan, str(tmp_path), True)
    built = run_distributed(_train, plan.world_size, kind, plan, str(tmp_path), False)
    for (start, losses, end), (ref_start, ref_losses, ref_end) in zip(loaded, built):
        assert start.keys() == ref_start.keys()
        for k in ref_start:
            torch.testing.assert_close(start[k], ref_start[k], atol=0, rtol=0, msg=k)
        assert losses == ref_losses
        for k in ref_end:
            torch.testing.assert_close(end[k], ref_end[k], atol=0, rtol=0, msg=k)


def _refusal(rank, world, path, model_kind, steps):
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap
    from tests.runtime.cases import gpt

    model = gpt() if model_kind == "gpt" else from_transformers(build(model_kind))
    pm = wrap(model, make_plan([(4, 2, [([0, 1], same(GPT_UNITS))])]), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    x, y = token_data()
    for _ in range(steps):
        pm.step(x, y)
    try:
        pm.load_hf(path)
    except AutoparError as e:
        return str(e)
    return "loaded"


@pytest.mark.parametrize(("model_kind", "steps", "says"), [
    ("gpt", 0, "load_hf: the wrapped model is not a transformers model"),
    ("llama", 1, "load_hf: 1 optimizer step(s) have run"),
    ("olmoe", 0, "has no tensor model.layers.0.self_attn.q_norm.weight of shape (32,)"),
], ids=["not-transformers", "after-training", "another-model"])
def test_what_load_hf_cannot_read_is_refused_on_every_rank_in_one_line(model_kind, steps, says, tmp_path):
    """A checkpoint of another model (a Llama's, for an OLMoE) is refused naming the first tensor it lacks, with
    nothing overwritten."""
    build("llama").save_pretrained(str(tmp_path))
    outcomes = run_distributed(_refusal, 2, str(tmp_path), model_kind, steps)
    assert all(says in o and "\n" not in o for o in outcomes), outcomes
