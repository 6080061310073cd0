"""Zoo: parameter counts and FLOPs against published figures, activations against Korthikanti et al."""

import pytest

from autopar.errors import AutoparError
from autopar.modelspec import from_zoo, zoo_entry, zoo_names
from autopar.modelspec.zoo import normalize_entry, spec_from_entry

# Exact parameter counts of the released checkpoints (HF safetensors / model cards).
EXACT_PARAMS = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "bert-base": 109_514_298,  # BertForMaskedLM, bert-base-uncased
}
# Nominal sizes from the papers (GPT-3 table 2.1, BERT, ViT table 1): within 2%.
NOMINAL_PARAMS = {
    "gpt3-1.3b": 1.3e9, "gpt3-2.7b": 2.7e9, "gpt3-6.7b": 6.7e9, "gpt3-13b": 13e9, "gpt3-175b": 175e9,
    "bert-large": 340e6, "vit-huge": 632e6,
}


@pytest.mark.parametrize("name", sorted(EXACT_PARAMS))
def test_exact_param_counts(name):
    assert from_zoo(name).num_params == EXACT_PARAMS[name]


@pytest.mark.parametrize("name", sorted(NOMINAL_PARAMS))
def test_nominal_param_counts(name):
    assert from_zoo(name).num_params == pytest.approx(NOMINAL_PARAMS[name], rel=0.02)


def test_every_entry_builds_with_named_units():
    for name in zoo_names():
        m = from_zoo(name)
        e = zoo_entry(name)
        assert [ly.name for ly in m.layers] == ["embed", *[f"layers.{i}" for i in range(e["layers"])], "head"]
        assert m.source == name and m.seq_len == e["seq_len"]
        assert all(ly.tp_params <= ly.params for ly in m.layers)


def test_megatron_flops_formula_gpt3():
    """Narayanan et al. 2104.04473: forward = 24*B*s*L*h^2 * (1 + s/(6h) + V/(12*h*L)) for GPT."""
    m = from_zoo("gpt3-175b")
    s, L, h, V = m.seq_len, 96, 12288, m.vocab
    assert V == 50304  # padded as Megatron trains it
    assert m.flops_per_sample == pytest.approx(24 * s * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L)), rel=1e-12)


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b", "llama3-8b"])
def test_palm_training_flops_per_token(name):
    """PaLM appendix B: training FLOPs per token = 6*N + 12*L*h*s, N without the input embedding."""
    m = from_zoo(name)
    e = zoo_entry(name)
    n_dense = m.num_params - m.layers[0].params
    per_token = 6 * n_dense + 12 * e["layers"] * e["hidden"] * m.seq_len
    assert m.model_flops_per_sample / m.seq_len == pytest.approx(per_token, rel=1e-4)  # norms carry no flops


def test_gpt3_training_compute_matches_brown_et_al():
    """GPT-3 175B: 3.14e23 training FLOPs for 300B tokens (table D.1 counts 6*N*D, no attention term)."""
    m = from_zoo("gpt3-175b")
    no_attn = sum(ly.flops - ly.attn_core_flops for ly in m.layers)
    assert 3 * no_attn / m.seq_len * 300e9 == pytest.approx(3.14e23, rel=0.01)


def _gpt_no_flash(name="gpt3-175b", seq_len=None):
    e = zoo_entry(name)
    e["flash"] = False
    return spec_from_entry(e, seq_len=seq_len)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_closed_forms(t):
    """2205.05198 eqs. 2-6 per transformer layer (fp16, dropout, GeLU MLP, no flash attention)."""
    m = _gpt_no_flash()
    s, h, a = m.seq_len, m.hidden, m.num_heads
    ly = m.layers[1]
    assert ly.saved_bytes("none", tp=1) == s * h * (34 + 5 * a * s / h)
    assert ly.saved_bytes("none", tp=t) == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
    if t > 1:
        assert ly.saved_bytes("none", tp=t, sp=True) == pytest.approx(s * h / t * (34 + 5 * a * s / h))
        assert ly.saved_bytes("selective", tp=t, sp=True) == pytest.approx(34 * s * h / t)
    assert ly.saved_bytes("selective", tp=t) == pytest.approx(s * h * (10 + 24 / t))
    assert ly.saved_bytes("full", tp=1) == 2 * s * h
    assert ly.recompute_flops("selective") == 4 * s * s * h
    head = m.layers[-1]
    assert head.act_tp_bytes == 4 * s * m.vocab  # fp32 logits for the loss, vocab-parallel (4sbv/t)


@pytest.mark.parametrize("t", [1, 4])
def test_fp8_linear_inputs_kept_at_half_bytes(t):
    """Transformer Engine FP8 (linear_input_share 0.5): the two norm outputs, the out-projection's and the
    down-projection's inputs are kept at 1 byte of 2: Korthikanti's 34 sbh/t becomes 27 (eager attention, SP);
    with flash attention the out-projection's input is flash's own bf16 output, so the linear layer's FP8 copy
    comes on top: 34 - 6 + 1 = 29 (its attention statistics aside)."""
    eager = _gpt_no_flash().layers[1]
    flash = from_zoo("gpt3-175b").layers[1]
    s, h = from_zoo("gpt3-175b").seq_len, from_zoo("gpt3-175b").hidden
    sp = t > 1
    assert eager.saved_bytes("none", t, sp, 0.5) == pytest.approx(eager.saved_bytes("none", t, sp) - 7 * s * h / t)
    assert eager.saved_bytes("selective", t, sp, 0.5) == pytest.approx(27 * s * h / t) if sp else True
    assert flash.saved_bytes("none", t, sp, 0.5) == pytest.approx(flash.saved_bytes("none", t, sp) - 5 * s * h / t)
    assert flash.saved_bytes("none", t, sp, 1.0) == flash.saved_bytes("none", t, sp)
    assert flash.saved_bytes("full", t, sp, 0.5) == flash.saved_bytes("full", t, sp)  # only the unit's input
    assert from_zoo("gpt3-175b").layers[-1].cast_input_delta(t, sp, 0.5) == 0.0  # the head: no such inputs named
    if not sp:  # TP alone replicates the norm outputs: their half byte is saved on every rank
        two_norms = 2 * s * h * 2
        assert eager.cast_input_delta(t, False, 0.5) == pytest.approx(-0.5 * (two_norms + (4 * h + h) * s * 2 / t))


def test_flash_swiglu_gqa_adjustments():
    s, h, f = 4096, 8192, 28672
    ly = from_zoo("llama2-70b").layers[1]  # 64 heads, 8 KV heads, no dropout, flash
    hkv = 8 * 128
    assert ly.act_seq_bytes == 4 * 2 * s * h  # norm inputs and outputs, no dropout masks
    assert ly.act_tp_bytes == 2 * s * (2 * h + 2 * hkv) + 4 * 2 * s * f  # Q, out, small K V; 4 SwiGLU tensors
    assert ly.act_attn_bytes == 64 * s * 4  # softmax statistics only
    assert ly.params == 2 * h * h + 2 * h * hkv + 3 * h * f + 2 * h
    assert ly.flops == 2 * s * (2 * h * h + 2 * h * hkv + 3 * h * f) + 4 * s * s * h
    assert ly.tp_divisors == (64, 8, f) and ly.tp_ok(8) and not ly.tp_ok(16)
    e = zoo_entry("llama2-70b")
    e["flash"] = False  # eager attention expands K and V to all 64 heads before the matmuls
    eager = spec_from_entry(e).layers[1]
    assert eager.act_tp_bytes == 2 * s * 4 * h + 4 * 2 * s * f
    assert eager.act_attn_bytes == 64 * s * s * 2


def test_tp_comm_and_plans():
    m = from_zoo("llama2-7b")
    s, h, d = m.seq_len, m.hidden, m.dtype_bytes
    embed, block, head = m.layers[0], m.layers[1], m.layers[-1]
    assert (block.tp_comm_bytes, block.tp_collectives, block.tp_plan) == (2 * s * h * d, 2, "llama.block")
    assert (embed.tp_comm_bytes, embed.tp_collectives, embed.tp_plan) == (s * h * d, 1, "llama.embed")
    assert (head.tp_comm_bytes, head.tp_collectives, head.tp_plan) == (s * h * d, 1, "llama.head")
    assert embed.tp_divisors == head.tp_divisors == (32000,)
    assert head.boundary_bytes == block.boundary_bytes == s * h * d
    assert from_zoo("gpt3-1.3b").layers[1].tp_plan == "gpt.block"
    from autopar.models import TP_PLANS  # every plan name the zoo emits exists in the runtime's tables

    assert {ly.tp_plan for n in zoo_names() for ly in from_zoo(n).layers if ly.tp_plan} <= set(TP_PLANS)
    assert not from_zoo("vit-huge").layers[0].supports_tp


def test_seq_len_scales_attention_quadratically():
    a, b = from_zoo("llama2-7b", seq_len=1024).layers[1], from_zoo("llama2-7b", seq_len=2048).layers[1]
    assert b.attn_core_flops == 4 * a.attn_core_flops
    assert b.flops - b.attn_core_flops == 2 * (a.flops - a.attn_core_flops)


def test_tied_embeddings_counted_once():
    m = from_zoo("gpt3-175b")
    assert m.meta["tied_embeddings"] and m.layers[-1].params == 2 * 12288  # final LayerNorm only
    assert not from_zoo("llama2-7b").meta["tied_embeddings"]


def test_tied_embeddings_name_the_matrix_on_both_units():
    """The head uses the embedding's V x h matrix (the copy a runtime may keep), the embedding shares it."""
    m = from_zoo("gpt3-175b")
    embed, head = m.layers[0], m.layers[-1]
    assert head.tied_params == embed.shared_params == m.vocab * m.hidden
    assert embed.shared_params <= embed.params and m.num_params == sum(ly.params for ly in m.layers)
    untied = from_zoo("llama2-7b")
    assert untied.layers[-1].tied_params == untied.layers[0].shared_params == 0


def test_vit_units():
    m = from_zoo("vit-huge")
    assert m.seq_len == 257 and m.layers[0].flops == 2 * 256 * 3 * 14 * 14 * 1280
    assert m.layers[-1].flops == 2 * 1280 * 1000


def test_bad_names_and_lengths():
    with pytest.raises(AutoparError, match=r"^model: unknown model 'lama2-7b'; did you mean llama2-7b.*autopar list models"):
        from_zoo("lama2-7b")
    with pytest.raises(AutoparError, match="^seq_len: .*learned positions up to 2048"):
        from_zoo("gpt3-175b", seq_len=4096)
    with pytest.raises(AutoparError, match="^seq_len"):
        from_zoo("llama2-7b", seq_len=0)
    e = zoo_entry("llama2-7b")
    e["kv_heads"] = 5
    with pytest.raises(AutoparError, match="^model.kv_heads"):
        normalize_entry(e)
