"""A unit's matmuls (``LayerSpec.gemms``): what the GEMM wave model reads, consistent with the unit's FLOPs."""

from __future__ import annotations

import pytest
import torch

from autopar.errors import AutoparError
from autopar.modelspec import from_zoo
from autopar.modelspec.spec import LayerSpec
from autopar.modelspec.trace import spec_from_module
from autopar.modelspec.zoo import spec_from_entry, zoo_entry, zoo_names
from autopar.profile.reference import build_module
from cost_models.gemm_shapes import Gemm

ROUTER_FLOPS_PER_TOKEN = 2  # x hidden x experts


@pytest.mark.parametrize("name", [n for n in zoo_names() if not n.startswith("vit")])
def test_a_units_matmuls_are_its_flops_outside_the_attention_core(name):
    model, s = from_zoo(name, seq_len=32), 32
    entry = zoo_entry(name)
    blocks = [ly for ly in model.layers if ly.kind == "block"]
    assert blocks and all(ly.gemms and ly.gemm_rows == s for ly in blocks)
    for ly in blocks:
        rest = ly.flops - ly.attn_core_flops - ly.gemm_flops
        if ly.moe is None:
            assert rest == pytest.approx(0.0, abs=1e-6 * ly.flops)
        else:  # routed experts, the router and the shared experts' gate are not listed
            gate = 2 * s * model.hidden if entry.get("shared_gate") and entry.get("shared_ffn") else 0
            assert rest == pytest.approx(ly.moe.expert_flops + ROUTER_FLOPS_PER_TOKEN * s * model.hidden
                                         * ly.moe.num_experts + gate, rel=1e-9)
    head = model.layers[-1]
    if head.gemms:
        assert head.gemm_flops == pytest.approx(head.flops)


def test_op_recomputes_every_second_matmul_as_its_policy_says():
    block = from_zoo("llama3-8b", seq_len=512).layers[1]
    assert block.recompute_gemm_flops("op") == pytest.approx(block.op_facts().recompute_flops)
    assert block.recompute_gemm_flops("full") == block.gemm_flops
    assert block.recompute_gemm_flops("selective") == block.recompute_gemm_flops("none") == 0.0


def test_eager_attention_is_not_counted_as_matmuls():
    block = from_zoo("gpt-tiny").layers[1]  # eager attention: op recomputes its core besides the matmuls
    op = block.op_facts().recompute_flops
    assert block.recompute_gemm_flops("op") == pytest.approx(op - block.attn_core_flops)


def test_matmuls_beyond_the_units_flops_are_one_line():
    with pytest.raises(AutoparError, match="gemms"):
        LayerSpec("x", flops=1.0, gemms=(Gemm(8, 8),), gemm_rows=4)
    with pytest.raises(AutoparError, match="gemms"):
        LayerSpec("x", flops=1e9, gemms=(Gemm(8, 8),), gemm_rows=0)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_the_tracer_lists_the_matmuls_the_formulas_list(name):
    traced = spec_from_module(build_module(name), torch.randint(0, 256, (2, 32)), dtype_bytes=4)
    zoo = spec_from_entry(dict(zoo_entry(name), flash=True), dtype_bytes=4)
    for i in range(1, 5):  # blocks: the same matmuls, shapes and row-parallel ones, in the same order
        assert traced.layers[i].gemms == zoo.layers[i].gemms and traced.layers[i].gemm_rows == 32
    assert traced.layers[-1].gemm_flops == pytest.approx(zoo.layers[-1].gemm_flops)  # the LM head
    assert traced.layers[0].gemms == ()  # an embedding lookup runs no matmul


def test_a_matmul_over_one_token_is_not_listed():
    class Classifier(torch.nn.Module):  # a per-token projection, then a classifier on the first token
        def __init__(self):
            super().__init__()
            self.proj, self.cls = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.cls(self.proj(x)[:, 0])

    spec = spec_from_module(Classifier(), torch.randn(2, 8, 16))
    proj, cls = spec.layers
    assert proj.gemms == (Gemm(16, 16),) and proj.gemm_rows == 8
    assert cls.gemms == () and cls.flops > 0
