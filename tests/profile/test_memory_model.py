"""With a profile, the memory model predicts what autopar.wrap really holds: model states to the byte,
saved activations within 10% (real runs on 2 fork-started processes)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autopar.cluster.parse import load_cluster
from autopar.modelspec.load import load_model
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy
from autopar.profile import apply_profile, apply_profile_model, load_profile
from autopar.profile.fidelity import predicted_memory
from autopar.profile.reference import build_module
from autopar.profile.runs import run_plan
from cost_models import CostParams

pytestmark = pytest.mark.dist

UNITS = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
BLOCKS = UNITS[1:-1]


def _plan(model, cluster, pipes, schedule="1f1b") -> Plan:
    pipelines = [Pipeline(mbs * m, mbs, m, [Stage(devs, [StageLayer(n, s) for n, s in layers]) for devs, layers in st],
                          virtual_stages=2 if schedule == "interleaved" else 1)
                 for mbs, m, st in pipes]
    return Plan(ModelRef(model.name, model.seq_len, model.num_layers, model.source), cluster, 8, pipelines,
                schedule=schedule)


def _every(units, **kw):
    return [(u, Strategy(**kw)) for u in units]


CASES = {
    "zero1-selective-m2": [(4, 2, [([0, 1], _every(["embed"], zero=1) + _every(BLOCKS, zero=1, ckpt="selective")
                                    + _every(["head"], zero=1))])],
    "zero3-m2": [(4, 2, [([0, 1], _every(UNITS, zero=3))])],
    # (the embedding is not checkpointed: full checkpointing keeps a unit's input, for the first unit the
    # token ids the caller holds anyway, while the model charges boundary_bytes, its output)
    "pp-1f1b-full": [(2, 4, [([0], _every(UNITS[:1]) + _every(UNITS[1:3], ckpt="full")), ([1], _every(UNITS[3:]))])],
    # two chunks a rank: each holds both chunks' states, and activations at its schedule's in-flight peak
    "pp2-interleaved": [(2, 4, [([0], _every(UNITS[:2])), ([1], _every(UNITS[2:3])), ([0], _every(UNITS[3:4])),
                                ([1], _every(UNITS[4:])), ])],
    "blocks-tp2-zero2": [(8, 1, [([0, 1], _every(["embed"], zero=2) + _every(BLOCKS, tp=2) + _every(["head"], zero=2))])],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_model_matches_the_runtime(tiny_profile, case):
    prof = load_profile(tiny_profile)
    model = apply_profile_model(load_model("gpt-tiny", dtype_bytes=4), prof)
    cluster, params = apply_profile(load_cluster("2xcpu"), CostParams(), prof)
    plan = _plan(model, cluster, CASES[case], "interleaved" if "interleaved" in case else "1f1b")
    g = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 256, (8, 32), generator=g), torch.randint(0, 256, (8, 32), generator=g))
    ranks = run_plan(lambda: build_module("gpt-tiny"), plan, batch, steps=0, warmup=1)
    pred = predicted_memory(plan, model, params)
    for r in ranks:
        assert r.state_bytes == pred[r.rank]["states"], (r.rank, r.param_bytes, r.grad_bytes, r.opt_bytes)
        assert r.saved_peak_bytes == pytest.approx(pred[r.rank]["saved"], rel=0.10)


def test_a_profile_never_adds_memory_bound_traffic_on_top_of_its_measured_units(tiny_profile, tmp_path):
    """Measured unit times include their memory-bound kernels: a profile's params carry act_traffic 0,
    and one written before the field existed applies as 0 too (not the default 3)."""
    import yaml

    assert CostParams().act_traffic > 0
    _, params = apply_profile(load_cluster("2xcpu"), CostParams(), load_profile(tiny_profile))
    assert params.act_traffic == 0.0
    doc = yaml.safe_load(tiny_profile.read_text())
    del doc["cost_params"]["act_traffic"]
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(doc))
    _, params = apply_profile(load_cluster("2xcpu"), CostParams(), load_profile(old))
    assert params.act_traffic == 0.0


def test_a_profiles_measured_peak_replaces_the_catalogues_achievable_matmul_figure(tiny_profile):
    """The profiler times its own matmuls: the measured peak is what they reach, so no MAMF factor stays on it."""
    plain = load_cluster("2xcpu")
    nodes = [replace(nd, gpu=replace(nd.gpu, mamf=0.5)) for nd in plain.nodes]
    cluster, _ = apply_profile(replace(plain, nodes=nodes), CostParams(), load_profile(tiny_profile))
    assert all(nd.gpu.mamf == 0 and nd.gpu.matmul_factor("tflops") == 1.0 for nd in cluster.nodes)
    assert cluster.nodes[0].gpu.sustained_flops == apply_profile(plain, CostParams(), load_profile(tiny_profile))[0] \
        .nodes[0].gpu.sustained_flops


TIE_PLANS = {  # (mbs, m, [(devices, [(unit, strategy)])]) over the HF units view's embed / layers.0-1 / head
    "one-stage": [(4, 2, [([0, 1], _every(["embed", "layers.0", "layers.1", "head"]))])],
    "two-stages": [(2, 4, [([0], _every(["embed", "layers.0"])), ([1], _every(["layers.1", "head"]))])],
    "zero3": [(4, 2, [([0, 1], _every(["embed", "layers.0", "layers.1", "head"], zero=3))])],
}


@pytest.mark.parametrize("case", sorted(TIE_PLANS))
def test_a_tied_head_holds_its_copy_in_the_runtime_and_in_the_model(tiny_profile, case):
    """autopar's runtime gives a tied LM head its own copy of the embedding (runtime/ties.py): the ranks hold the
    tied Llama's model states to the byte as they hold the untied one's, and the traced spec's ``tied_params``
    makes the cost model say the same (cost_models/ties.py); without the copy it would be V x h short."""
    transformers = pytest.importorskip("transformers")
    from autopar.models.hf import from_transformers
    from autopar.modelspec import spec_from_module

    def build(tied: bool):
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                       tie_word_embeddings=tied)
        return lambda: from_transformers(transformers.LlamaForCausalLM(cfg))

    prof = load_profile(tiny_profile)
    cluster, params = apply_profile(load_cluster("2xcpu"), CostParams(), prof)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 64, (8, 16), generator=g), torch.randint(0, 64, (8, 16), generator=g))
    states = {}
    for tied in (True, False):
        model = spec_from_module(build(tied)(), batch[0][:1], name=f"llama-tied-{tied}")
        plan = _plan(model, cluster, TIE_PLANS[case])
        runtime = {r.rank: r.state_bytes for r in run_plan(build(tied), plan, batch, steps=0, warmup=1)}
        predicted = {rank: v["states"] for rank, v in predicted_memory(plan, model, params).items()}
        assert runtime == predicted, (tied, runtime, predicted)
        states[tied] = runtime
        if tied:
            assert model.layers[-1].tied_params == model.layers[0].shared_params == 64 * 32
    assert states[True] == states[False]
