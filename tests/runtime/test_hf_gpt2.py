"""transformers' GPT-2 under tensor parallel: its Conv1D projections (weights stored transposed) are column- and
row-parallel (autopar.runtime.tp_linear), its fused c_attn is held as Q, K and V Conv1D parts (autopar.models.hf_fused),
and checkpoints keep the fused, transposed tensors. Training equals one process; load_hf / save_hf:
test_hf_checkpoint.py, test_hf_save.py; the view's logits and PP / ZeRO without TP: test_hf.py."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import GPT_UNITS, drawn_away, same, token_data
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def gpt2(**fields):
    """Tiny GPT-2, dropout off, biases and norms drawn away from their initial values (a bias the TP split put in
    the wrong place, or added on every rank, shows)."""
    cfg = transformers.GPT2Config(**{**dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), **fields})
    return drawn_away(transformers.GPT2LMHeadModel(cfg))


def view(dtype=torch.float64, **fields):
    from autopar.models.hf import from_transformers

    return lambda: from_transformers(gpt2(**fields).to(dtype))


def test_the_parts_are_the_fused_columns_and_checkpoint_names_stay_fused(tmp_path):
    """Q, K, V are consecutive column blocks of the fused (in, out) weight; the model's own state_dict,
    load_state_dict and save_pretrained still see the fused tensors."""
    from autopar.models.hf import from_transformers

    hf = gpt2()
    unsplit = {k: v.clone() for k, v in hf.state_dict().items()}
    source = from_transformers(hf).hf_source
    c_attn = hf.transformer.h[0].attn.c_attn
    assert [tuple(p.weight.shape) for p in c_attn.parts] == [(32, 32)] * 3
    fused = "transformer.h.0.attn.c_attn"
    torch.testing.assert_close(torch.cat([p.weight for p in c_attn.parts], 1), unsplit[f"{fused}.weight"], atol=0, rtol=0)
    assert source.blocks["layers.0.block.attn.c_attn.parts.2.weight"] == (f"{fused}.weight", 1, 64)
    assert source.blocks["layers.0.block.attn.c_attn.parts.2.bias"] == (f"{fused}.bias", 0, 64)
    state = hf.state_dict()
    assert list(state) == list(unsplit)
    for k, v in unsplit.items():
        torch.testing.assert_close(state[k], v, atol=0, rtol=0)
    other = gpt2()
    from_transformers(other)
    other.load_state_dict(unsplit)
    torch.testing.assert_close(other.transformer.h[1].attn.c_attn.parts[1].weight,
                               unsplit["transformer.h.1.attn.c_attn.weight"][:, 32:64], atol=0, rtol=0)
    hf.save_pretrained(tmp_path)
    for k, v in transformers.GPT2LMHeadModel.from_pretrained(tmp_path).state_dict().items():
        torch.testing.assert_close(v, unsplit[k], atol=0, rtol=0)


PLANS = {
    "tp2-sp-zero1": [(4, 2, [([0, 1, 2, 3], [(E, {"tp": 2}), (L0, {"tp": 2, "sp": True, "zero": 1}),
                                             (L1, {"tp": 2, "sp": True, "zero": 1}), (H, {"tp": 2, "sp": True})])])],
    "tp2-zero3": [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, zero=3))])],
    "pp2-tp2-full-ckpt": [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True, ckpt="full")),
                                  ([2, 3], same([L1, H], tp=2, ckpt="full"))])],
    "tp2-op-ckpt": [(4, 2, [([0, 1], [(E, {"tp": 2}), (L0, {"tp": 2, "ckpt": "op"}), (L1, {"tp": 2, "ckpt": "selective"}),
                                      (H, {"tp": 2})])])],
}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_gpt2_under_tp_trains_like_one_process(name, tied):
    x, y = token_data()
    plan = make_plan(PLANS[name])
    if tied and name == "tp2-sp-zero1":  # the runtime syncs a tied copy under TP or ZeRO-1/2, not both
        plan = make_plan([(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])])
    assert_matches_reference(view(tie_word_embeddings=tied, scale_attn_by_inverse_layer_idx=True), plan, x, y,
                             tol=1e-6)


@pytest.mark.parametrize("upcast", [False, True])
def test_gpt2_eager_attention_under_tp_and_sp_trains_like_one_process(upcast):
    """Eager attention gets its causal mask over the whole sequence under sp; ``reorder_and_upcast_attn`` (eager
    only) reads its head count from the query, not the module (float32: its scores must be float32)."""
    x, y = token_data()
    plan = make_plan([(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])])
    dtype, tol = (torch.float32, 1e-5) if upcast else (torch.float64, 1e-6)
    assert_matches_reference(view(dtype, attn_implementation="eager", reorder_and_upcast_attn=upcast), plan, x, y,
                             tol=tol)


def _local_shapes(rank, world):
    from autopar.runtime import wrap

    pm = wrap(view()(), make_plan([(2, 2, [([0, 1], same(GPT_UNITS, tp=2))])]),
              optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    block = pm.local_units["layers.0"].block
    return {name: tuple(p.to_local().shape) for name, p in block.named_parameters() if name.endswith("weight")
            and hasattr(p, "to_local")}


def test_each_rank_holds_its_share_of_every_projection():
    for shapes in run_distributed(_local_shapes, 2):
        assert shapes["attn.c_attn.parts.0.weight"] == (32, 16)  # (in, out / tp): columns
        assert shapes["attn.c_proj.weight"] == (16, 32)  # (in / tp, out): rows
        assert shapes["mlp.c_fc.weight"] == (32, 64) and shapes["mlp.c_proj.weight"] == (64, 32)


@pytest.mark.parametrize("fields", [{}, {"n_inner": 48}], ids=["ffn-4h", "n_inner"])
def test_the_search_formulas_price_the_blocks_wrap_runs(fields, tmp_path):
    """`search --model config.json` reads GPT-2 by the zoo's formulas; the view wrap runs, traced, has the same
    parameters, TP-sharded parameters, TP collectives, TP limits and FLOPs per block."""
    from autopar.models.hf import from_transformers
    from autopar.modelspec.hf import from_hf_config
    from autopar.modelspec.trace import spec_from_module

    hf = gpt2(**fields)
    hf.config.save_pretrained(tmp_path)
    formulas = from_hf_config(tmp_path / "config.json", seq_len=16, dtype_bytes=2).layers[1]
    traced = spec_from_module(from_transformers(hf), torch.zeros(1, 16, dtype=torch.long), dtype_bytes=2).layers[1]
    for field in ("params", "tp_params", "tp_collectives", "tp_divisors", "flops"):
        assert getattr(traced, field) == getattr(formulas, field), field
