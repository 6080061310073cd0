"""Exports of an expert-parallel plan: Megatron-LM's MoE arguments, torchtitan's expert_parallel_degree (which
runs with FSDP only, so the closest plan changes ZeRO and says so), and tools without expert parallelism."""

from __future__ import annotations

from autopar.cli import main
from autopar.cluster.parse import load_cluster
from autopar.modelspec import from_zoo
from autopar.plan.io import save_plan
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy


def mixtral_plan(tmp_path, ep: int = 8):
    """Mixtral 8x7B on one stage of 32 H100, every block with expert parallel ``ep``, written to a file."""
    m = from_zoo("mixtral-8x7b")
    layers = [StageLayer(ly.name, Strategy(zero=1, ckpt="full" if ly.moe else "none", ep=ep if ly.moe else 1))
              for ly in m.layers]
    plan = Plan(ModelRef(m.name, m.seq_len, m.num_layers, m.source), load_cluster("4x8xH100"), 128,
                [Pipeline(128, 32, 4, [Stage(list(range(32)), layers)])])
    return save_plan(plan, tmp_path / f"mixtral-ep{ep}.yaml")


def export(argv, capsys):
    rc = main(["export", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _args(script: str) -> list[str]:
    body = script.split("ARGS=(", 1)[1].split(")", 1)[0]
    return " ".join(body.split()).split(" ")


def test_megatron_gets_experts_topk_and_expert_parallel_size_exactly(tmp_path, capsys):
    rc, out, err = export([str(mixtral_plan(tmp_path, ep=8)), "--to", "megatron", "--exact"], capsys)
    assert rc == 0, err
    args = _args(out)
    pairs = dict(zip(args, args[1:]))
    assert pairs["--num-experts"] == "8" and pairs["--moe-router-topk"] == "2"
    assert pairs["--moe-ffn-hidden-size"] == "14336" and pairs["--expert-model-parallel-size"] == "8"
    assert pairs["--moe-token-dispatcher-type"] == "alltoall"
    assert "--moe-expert-capacity-factor" not in args  # dropless, as autopar plans it
    assert "--moe-layer-freq" not in args  # every block is MoE


def test_megatron_without_ep_names_no_expert_parallel_size(tmp_path, capsys):
    path = mixtral_plan(tmp_path, ep=2)
    text = path.read_text().replace("ep: 2\n", "").replace(", ep: 2", "")
    plain = tmp_path / "plain.yaml"
    plain.write_text(text)
    rc, out, _ = export([str(plain), "--to", "megatron"], capsys)
    assert rc == 0
    args = _args(out)
    assert "--num-experts" in args and "--expert-model-parallel-size" not in args


def test_torchtitan_runs_ep_with_fsdp_and_lists_the_zero_change(tmp_path, capsys):
    rc, out, err = export([str(mixtral_plan(tmp_path, ep=8)), "--to", "torchtitan"], capsys)
    assert rc == 0
    args = _args(out)
    pairs = dict(zip(args, args[1:]))
    assert pairs["--parallelism.expert_parallel_degree"] == "8"
    assert pairs["--parallelism.data_parallel_shard_degree"] == "32"
    assert "zero: 1 x34 -> 3 x34" in out and "ep:" not in err.split("changes", 1)[1].split("predicted")[0]


def test_tools_without_expert_parallelism_refuse_exact_naming_ep(tmp_path, capsys):
    rc, _, err = export([str(mixtral_plan(tmp_path, ep=8)), "--to", "deepspeed", "--exact"], capsys)
    assert rc == 2
    line = err.strip().splitlines()
    assert len(line) == 1 and "ep" in line[0].split("would change")[0].split("(")[-1]
