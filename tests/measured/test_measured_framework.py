"""A measured file's ``framework`` block: the framework's stated cost parameters on every case's plan."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.estimate import estimate_plan, plan_cost_params
from autopar.measured import load_runs

from .measured_testlib import write

SOURCE = "example/framework optimizer.py @ 0000000"


def _framework(**block):
    def edit(doc):
        doc["framework"] = {"name": "example", "source": SOURCE, **block}
    return edit


def _by_id(rs):
    return {r.case_id: r for r in rs.runs + rs.failed}


def test_without_the_block_nothing_changes(tmp_path):
    run = _by_id(load_runs(write(tmp_path)))["pp2"]
    assert plan_cost_params(run.plan).loss_copies == 0.0


def test_by_precision_adds_gradient_bytes_on_its_cases_only(tmp_path):
    plain = _by_id(load_runs(write(tmp_path, name="plain.yaml")))

    def edit(doc):
        _framework(by_precision={"fp16": {"grad_bytes": 4, "state_bytes": 22}})(doc)
        doc["cases"][1]["precision_mode"] = "bf16"  # tp2-even: not the stated precision

    rs = load_runs(write(tmp_path, edit))
    got = _by_id(rs)
    assert rs.notes[-1] == "framework example: fp16: grad_bytes 4, state_bytes 22"
    assert plan_cost_params(got["pp2"].plan).grad_bytes == 4
    assert plan_cost_params(got["tp2-even"].plan).grad_bytes == 4  # bf16's own row: fp32 gradients
    assert plan_cost_params(got["tp2-even"].plan).state_bytes == 18
    # pp2 runs ZeRO 0 at tp 1: its first stage (embedding and blocks) holds 2 more bytes per parameter.
    run = got["pp2"]
    before = estimate_plan(plain["pp2"].plan, plain["pp2"].model).pipelines[0][0]
    after = estimate_plan(run.plan, run.model).pipelines[0][0]
    params = sum(ly.params for ly in run.model.layers if ly.name in after.layers)
    assert after.memory_bytes - before.memory_bytes == pytest.approx(2 * params, rel=1e-9)


def test_fp8_linear_inputs_shrink_every_stage_s_activations_only(tmp_path):
    """A framework stating Transformer Engine's FP8 linear inputs: the stages keep fewer activation bytes,
    the model states are untouched, and a run at another precision keeps the default share."""
    plain = _by_id(load_runs(write(tmp_path, name="plain.yaml")))
    rs = load_runs(write(tmp_path, _framework(by_precision={"fp16": {"linear_input_share": 0.5}})))
    got = _by_id(rs)
    assert plan_cost_params(got["tp2-even"].plan).linear_input_share == 0.5
    for case in ("tp2-even", "pp2"):  # no recomputation; full recomputation (its transient keeps the interior)
        run, ref = got[case], plain[case]
        stage, stage_plain = estimate_plan(run.plan, run.model).pipelines[0][0], estimate_plan(ref.plan, ref.model).pipelines[0][0]
        assert stage.memory_bytes < stage_plain.memory_bytes
    blocks = [ly for ly in run.model.layers if ly.kind == "block"]
    assert blocks and all(ly.lin_in_seq_bytes > 0 and ly.lin_in_tp_bytes > 0 for ly in blocks)


def test_megatron_cross_entropy_holds_less_at_the_head(tmp_path):
    plain = _by_id(load_runs(write(tmp_path, name="plain.yaml")))["pp2"]
    run = _by_id(load_runs(write(tmp_path, _framework(cost_params={"loss_copies": 1.5}))))["pp2"]
    last = estimate_plan(run.plan, run.model).pipelines[0][-1]
    last_plain = estimate_plan(plain.plan, plain.model).pipelines[0][-1]
    assert plan_cost_params(run.plan).loss_copies == 1.5
    assert last.memory_bytes < last_plain.memory_bytes
    first = estimate_plan(run.plan, run.model).pipelines[0][0]
    assert first.memory_bytes == estimate_plan(plain.plan, plain.model).pipelines[0][0].memory_bytes


@pytest.mark.parametrize("block, start", [
    ({"cost_params": {"loss_copies": 1.5}, "source": None}, "tiny.yaml:framework.source: is missing"),
    ({"cost_params": {"loss_copy": 1.5}}, "tiny.yaml:framework.cost_params.loss_copy: is not a cost_params field"),
    ({"cost_params": {"loss_copies": -1}}, "tiny.yaml:framework.cost_params.loss_copies: must be >= 0"),
    ({"by_precision": {"fp12": {"grad_bytes": 6}}}, "tiny.yaml:framework.by_precision.fp12: is not a known field"),
    ({"cost_params": {}}, "tiny.yaml:framework.cost_params: states no cost parameter"),
    ({"by_precision": {"fp16": {"grad_bytes": 19}}}, "tiny.yaml:framework: state_bytes 20 is below param_bytes 2 + "
                                                     "grad_bytes 19"),
])
def test_bad_block_is_one_line_naming_the_field(tmp_path, block, start):
    def edit(doc):
        _framework(**block)(doc)
        if block.get("source", SOURCE) is None:
            del doc["framework"]["source"]

    with pytest.raises(AutoparError) as info:
        load_runs(write(tmp_path, edit))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(start), msg


def test_by_flag_applies_to_the_cases_with_the_flag(tmp_path):
    def edit(doc):
        _framework(cost_params={"loss_copies": 3}, by_flag={"compile": {"loss_copies": 1}})(doc)
        doc["cases"][0]["compile"] = True  # pp2 compiled, tp2-even not

    rs = load_runs(write(tmp_path, edit))
    got = _by_id(rs)
    assert plan_cost_params(got["pp2"].plan).loss_copies == 1
    assert plan_cost_params(got["tp2-even"].plan).loss_copies == 3
    assert rs.notes[-1] == "framework example: loss_copies 3.0; compile: loss_copies 1.0"


def test_compile_is_noted_unmodelled_until_the_framework_states_it(tmp_path):
    def flagged(doc):
        doc["cases"][0]["compile"] = True

    def stated(doc):
        flagged(doc)
        _framework(cost_params={"act_traffic": 11.4}, by_flag={"compile": {"act_traffic": 3.0}})(doc)

    plain = _by_id(load_runs(write(tmp_path, flagged, name="flagged.yaml")))["pp2"]
    got = _by_id(load_runs(write(tmp_path, stated)))
    assert "case pp2.compile: not modelled" in " ".join(plain.notes)
    assert not any("not modelled" in n for n in got["pp2"].notes)
    assert plan_cost_params(got["pp2"].plan).act_traffic == 3.0
    assert plan_cost_params(got["tp2-even"].plan).act_traffic == 11.4  # eager: more traffic, a slower step
    eager = estimate_plan(got["tp2-even"].plan, got["tp2-even"].model).step_time_s
    other = _by_id(load_runs(write(tmp_path, name="plain.yaml")))["tp2-even"]
    assert eager > estimate_plan(other.plan, other.model).step_time_s


def test_a_case_states_its_own_params_over_the_framework_s(tmp_path):
    def edit(doc):
        _framework(cost_params={"act_traffic": 11.4, "loss_copies": 1.5})(doc)
        doc["cases"][1]["cost_params"] = {"act_traffic": 14.25}  # tp2-even

    got = _by_id(load_runs(write(tmp_path, edit)))
    assert plan_cost_params(got["tp2-even"].plan).act_traffic == 14.25
    assert plan_cost_params(got["tp2-even"].plan).loss_copies == 1.5
    assert plan_cost_params(got["pp2"].plan).act_traffic == 11.4


@pytest.mark.parametrize("params, start", [
    ({"act_trafic": 3}, "tiny.yaml:case tp2-even.cost_params.act_trafic: is not a cost_params field"),
    ({"act_traffic": -1}, "tiny.yaml:case tp2-even.cost_params.act_traffic: must be >= 0"),
    ({}, "tiny.yaml:case tp2-even.cost_params: states no cost parameter"),
])
def test_bad_case_params_are_one_line_naming_the_field(tmp_path, params, start):
    def edit(doc):
        doc["cases"][1]["cost_params"] = params

    with pytest.raises(AutoparError) as info:
        load_runs(write(tmp_path, edit))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(start), str(info.value)


def test_unknown_flag_is_refused(tmp_path):
    with pytest.raises(AutoparError) as info:
        load_runs(write(tmp_path, _framework(by_flag={"float8": {"loss_copies": 1}})))
    assert str(info.value).startswith("tiny.yaml:framework.by_flag.float8: is not a known field")


def _untied(model):
    """``model`` with its head holding no copy of the embedding it uses."""
    from dataclasses import replace

    return replace(model, layers=[replace(ly, tied_params=0, shared_params=0) for ly in model.layers])


def test_published_runs_tie_embeddings_as_megatron_and_deepspeed_do(tmp_path):
    """GPT-2 ties its embeddings. The published frameworks keep one tensor on one stage and a copy on the last
    stage of a pipeline (measured.framework.PUBLISHED_TIES); a file's framework block may say otherwise."""
    got = _by_id(load_runs(write(tmp_path)))
    for case in ("pp2", "tp2-even"):
        params = plan_cost_params(got[case].plan)
        assert (params.tied_copy_one_stage, params.tied_sync_full) == (0.0, 0.0)
    pp2, one = got["pp2"], got["tp2-even"]
    head = pp2.model.layers[-1]
    assert head.tied_params == pp2.model.vocab * pp2.model.hidden > 0
    last, last_untied = (estimate_plan(pp2.plan, m).pipelines[0][-1] for m in (pp2.model, _untied(pp2.model)))
    state = plan_cost_params(pp2.plan).state_bytes  # fp16, ZeRO 0, TP 1: the whole copy with its states
    assert last.memory_bytes - last_untied.memory_bytes == pytest.approx(head.tied_params * state, rel=1e-9)
    first, first_untied = (estimate_plan(pp2.plan, m).pipelines[0][0] for m in (pp2.model, _untied(pp2.model)))
    assert first.step_s > first_untied.step_s  # the embedding's gradient all-reduced with the last stage's copy
    assert estimate_plan(one.plan, one.model).step_time_s == estimate_plan(one.plan, _untied(one.model)).step_time_s
    own = _by_id(load_runs(write(tmp_path, _framework(cost_params={"tied_copy_one_stage": 1}), name="own.yaml")))
    copy, none = (estimate_plan(own["tp2-even"].plan, m).pipelines[0][0] for m in (own["tp2-even"].model,
                                                                                  _untied(own["tp2-even"].model)))
    assert copy.memory_bytes > none.memory_bytes
