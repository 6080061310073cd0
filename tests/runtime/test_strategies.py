"""One multi-process test per strategy family: 3 SGD steps equal a single-process run (losses, parameters)."""

from __future__ import annotations

import pytest
import torch

from autopar.plan.compact import make_plan
from tests.runtime.cases import MODELS, same
from tests.runtime.reference import assert_matches_reference, reference_train

pytestmark = pytest.mark.dist


def _check(model: str, pipelines, schedule: str = "1f1b", meta: bool = False) -> None:
    build, _, (x, y), loss_fn = MODELS[model]
    assert_matches_reference(build, make_plan(pipelines, schedule=schedule), x, y, loss_fn=loss_fn, meta=meta)


def _one_stage(model: str, devices: list[int], mbs: int = 4, m: int = 2, **strategy):
    units = MODELS[model][1]
    return [(mbs, m, [(devices, same(units, **strategy))])]


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_ddp_two_ranks(model):
    _check(model, _one_stage(model, [0, 1]))


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_ddp_meta_device_model(model):
    """A model built on the meta device: each rank materialises its units = init_weights on one CPU."""
    _check(model, _one_stage(model, [0, 1]), meta=True)


def test_meta_device_model_with_tp_and_zero3():
    """Meta-built GPT: ranks materialise their units, then shard them (TP on some units, FSDP on others)."""
    build, units, (x, y), _ = MODELS["gpt"]
    strategies = [{"tp": 2}, {"zero": 3}, {"tp": 2, "sp": True}, {"zero": 2}]
    plan = make_plan([(4, 2, [([0, 1], list(zip(units, strategies)))])])
    assert_matches_reference(build, plan, x, y, meta=True)


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_zero(model, zero):
    _check(model, _one_stage(model, [0, 1], zero=zero))


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_tensor_parallel(model):
    _check(model, _one_stage(model, [0, 1], tp=2))


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_tensor_parallel_sequence_parallel(model):
    _check(model, _one_stage(model, [0, 1], tp=2, sp=True))


@pytest.mark.parametrize("model,ckpt", [("gpt", "selective"), ("gpt", "full"), ("gpt", "op"), ("llama", "selective"),
                                        ("llama", "full"), ("llama", "op"), ("mlp", "full"), ("mlp", "op")])
def test_activation_checkpointing(model, ckpt):
    _check(model, _one_stage(model, [0, 1], ckpt=ckpt))


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_op_checkpointing_under_tp_sp_and_zero3(model):
    """Op-level SAC on DTensor TP + SP blocks (its reduce-scatters saved) and on FSDP2 units."""
    units = MODELS[model][1]
    strategies = [{"tp": 2}, {"tp": 2, "sp": True, "ckpt": "op"}, {"tp": 2, "ckpt": "op"}, {"zero": 3, "ckpt": "op"}]
    _check(model, [(4, 2, [([0, 1], list(zip(units, strategies)))])])


def _two_stages(model: str, split: int, mbs: int = 2, m: int = 4):
    units = MODELS[model][1]
    return [(mbs, m, [([0], same(units[:split])), ([1], same(units[split:]))])]


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_pipeline_1f1b(model):
    _check(model, _two_stages(model, 2), schedule="1f1b")


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_pipeline_gpipe(model):
    _check(model, _two_stages(model, 2), schedule="gpipe")


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_pipeline_uneven_split(model):
    """Three stages holding 1, 3 and 1 units (MLP) / 1, 2 and 1 (GPT)."""
    units = MODELS[model][1]
    stages = [([0], same(units[:1])), ([1], same(units[1:-1])), ([2], same(units[-1:]))]
    _check(model, [(2, 4, stages)])


def test_tensor_parallel_head_with_a_custom_loss():
    """A user loss gets gathered logits (no loss_parallel) and still matches."""
    build, units, (x, y), _ = MODELS["gpt"]

    def token_ce(out, tgt):
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))

    plan = make_plan([(4, 2, [([0, 1], same(units, tp=2, sp=True))])])
    assert_matches_reference(build, plan, x, y, loss_fn=token_ce)


def _torchrun_like_rank(rank: int, world: int, port: int, conn) -> None:
    import os

    import torch.distributed as dist

    from autopar.runtime import wrap

    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        build, units, (x, y), loss_fn = MODELS["mlp"]
        torch.manual_seed(0)
        pm = wrap(build(), make_plan([(4, 2, [([0, 1], same(units))])]), loss_fn=loss_fn,
                  optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
        timeout = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()
        conn.send((dist.get_backend(), str(pm.device), timeout, pm.step(x, y)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        conn.send(repr(e))
    finally:
        os._exit(0)


def test_wrap_initialises_the_process_group_from_torchrun_variables():
    import multiprocessing as mp
    import socket

    with socket.socket() as s:  # a free port picked by the OS, then handed to the ranks
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_torchrun_like_rank, args=(r, 2, port, pipes[r][1]), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = [pipes[r][0].recv() if pipes[r][0].poll(30) else "timeout" for r in range(2)]
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    assert got[0] == got[1] and got[0][:3] == ("gloo", "cpu", 600.0), got  # wrap's default timeout: 10 min
    build, _, (x, y), loss_fn = MODELS["mlp"]
    ref, _ = reference_train(build, x, y, 1, 0.1, loss_fn=loss_fn)
    assert abs(got[0][3] - ref[0]) < 1e-6
