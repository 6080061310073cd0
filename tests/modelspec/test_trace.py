"""The meta-device tracer against models whose FLOPs, parameters and saved bytes are known."""

import resource

import pytest
import torch
from torch import nn

from autopar.errors import AutoparError
from autopar.modelspec import from_zoo, spec_from_module

from .refmodels import gpt, llama


def test_linear_stack_exact():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
    m = spec_from_module(model, torch.randn(5, 16), name="mlp")
    assert [ly.name for ly in m.layers] == ["0", "1", "2"]
    assert [ly.params for ly in m.layers] == [16 * 32 + 32, 0, 32 * 8]
    assert [ly.flops for ly in m.layers] == [2 * 16 * 32, 0, 2 * 32 * 8]  # per sample
    assert [ly.boundary_bytes for ly in m.layers] == [32 * 4, 32 * 4, 32 * 4]  # last unit: its input
    # saved for backward: the first Linear keeps its input (for the weight gradient); ReLU keeps its
    # output and the last Linear its input: one storage, counted once; the loss keeps the last output in fp32
    assert [ly.saved_bytes("none") for ly in m.layers] == [16 * 4, 32 * 4, 8 * 4]
    assert [ly.loss_bytes for ly in m.layers] == [0, 0, 8 * 4]
    assert m.seq_len == 1 and m.dtype_bytes == 4 and not any(ly.supports_tp for ly in m.layers)
    assert m.meta["traced"]["backward_flops"] == 2 * 32 * 8 * 2 + 2 * 16 * 32  # first layer: no input grad


def _diff(traced, zoo, fields):
    return {f: (getattr(traced, f), getattr(zoo, f)) for f in fields if getattr(traced, f) != getattr(zoo, f)}


SHAPE = ("name", "params", "flops", "attn_core_flops", "boundary_bytes")
TP = ("kind", "tp_divisors", "tp_comm_bytes", "tp_collectives", "tp_plan")


@pytest.mark.parametrize(("family", "zoo_name"), [("gpt", "gpt-tiny"), ("llama", "llama-tiny")])
def test_reference_models_match_zoo(family, zoo_name):
    """autopar.models' GPT / Llama in the tiny zoo shapes: units, params, FLOPs, TP facts equal the formulas."""
    from autopar.models import GPT, GPTConfig, Llama, LlamaConfig

    model = GPT(GPTConfig(seq_len=32, n_layers=4)) if family == "gpt" else Llama(LlamaConfig(seq_len=32, n_layers=4))
    traced = spec_from_module(model, torch.zeros(2, 32, dtype=torch.long), dtype_bytes=2)
    zoo = from_zoo(zoo_name)
    assert [ly.name for ly in traced.layers] == [ly.name for ly in zoo.layers]
    for t, z in zip(traced.layers, zoo.layers):
        assert not _diff(t, z, SHAPE + TP), t.name
    # column-parallel biases (GPT's q, k, v and up) shard with their columns in both
    assert [t.tp_params for t in traced.layers[1:]] == [z.tp_params for z in zoo.layers[1:-1]] + [
        zoo.layers[-1].tp_params]
    assert traced.layers[1].tp_plan == f"{family}.block" and traced.layers[0].tp_plan == f"{family}.embed"
    assert (traced.hidden, traced.num_heads, traced.ffn, traced.vocab) == (zoo.hidden, zoo.num_heads, zoo.ffn, zoo.vocab)


def test_eager_gpt_saves_what_korthikanti_counts():
    """softmax(QK^T)V written out (no dropout, no flash), traced in bf16: saved bytes equal gpt-tiny's."""
    traced = spec_from_module(gpt(), torch.zeros(1, 32, dtype=torch.long), dtype_bytes=2)
    zoo = from_zoo("gpt-tiny")
    s = 32
    for t, z in zip(traced.layers, zoo.layers[:-1]):
        assert not _diff(t, z, SHAPE + ("act_tp_bytes", "act_attn_bytes")), t.name
    for t, z in zip(traced.layers[1:-1], zoo.layers[1:-1]):
        assert t.act_seq_bytes == z.act_seq_bytes + 2 * 2 * s * 4  # + LayerNorm's fp32 mean and rstd
    assert traced.layers[0].act_seq_bytes == zoo.layers[0].act_seq_bytes  # token and position ids
    head_t, head_z = traced.layers[-1], zoo.layers[-1]
    assert not _diff(head_t, head_z, ("params", "flops", "boundary_bytes", "loss_bytes", "act_tp_bytes"))
    assert head_t.act_tp_bytes == head_z.act_tp_bytes == 4 * s * 256  # the loss's fp32 logits, in both


def test_eager_llama_saves_what_the_formulas_count():
    """GQA (K, V expanded to all heads), SwiGLU (4 ffn-wide tensors), RoPE: TP and attention bytes exact."""
    traced = spec_from_module(llama(ffn=128), torch.zeros(1, 32, dtype=torch.long), dtype_bytes=2)
    zoo = from_zoo("llama-tiny")
    for t, z in zip(traced.layers[1:-1], zoo.layers[1:-1]):
        assert not _diff(t, z, SHAPE + ("act_tp_bytes", "act_attn_bytes")), t.name  # cos / sin are buffers
        assert t.act_seq_bytes > z.act_seq_bytes  # unfused RMSNorm also keeps an fp32 copy and rstd
    assert traced.num_params == zoo.num_params


def test_per_sample_numbers_do_not_depend_on_batch():
    one = spec_from_module(gpt(), torch.zeros(1, 32, dtype=torch.long))
    three = spec_from_module(gpt(), torch.zeros(3, 32, dtype=torch.long))
    for a, b in zip(one.layers[1:], three.layers[1:]):
        assert a == b
    assert one.dtype_bytes == 4  # the module's own dtype by default


def test_huge_model_needs_no_memory():
    with torch.device("meta"):  # 64 x 4096^2 parameters: 4.3 GB in fp32 if it were real
        model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(64)])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m = spec_from_module(model, torch.empty(4096, 4096, device="meta"))  # 64 MB per activation if real
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200
    assert m.num_params == 64 * (4096 * 4096 + 4096)
    assert m.flops_per_sample == 64 * 2 * 4096 * 4096
    # each Linear keeps its input; the loss keeps the last one's output, in fp32
    assert [ly.act_tp_bytes for ly in m.layers] == [4096 * 4] * 63 + [4096 * 4 * 2]


def test_real_module_is_not_copied_or_changed():
    model = nn.Sequential(nn.Linear(2048, 2048), nn.Dropout(0.1), nn.Linear(2048, 2048)).eval()
    w = model[0].weight.detach().clone()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m = spec_from_module(model, torch.empty(100_000, 2048), dtype_bytes=2)  # 400 MB per activation if real
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 150
    assert not model.training and model[0].weight.device.type == "cpu" and torch.equal(model[0].weight, w)
    assert model[0].weight.grad is None and not model[0]._forward_hooks and not model._forward_pre_hooks
    assert m.dtype_bytes == 2 and m.layers[0].boundary_bytes == 2048 * 2
    assert m.layers[1].act_seq_bytes > 0  # dropout ran in training mode and kept its mask


class TiedLM(nn.Module):
    """Glue in the root's own forward: a tied output projection and a root-level parameter."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.bias = nn.Parameter(torch.zeros(16))
        self.mix = nn.Linear(16, 16)

    def forward(self, ids):
        x = self.mix(self.emb(ids) + self.bias)
        return x @ self.emb.weight.T


def test_glue_goes_to_last_unit_and_root_params_to_first():
    m = spec_from_module(TiedLM(), torch.zeros(2, 8, dtype=torch.long))
    emb, mix = m.layers
    assert (emb.name, mix.name) == ("emb", "mix")
    assert emb.params == 100 * 16 + 16 and mix.params == 16 * 16 + 16
    assert emb.flops == 0 and mix.flops == 8 * (2 * 16 * 16 + 2 * 16 * 100)
    assert m.seq_len == 8 and m.vocab == 100


def test_a_unit_using_an_earlier_units_weight_names_it_on_both():
    """Tied embeddings as units: the head's weight is the embedding's. The spec counts it once, at the embedding
    (``shared_params``), and names it on the head (``tied_params``): the tensor the runtime gives the head a copy
    of (runtime/ties.py ``untie``), whose size the cost model charges there."""
    from autopar.runtime.ties import untie
    from autopar.units import units

    emb, head = nn.Embedding(64, 16), nn.Linear(16, 64, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, nn.Linear(16, 16), nn.Tanh(), head)
    m = spec_from_module(model, torch.zeros(2, 8, dtype=torch.long))
    first, last = m.layers[0], m.layers[-1]
    assert (first.params, first.shared_params, last.params, last.tied_params) == (64 * 16, 64 * 16, 0, 64 * 16)
    assert all(ly.tied_params == ly.shared_params == 0 for ly in m.layers[1:-1])
    _, ties = untie(units(model))
    copies = [c for tie in ties for c in tie.copies[1:]]
    assert [(c.unit, dict(units(model))[c.unit].get_parameter(c.fqn).numel()) for c in copies] == [("3", 64 * 16)]


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.spare, self.b = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


def test_units_that_never_run_hand_params_to_the_previous_unit():
    m = spec_from_module(Unused(), torch.randn(2, 4))
    assert [ly.name for ly in m.layers] == ["a", "b"] and m.layers[0].params == 40
    assert m.meta["unused_units"] == ["spare"]


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y if y.sum() > 0 else -y  # needs real values: impossible on meta


def test_trace_failure_is_an_autopar_error():
    with pytest.raises(AutoparError, match=r"^model: tracing DataDependent on the meta device failed.*register cached"):
        spec_from_module(DataDependent(), torch.randn(2, 4))
    with pytest.raises(AutoparError, match="^model: expected a torch.nn.Module"):
        spec_from_module(lambda x: x, torch.randn(2, 4))
    with pytest.raises(AutoparError, match="^dtype_bytes"):
        spec_from_module(nn.Linear(2, 2), torch.randn(1, 2), dtype_bytes=3)


def test_modelspec_from_module_spelling():
    from autopar.modelspec import ModelSpec

    m = ModelSpec.from_module(nn.Sequential(nn.Linear(3, 5)), torch.randn(2, 3))
    assert m.num_params == 20 and m.flops_per_sample == 30


def test_units_are_named_as_wrap_names_them():
    """One discovery (autopar.units.discover): nested Sequentials expanded, a module used twice is a
    unit at both positions (its second run charged there, its parameters to the first)."""
    from autopar.units import units

    lin = nn.Linear(6, 6)
    model = nn.Sequential(nn.Sequential(nn.Linear(6, 6), nn.Tanh()), lin, nn.Tanh(), lin, nn.Linear(6, 3))
    spec = spec_from_module(model, torch.zeros(4, 6))
    assert [ly.name for ly in spec.layers] == [n for n, _ in units(model)] == ["0.0", "0.1", "1", "2", "3", "4"]
    by = {ly.name: ly for ly in spec.layers}
    assert by["1"].flops == by["3"].flops == 2 * 6 * 6 and by["1"].params == 42 and by["3"].params == 0
