"""ParallelModel.save_hf: a model trained under a plan is written as the save_pretrained folder of its transformers
model, each rank writing its own pieces: the same file names, tensor names, shapes and dtypes as save_pretrained
writes, and from_pretrained of the folder holds exactly the trained weights (bit for bit, every sharding undone)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from tests.models.test_hf_families import build
from tests.runtime.cases import GPT_UNITS, same, token_data

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

E, L0, L1, H = GPT_UNITS
MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2)
# fields a family's tests set: GPT-2's dropout off (transformers' from_pretrained returns a model in eval mode)
EXTRA = {"mixtral": MIXTRAL, "gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
         # OPT-350M's layout: norms after each sublayer, projections in and out of a narrower embedding
         "opt": dict(ffn_dim=64, dropout=0.0, word_embed_proj_dim=16, do_layer_norm_before=False),
         # multi-query: c_attn held as the column-parallel queries and the K / V head whole on every rank
         "gpt_bigcode": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, multi_query=True),
         "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=4, embed_dropout=0.0,
                         attention_dropout=0.0, resid_dropout=0.0),
         "bloom": dict(hidden_dropout=0.0, attention_dropout=0.0)}


def _ep(zero: int, routed: tuple[str, ...] = (L0, L1)) -> list:
    return [(4, 2, [([0, 1, 2, 3], [(u, {"zero": zero, **({"ep": 2} if u in routed else {})}) for u in GPT_UNITS])])]


# name -> (family, tied embeddings, plan)
CASES = {
    "llama-tp2-sp-zero3": ("llama", False, [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "gemma2-tied-pp2-tp2": ("gemma2", True, [(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2))])]),
    "olmo2-dp2-zero1-pp2": ("olmo2", False, [(4, 2, [([0, 1], same([E, L0], zero=1)), ([2, 3], same([L1, H], zero=1))])]),
    # GPT-NeoX: lm_head in the module, embed_out in the files
    "gpt_neox-tp2-sp-zero3": ("gpt_neox", False, [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    # fused qkv_proj / gate_up_proj held as parts, each column-parallel: every rank writes its blocks of each part
    "phi3-tp2-sp-zero3": ("phi3", False, [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "gpt2-tp2-sp-zero3": ("gpt2", False, [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "gpt2-tied-pp2-tp2": ("gpt2", True, [(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2))])]),
    "opt-tp2-sp-zero3": ("opt", False, [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "gpt_bigcode-tied-pp2-tp2-sp": ("gpt_bigcode", True, [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                                                  ([2, 3], same([L1, H], tp=2, zero=3))])]),
    "gpt_neo-tp2-sp-zero3": ("gpt_neo", False, [(4, 2, [([0, 1, 2, 3], same(GPT_UNITS, tp=2, sp=True, zero=3))])]),
    "bloom-tied-pp2-tp2-sp": ("bloom", True, [(2, 4, [([0, 1], same([E, L0], tp=2, sp=True)),
                                                      ([2, 3], same([L1, H], tp=2, zero=3))])]),
    "glm4-pp2-tp2": ("glm4", False, [(2, 4, [([0, 1], same([E, L0], tp=2)), ([2, 3], same([L1, H], tp=2))])]),
    # two replicas laid out differently: each tensor is written from the first one only
    "qwen3-two-pipelines": ("qwen3", False, [(2, 2, [([0, 1], same(GPT_UNITS, tp=2, sp=True))]),
                                             (2, 2, [([2, 3], same(GPT_UNITS, zero=3))])]),
    # experts packed in the modules, saved one tensor per expert (Mixtral's under block_sparse_moe, w1 / w3 / w2)
    "mixtral-ep2-zero1": ("mixtral", False, _ep(1)),
    "olmoe-ep2-zero3": ("olmoe", False, _ep(3)),
    "gpt_oss-ep2": ("gpt_oss", False, _ep(0)),  # saved packed, with per-expert biases
    "deepseek_v3-ep2-zero1": ("deepseek_v3", False, _ep(1, routed=(L1,))),  # a dense first block: ep on the routed one only
}


def _model(kind: str, tied: bool):
    torch.manual_seed(3)
    model = build(kind, tie_word_embeddings=tied, **EXTRA.get(kind, {}))
    model.config.tie_word_embeddings = tied
    model.tie_weights()
    return model


def _train_and_save(rank, world, kind, tied, plan, path, max_file_bytes):
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap

    pm = wrap(from_transformers(_model(kind, tied)), plan, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    x, y = token_data()
    for _ in range(2):
        pm.step(x, y)
    pm.save_hf(path, max_file_bytes=max_file_bytes)
    return pm.full_state_dict()


def _tensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = os.path.join(path, "model.safetensors.index.json")
    files = {"model.safetensors"}
    if os.path.exists(index):
        with open(index) as f:
            files = set(json.load(f)["weight_map"].values())
    return {k: v for name in files for k, v in load_file(os.path.join(path, name)).items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_save_hf_writes_what_save_pretrained_writes_with_the_trained_weights(name, tmp_path):
    from autopar.models.hf import from_transformers

    kind, tied, pipelines = CASES[name]
    path = str(tmp_path / "trained")
    trained = run_distributed(_train_and_save, 4, kind, tied, make_plan(pipelines), path, 20_000)[0]
    model = _model(kind, tied)
    model.save_pretrained(tmp_path / "reference")
    ours, reference = _tensors(path), _tensors(str(tmp_path / "reference"))
    assert {k: (v.shape, v.dtype) for k, v in ours.items()} == {k: (v.shape, v.dtype) for k, v in reference.items()}
    assert len({f for f in os.listdir(path) if f.endswith(".safetensors")}) > 1  # split at max_file_bytes
    assert not os.path.exists(path + ".autopar-partial") and not os.path.exists(os.path.join(path, "sharded"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path)
    source = from_transformers(_model(kind, tied)).hf_source
    want = {}  # the trained tensors as the files should hold them
    for view_name, tensor in trained.items():
        if view_name in source.blocks:  # a part of a fused projection: its block of the fused tensor
            key, dim, start = source.blocks[view_name]
            want[key] = torch.cat([want[key], tensor], dim) if key in want else tensor
            assert start == 0 or key in want
        else:
            want[source.names[view_name][0]] = tensor
    state = loaded.state_dict()
    for key, tensor in want.items():
        torch.testing.assert_close(state[key], tensor, atol=0, rtol=0, msg=key)
    assert any(not torch.equal(tensor, reference[k]) for k, tensor in want.items() if k in reference)  # trained


def _refused(rank, world, path, kind):
    from autopar.errors import AutoparError
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap
    from tests.runtime.cases import gpt

    model = gpt() if kind == "gpt" else from_transformers(_model(kind, False))
    pm = wrap(model, make_plan([(2, 2, [([0, 1], same(GPT_UNITS, zero=1))])]), optimizer=torch.optim.SGD)
    try:
        pm.save_hf(path)
    except AutoparError as e:
        return str(e)
    return "saved"


def test_a_folder_in_use_or_a_model_without_hf_names_is_refused_on_every_rank(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    outcomes = run_distributed(_refused, 2, str(tmp_path), "llama")
    assert all("is not an empty folder" in o and "\n" not in o for o in outcomes), outcomes
    assert os.listdir(tmp_path) == ["notes.txt"]
    outcomes = run_distributed(_refused, 2, str(tmp_path / "new"), "gpt")
    assert all("not a transformers model" in o for o in outcomes), outcomes
    assert not os.path.exists(tmp_path / "new")


def _round_trip(rank, world, source, plan, path):
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(source))
    pm = wrap(from_transformers(model), plan, optimizer=torch.optim.SGD)
    pm.load_hf(source)
    pm.save_hf(path)


@pytest.mark.parametrize("name", ["llama-tp2-sp-zero3", "mixtral-ep2-zero1", "olmoe-ep2-zero3", "phi3-tp2-sp-zero3"])
def test_load_hf_then_save_hf_from_the_meta_device_gives_back_the_checkpoint(name, tmp_path):
    """No rank ever holds the whole model, and what comes out is what went in, tensor for tensor."""
    kind, tied, pipelines = CASES[name]
    _model(kind, tied).save_pretrained(tmp_path / "source")
    run_distributed(_round_trip, 4, str(tmp_path / "source"), make_plan(pipelines), str(tmp_path / "again"))
    source, again = _tensors(str(tmp_path / "source")), _tensors(str(tmp_path / "again"))
    assert source.keys() == again.keys()
    for k in source:
        torch.testing.assert_close(again[k], source[k], atol=0, rtol=0, msg=k)


def _other(kind: str):
    from tests.models.test_hf_seq2seq import t5
    from tests.runtime.test_hf import bert_model, gpt2_model

    torch.manual_seed(5)
    return {"gpt2": gpt2_model, "bert": bert_model, "t5": t5}[kind]()


def _save_as_wrapped(rank, world, kind, path):
    from autopar.models.hf import from_transformers
    from autopar.runtime import wrap
    from autopar.units import units as unit_names

    model = from_transformers(_other(kind))
    units = [n for n, _ in unit_names(model)]
    stages = [([0], [(u, {}) for u in units[:2]]), ([1], [(u, {"zero": 1}) for u in units[2:]])]
    wrap(model, make_plan([(2, 1, stages)]), optimizer=torch.optim.SGD).save_hf(path)


@pytest.mark.parametrize("kind", ["gpt2", "bert", "t5"])
def test_the_other_families_are_saved_as_save_pretrained_saves_them(kind, tmp_path):
    """GPT-2's and BERT's tied embeddings, T5's shared one: each written once, under save_pretrained's name."""
    run_distributed(_save_as_wrapped, 2, kind, str(tmp_path / "ours"))
    _other(kind).save_pretrained(tmp_path / "reference")
    ours, reference = _tensors(str(tmp_path / "ours")), _tensors(str(tmp_path / "reference"))
    assert ours.keys() == reference.keys()
    for k in reference:
        torch.testing.assert_close(ours[k], reference[k], atol=0, rtol=0, msg=k)
