"""A measured file's attention implementation: its hf_config's ``attn_implementation``, else eager when the
file's own text says the runs had no flash attention (a file that cannot be edited), else flash/SDPA."""

from __future__ import annotations

from autopar.measured import load_runs

from .measured_testlib import write


def _block(rs):
    return rs.runs[0].model.layers[1]


def test_the_config_field_decides(tmp_path):
    eager = load_runs(write(tmp_path, lambda d: d["model"]["hf_config"].update(attn_implementation="eager")))
    flash = load_runs(write(tmp_path, lambda d: None, name="flash.yaml"))
    assert _block(eager).act_attn_bytes > 10 * _block(flash).act_attn_bytes
    assert not any("attention" in n for r in flash.runs for n in r.notes)


def test_no_flash_attention_in_the_text_reads_as_eager_with_a_note(tmp_path):
    def edit(doc):
        doc["model"]["precision"] = "fp16 mixed precision, no flash attention (Megatron-LM v1.1.5)"

    rs = load_runs(write(tmp_path, edit))
    eager = load_runs(write(tmp_path, lambda d: d["model"]["hf_config"].update(attn_implementation="eager"),
                            name="eager.yaml"))
    assert _block(rs).act_attn_bytes == _block(eager).act_attn_bytes
    assert any("attention read as eager" in n for n in rs.runs[0].notes)


def test_the_config_field_wins_over_the_text(tmp_path):
    def edit(doc):
        doc["model"]["precision"] = "no flash attention"
        doc["model"]["hf_config"]["attn_implementation"] = "sdpa"

    rs = load_runs(write(tmp_path, edit))
    flash = load_runs(write(tmp_path, lambda d: None, name="flash.yaml"))
    assert _block(rs).act_attn_bytes == _block(flash).act_attn_bytes


def test_published_peak_memory_is_read_in_gib(tmp_path):
    import pytest

    from autopar.errors import AutoparError

    def edit(doc):
        doc["cases"][0]["published"] = {"memory_gib": 82.4}
        doc["cases"][1]["published"] = {"mem": "59GB"}
        doc["cases"][2]["published"] = {"mem": "OOM"}

    rs = load_runs(write(tmp_path, edit))
    got = {r.case_id: r.measured_memory_gib for r in rs.runs + rs.failed}
    assert got == {"pp2": 82.4, "tp2-even": 59.0, "oom": None}
    with pytest.raises(AutoparError, match="published.mem.*is not a size"):
        load_runs(write(tmp_path, lambda d: d["cases"][0].update(published={"mem": "lotsGB"}), name="bad.yaml"))
