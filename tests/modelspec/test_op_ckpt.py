"""Ckpt ``op`` (torchtitan's op-level selective checkpointing) in the model spec: hand values of the
zoo formulas, the tracer agreeing with them, TP/SP splits and the one-line refusals."""

import pytest
import torch

from autopar.errors import AutoparError
from autopar.modelspec import from_zoo
from autopar.modelspec.trace import spec_from_module
from autopar.modelspec.zoo import spec_from_entry, zoo_entry
from autopar.profile.reference import build_module


def test_llama3_8b_block_hand_value():
    """Q (h), V (hkv), gate (f), down (h, row-parallel) kept; K, O, up recomputed; flash SDPA output and
    its fp32 statistics kept; the block input kept (torchtitan's mm_count % 2 rule over q, k, v, o, w1, w3, w2)."""
    m = from_zoo("llama3-8b", seq_len=8192)
    s, h, hkv, f, a, d = 8192, 4096, 1024, 14336, 32, 2
    blk = m.layers[1]
    assert blk.saved_bytes("op") == s * d * (h + h + hkv + h + f + h) + a * s * 4
    assert blk.recompute_flops("op") == 2 * s * h * (hkv + h + f)
    # tp 2: column outputs and SDPA halve, the down projection's partial sums do not; SP shards the input
    # and keeps the reduce-scattered outputs of both row-parallel matmuls
    col = s * d * (h + hkv + f + h) + a * s * 4
    assert blk.saved_bytes("op", tp=2) == s * h * d + col / 2 + s * h * d
    assert blk.saved_bytes("op", tp=2, sp=True) == s * h * d / 2 + col / 2 + s * h * d + 2 * s * h * d / 2


def test_fused_qkv_gelu_block_hand_value():
    """GPT-2 (HF): fused QKV kept, attention out recomputed, fc kept, proj recomputed."""
    e = dict(zoo_entry("gpt3-1.3b"), fused_qkv=True)
    blk = spec_from_entry(e, seq_len=2048).layers[1]
    s, h, f, a, d = 2048, 2048, 8192, 16, 2
    assert blk.saved_bytes("op") == s * d * (h + 3 * h + h + f) + a * s * 4
    assert blk.recompute_flops("op") == 2 * s * h * (h + f)


def test_eager_attention_is_recomputed():
    e = dict(zoo_entry("gpt3-1.3b"), flash=False)
    blk = spec_from_entry(e, seq_len=2048).layers[1]
    s, h = 2048, 2048
    assert blk.recompute_flops("op") == 2 * s * h * (h + h + 4 * h) + blk.attn_core_flops  # K, O, down + core


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_tracer_sees_what_the_formulas_say(name):
    traced = spec_from_module(build_module(name), torch.randint(0, 256, (2, 32)), dtype_bytes=4)
    zoo = spec_from_entry(dict(zoo_entry(name), flash=True), dtype_bytes=4)
    for i in range(1, 5):
        assert traced.layers[i].op == zoo.layers[i].op
    assert traced.layers[0].saved_bytes("op") == 32 * 8  # the embedding keeps its token ids, nothing else


def test_op_refused_in_one_line_where_not_modelled():
    m = from_zoo("llama3-8b")
    with pytest.raises(AutoparError) as e:
        m.layers[0].saved_bytes("op")
    assert "\n" not in str(e.value) and "layer embed.ckpt" in str(e.value)
    with pytest.raises(AutoparError, match="unknown mode 'ops'"):
        m.layers[1].saved_bytes("ops")
