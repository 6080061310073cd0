"""transformers' OPT through the runtime (autopar.models.hf_opt): the units view gives the HF logits (pre-norm OPT, and
OPT-350M's layout: norms after each sublayer, projections in and out of a narrower embedding), every strategy trains
as one process, TP with sequence parallelism on an MLP that flattens its tokens, and what cannot run is refused in one
line. load_hf / save_hf: test_hf_checkpoint.py, test_hf_save.py."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, drawn_away, same, token_data, view_logits
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
VARIANTS = {"pre-norm": {}, "350m-layout": dict(do_layer_norm_before=False, word_embed_proj_dim=16),
            "pre-norm-projected": dict(word_embed_proj_dim=16)}


def opt(**fields):
    """Tiny OPT, dropout off, biases and norms drawn away from their initial values."""
    cfg = transformers.OPTConfig(**{**dict(vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                           num_attention_heads=4, max_position_embeddings=16, dropout=0.0,
                                           word_embed_proj_dim=32, pad_token_id=1), **fields})
    return drawn_away(transformers.OPTForCausalLM(cfg))


def view(**fields):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(opt(**fields).double())


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_units_view_gives_the_hf_logits(variant, attn):
    torch.manual_seed(0)
    torch.testing.assert_close(*view_logits(opt(attn_implementation=attn, **VARIANTS[variant])))


def _plan(sp: bool, head_tp: int, zero: int = 1):
    return make_plan([(4, 2, [([0, 1, 2, 3], [(E, {"tp": 2}), (L0, {"tp": 2, "sp": sp, "zero": zero}),
                                             (L1, {"tp": 2, "sp": sp, "zero": 3}),
                                             (H, {"tp": head_tp, "sp": sp and head_tp > 1})])])])


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_opt_under_tp_trains_like_one_process(variant, sp):
    """Without sp, and with it (the MLP's flattened tokens gathered and reduce-scattered as rows; a head's
    project_out, whole on every rank, projecting the rank's own tokens: its gradient summed over TP)."""
    x, y = token_data()
    assert_matches_reference(view(**VARIANTS[variant]), _plan(sp, 2), x, y, tol=1e-6)


@pytest.mark.parametrize("plan", [
    [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, ckpt="full")), ([2, 3], same([L1, H], tp=2, ckpt="full"))])],
    [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, zero=3, ckpt="selective"))])],
    [(4, 2, [([0], same([E, L0], zero=0)), ([1], same([L1, H], ckpt="op"))])],
], ids=["pp2-tp2-sp-full-ckpt", "dp4-zero3-selective", "pp2-op-ckpt"])
def test_opt_trains_like_one_process_untied(plan):
    x, y = token_data()
    assert_matches_reference(view(tie_word_embeddings=False, attn_implementation="eager"), make_plan(plan), x, y,
                             tol=1e-6)


def test_a_project_out_gradient_is_summed_over_tp_only_under_sp():
    """Its gradient is a part with sp (the rank's tokens) and whole without: tp_partial_params names it only then."""
    from autopar.models.hf import from_transformers
    from autopar.runtime.tensor_parallel import tp_partial_params
    from autopar.units import unit_tp_info

    model = from_transformers(opt(**VARIANTS["350m-layout"]))
    table = unit_tp_info(model, "head", model.head).plan
    assert table["project_out"] == "sp_grad_sum"
    assert tp_partial_params(model.head, table, sp=True) == {"project_out.weight"}
    assert tp_partial_params(model.head, table, sp=False) == set()


def test_layerdrop_is_refused_naming_the_field():
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers

    with pytest.raises(AutoparError, match=r"model.config.layerdrop: is 0.1.*set layerdrop to 0.0"):
        from_transformers(opt(layerdrop=0.1))


def test_search_traces_what_wrap_runs(tmp_path):
    """`search --model config.json` traces OPT's units view: the transformers model's parameters, OPT-350M's head
    vocabulary-parallel (its project_out whole), the blocks' TP limits from heads and ffn_dim."""
    from autopar.modelspec.hf import from_hf_config

    hf = opt(**VARIANTS["350m-layout"], num_attention_heads=8, ffn_dim=48)
    hf.config.save_pretrained(tmp_path)
    spec = from_hf_config(tmp_path / "config.json", seq_len=16)
    assert sum(ly.params for ly in spec.layers) == sum(p.numel() for p in hf.parameters())  # the tied one once
    embed, block, head = spec.layers[0], spec.layers[1], spec.layers[-1]
    assert block.tp_divisors == (8, 48) and embed.tp_divisors == (64,) and head.tp_divisors == (64,)
    assert head.params == 32 * 16 and head.tp_params == 0  # project_out whole (the tied head weight: the embed's)
