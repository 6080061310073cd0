"""transformers' Phi-3 (and Phi-4, the same architecture) through the runtime: its fused qkv_proj / gate_up_proj are
held as parts (autopar.models.hf_fused), so under TP each rank holds its share of Q, K and V (of the gate and up
halves) and attention runs on its own heads; checkpoints keep the fused tensors. Training under TP, PP, ZeRO and CP:
tests/runtime/test_hf_families_train.py, test_context_parallel_hf.py; load_hf / save_hf: test_hf_checkpoint.py,
test_hf_save.py."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import GPT_UNITS, HF_TINY, same, token_data, view_logits
from tests.runtime.reference import assert_matches_reference

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS


def phi3_model(**fields):
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(**{**HF_TINY, "pad_token_id": 0, **fields}))


def test_the_units_view_equals_the_unsplit_hf_model():
    torch.manual_seed(0)
    torch.testing.assert_close(*view_logits(phi3_model()))


def test_the_parts_are_the_fused_rows_and_checkpoint_names_stay_fused():
    """Q, K, V (gate, up) are consecutive row blocks of the fused weight; the source the checkpoint code reads names
    the fused tensors with the unsplit model's shapes; viewing the model again changes nothing."""
    from autopar.models.hf import from_transformers

    hf = phi3_model(num_key_value_heads=2)
    unsplit = {k: v.clone() for k, v in hf.state_dict().items()}
    view = from_transformers(hf)
    qkv = view.layers[0].layer.self_attn.qkv_proj
    assert [p.weight.shape[0] for p in qkv.parts] == [32, 16, 16]  # 4 heads and 2 KV heads of 8
    fused = "model.layers.0.self_attn.qkv_proj.weight"
    torch.testing.assert_close(torch.cat([p.weight for p in qkv.parts]), unsplit[fused], atol=0, rtol=0)
    source = view.hf_source
    assert {k: v[0] for k, v in source.shapes.items()} == {k: tuple(v.shape) for k, v in unsplit.items()}
    assert source.blocks["layers.0.layer.mlp.gate_up_proj.parts.1.weight"] == ("model.layers.0.mlp.gate_up_proj.weight",
                                                                              0, 64)
    again = from_transformers(hf)
    assert again.hf_source.shapes == source.shapes and again.hf_source.blocks == source.blocks


def test_the_split_model_keeps_the_fused_state_dict(tmp_path):
    """Its own state_dict, load_state_dict and save_pretrained see the fused tensors, as before the split."""
    from autopar.models.hf import from_transformers

    hf = phi3_model()
    unsplit = {k: v.clone() for k, v in hf.state_dict().items()}
    from_transformers(hf)
    state = hf.state_dict()
    assert list(state) == list(unsplit)  # the same names, in the same order
    for k, v in unsplit.items():
        torch.testing.assert_close(state[k], v, atol=0, rtol=0)
    other = phi3_model()
    from_transformers(other)
    other.load_state_dict(unsplit)  # fused tensors into the parts
    torch.testing.assert_close(other.model.layers[0].mlp.gate_up_proj.parts[1].weight,
                               unsplit["model.layers.0.mlp.gate_up_proj.weight"][64:], atol=0, rtol=0)
    hf.save_pretrained(tmp_path)
    fresh = transformers.Phi3ForCausalLM.from_pretrained(tmp_path)
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, unsplit[k], atol=0, rtol=0)


def test_phi3_with_grouped_kv_heads_trains_under_tp_like_one_process():
    from autopar.models.hf import from_transformers

    x, y = token_data()
    plan = make_plan([(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=1))])])
    assert_matches_reference(lambda: from_transformers(phi3_model(num_key_value_heads=2).double()), plan, x, y,
                             tol=1e-6)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_search_formulas_price_the_blocks_wrap_runs(kv_heads, tmp_path):
    """`search --model config.json` reads Phi-3 by the zoo's formulas; the view wrap runs, traced, has the same
    parameters, TP-sharded parameters, TP collectives, TP limits and FLOPs per block."""
    from autopar.models.hf import from_transformers
    from autopar.modelspec.hf import from_hf_config
    from autopar.modelspec.trace import spec_from_module

    hf = phi3_model(num_key_value_heads=kv_heads)
    hf.config.save_pretrained(tmp_path)
    formulas = from_hf_config(tmp_path / "config.json", seq_len=16, dtype_bytes=2).layers[1]
    traced = spec_from_module(from_transformers(hf), torch.zeros(1, 16, dtype=torch.long), dtype_bytes=2).layers[1]
    for field in ("params", "tp_params", "tp_collectives", "tp_divisors", "flops"):
        assert getattr(traced, field) == getattr(formulas, field), field


def test_the_state_dict_names_map_only_real_tensors():
    """The fused state-dict entries are tensors made per call: matching the view's to the model's by identity must
    not pair two that merely reuse a freed one's id (one spurious name in about 30 views before it was fixed, which
    made save_hf's ranks disagree on who writes a fused tensor and hang)."""
    from autopar.models.hf import from_transformers

    for _ in range(30):
        view = from_transformers(phi3_model())
        real = {n for n, _ in view.named_parameters()} | {n for n, _ in view.named_buffers()}
        assert set(view.hf_source.names) <= real
