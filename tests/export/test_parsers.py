"""Every export read back by its tool's own parser (the ``test`` extra installs them; without them these skip).

The plans: the README example (llama2-7b, 2x8xA100-80G), two heterogeneous FlashFlex mixes, a small
gpt3-1.3b plan, and uniform ones (pipelined, uneven split). Each test checks that the tool accepts the
file and that what it parsed is the exported plan (degrees, sharding, checkpointing, batch).

What runs here (CPU): torchtitan's ConfigManager + its Trainer.Config checks + ParallelDims; megatron-core's
TransformerConfig (ModelParallelConfig), DistributedDataParallelConfig and micro-batch calculator; DeepSpeed's
DeepSpeedConfig; accelerate's config loader, ``accelerate launch``'s environment and FullyShardedDataParallelPlugin.
What needs more: DeepSpeed takes the data-parallel world size from a process group and ``mpu`` (here a
1-process gloo group and the plan's data-parallel size, see DS_CHILD); ``accelerate launch`` turns on ``sync_module_states``
by default, whose parameter-init function the FSDP plugin builds on a GPU device (here it is turned off); Megatron-LM's own argparse is not in the megatron-core wheel.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from autopar.export import prepare, render

PLANS = ["readme", "hetero", "hetero-13b", "small", "exact-pp2", "uneven-pp2", "gpipe-pp2", "exact-dp"]


def _export(plans, name, target):
    return prepare(plans[name], target)


def script_args(script: str) -> list[str]:
    """The ``ARGS=( ... )`` bash array of an exported launch script, as the argument list bash passes on."""
    return shlex.split(script.split("\nARGS=(\n", 1)[1].split("\n)\n", 1)[0])


# -- torchtitan ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PLANS)
def test_torchtitan_config_manager_parses_the_export(plans, name):
    pytest.importorskip("triton", reason="torchtitan 0.3's trainer imports triton kernels (test extra)")
    manager = pytest.importorskip("torchtitan.config.manager")
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.parallel_dims import ParallelDims

    ex = _export(plans, name, "torchtitan")
    # The overrides do not touch the model: any registry entry stands in for TT_MODULE/TT_CONFIG.
    cfg = manager.ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_8b", *script_args(render(ex))])
    par, tr, s = cfg.parallelism, cfg.training, ex.shape
    dims = ParallelDims.from_config(par, ex.world)  # torchtitan's own check: the degrees multiply to the world
    assert (dims.pp, dims.tp, dims.dp_replicate * dims.dp_shard) == (s.pp, s.tp, ex.dp * s.replicas)
    assert dims.fsdp_enabled == (s.zero in (2, 3))
    if s.zero in (2, 3):
        assert par.fsdp_reshard_after_forward == ("always" if s.zero == 3 else "never")
    assert par.enable_sequence_parallel == s.sp or s.tp == 1
    ac = cfg.activation_checkpoint
    assert {"none": ac is None, "op": isinstance(ac, SelectiveAC.Config), "full": isinstance(ac, FullAC.Config)}[s.ckpt]
    assert tr.global_batch_size == ex.plan.global_batch_size and tr.seq_len == ex.model.seq_len
    ranks = dims.dp_replicate * dims.dp_shard
    if s.pp > 1:  # one step of local_batch_size samples in pipeline micro-batches
        assert tr.local_batch_size * ranks == tr.global_batch_size
        assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == s.num_microbatches
        assert len(par.module_fqns_per_model_part) == s.pp
        assert par.pipeline_parallel_schedule == {"1f1b": "1F1B", "gpipe": "GPipe"}[s.schedule]
    else:  # gradient accumulation over micro-batches of local_batch_size
        assert tr.global_batch_size // (tr.local_batch_size * ranks) == s.num_microbatches
    assert tr.mixed_precision_param == "bfloat16"


# -- Megatron ------------------------------------------------------------------------------------------
def _megatron_args(argv: list[str]) -> dict:
    """Megatron-LM's argparse convention (``--a-b v`` -> ``a_b``, a bare flag -> True), values typed as ints
    where they are numbers; Megatron-LM copies the ones named like TransformerConfig fields into it."""
    out, i = {}, 0
    while i < len(argv):
        key = argv[i][2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            v = argv[i + 1]
            out[key], i = int(v) if v.isdigit() else v, i + 2
        else:
            out[key], i = True, i + 1
    return out


@pytest.mark.parametrize("name", PLANS)
def test_megatron_core_dataclasses_take_the_export(plans, name):
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer import TransformerConfig

    ex = _export(plans, name, "megatron")
    a = _megatron_args(script_args(render(ex)))
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: v for k, v in a.items() if k in fields}
    dtype = torch.bfloat16 if a.get("bf16") else torch.float16 if a.get("fp16") else torch.float32
    kw.update(params_dtype=dtype, pipeline_dtype=dtype)  # what Megatron-LM derives from --bf16/--fp16
    cfg = TransformerConfig(**kw)
    s = ex.shape
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.sequence_parallel) == (s.tp, s.pp, s.sp)
    assert cfg.recompute_granularity == {"none": None, "selective": "selective", "full": "full"}[s.ckpt]
    if s.pp > 1:
        layout = cfg.pipeline_model_parallel_layout
        per_stage = [sum(1 for t in layout.layout[p][0] if str(t).endswith("decoder")) for p in range(s.pp)]
        blocks = [sum(1 for i in st if ex.model.layers[i].kind == "block") for st in s.split]
        assert per_stage == blocks
    ddp = DistributedDataParallelConfig(**{k: a[k] for k in ("use_distributed_optimizer", "use_megatron_fsdp",
                                                              "data_parallel_sharding_strategy") if k in a})
    assert ddp.use_distributed_optimizer == (s.zero == 1)
    assert ddp.data_parallel_sharding_strategy == {0: "no_shard", 1: "no_shard", 2: "optim_grads",
                                                   3: "optim_grads_params"}[s.zero]
    calc = ConstantNumMicroBatchesCalculator(a["global_batch_size"], a["micro_batch_size"], ex.world // (s.tp * s.pp),
                                             False, 0)
    assert calc.get() == s.num_microbatches


# -- DeepSpeed -----------------------------------------------------------------------------------------
# DeepSpeedConfig takes the data-parallel world size from DeepSpeed's process group and the model-parallel
# unit (``mpu``, Megatron's interface); without a group it counts 1 and the batch check cannot hold. The
# child process opens a real 1-process gloo group (its CPU shared-memory all-reduce op, which DeepSpeed would
# compile with g++ for minutes and config parsing never calls, is marked unavailable) and gives the plan's
# data-parallel size through ``mpu``. A child, so no process group outlives it in the test process.
DS_CHILD = """
import json, os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed.ops, deepspeed.comm
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
from deepspeed.runtime.config import DeepSpeedConfig

class DataParallel:  # mpu: the one method DeepSpeedConfig asks
    def __init__(self, size):
        self.size = size
    def get_data_parallel_world_size(self):
        return self.size

out = {}
from deepspeed.runtime.utils import partition_balanced  # PipelineModule's "type:" partition

for path, (dp, blocks) in json.loads(sys.argv[2]).items():
    try:
        c = DeepSpeedConfig(path, mpu=DataParallel(dp))
        parts = [int(x) for x in partition_balanced(blocks, c.pipeline["stages"])] if c.pipeline["stages"] != "auto" \
            else None
        out[path] = {"train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
                     "gas": c.gradient_accumulation_steps, "zero": int(c.zero_optimization_stage),
                     "pipeline": c.pipeline, "autotp": c.tensor_parallel_config.autotp_size,
                     "bf16": c.bfloat16_config.enabled, "world": c.world_size, "parts": parts}
    except AssertionError as e:
        out[path] = {"refused": str(e)}
print("RESULT" + json.dumps(out))
"""


def test_deepspeed_config_takes_every_export(plans, tmp_path):
    pytest.importorskip("deepspeed")
    import socket
    import subprocess
    import sys

    files, exports = {}, {}
    for name in PLANS + ["wrong-batch"]:
        ex = prepare(plans["readme" if name == "wrong-batch" else name], "deepspeed")
        doc = json.loads(render(ex))
        assert doc["autopar_export"][:len(ex.header_lines())] == ex.header_lines()
        if name == "wrong-batch":  # the check this test relies on must fail on a batch that does not add up
            doc["train_batch_size"] += 1
        path = str(tmp_path / f"{name}.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        files[path] = [ex.world // (ex.shape.tp * ex.shape.pp), [int(ly.kind == "block") for ly in ex.model.layers]]
        exports[path] = (name, ex)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([sys.executable, "-c", DS_CHILD, str(port), json.dumps(files)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.split("RESULT", 1)[1])
    for path, (name, ex) in exports.items():
        r, s, dp = got[path], ex.shape, files[path][0]
        if name == "wrong-batch":
            assert "Check batch related parameters" in r["refused"]
            continue
        assert "refused" not in r, (name, r)
        assert r["world"] == dp and (r["train_batch_size"], r["gas"]) == (ex.plan.global_batch_size, s.num_microbatches)
        assert r["micro"] * s.num_microbatches * dp == ex.plan.global_batch_size
        assert r["zero"] == s.zero and r["bf16"] is True
        assert r["pipeline"]["stages"] == (s.pp if s.pp > 1 else "auto")
        if s.pp > 1:
            assert s.zero < 2  # DeepSpeed's PipelineEngine refuses ZeRO-2/3
            assert r["pipeline"]["activation_checkpoint_interval"] == (1 if s.ckpt == "full" else 0)
            assert r["parts"] == [st[0] for st in s.split] + [ex.model.num_layers]  # DeepSpeed's split = the plan's
        assert r["autotp"] == (s.tp if s.tp > 1 else 0)


# -- accelerate ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [p for p in PLANS if not p.startswith("hetero")])  # refused (test_closest.py)
def test_accelerate_launch_and_fsdp_plugin_take_the_export(plans, name, tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    import torch
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import ShardingStrategy

    ex = _export(plans, name, "accelerate")
    path = tmp_path / "accelerate.yaml"
    path.write_text(render(ex))
    cc = load_config_from_file(str(path))
    assert cc.num_processes == ex.world and str(cc.distributed_type) in ("FSDP", "DistributedType.FSDP")
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "t.py"]))
    env = prepare_multi_gpu_env(args)  # what `accelerate launch` hands the training processes
    assert env["FSDP_SHARDING_STRATEGY"] == cc.fsdp_config["fsdp_sharding_strategy"]
    if not torch.cuda.is_available():  # launch's default sync_module_states builds its init function on a GPU
        env.update(FSDP_SYNC_MODULE_STATES="false", FSDP_CPU_RAM_EFFICIENT_LOADING="false")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugin = FullyShardedDataParallelPlugin()
    want = {3: ShardingStrategy.FULL_SHARD, 2: ShardingStrategy.SHARD_GRAD_OP, 0: ShardingStrategy.NO_SHARD}
    assert plugin.sharding_strategy == want[ex.shape.zero]
    assert plugin.activation_checkpointing == (ex.shape.ckpt == "full")
    assert ex.shape.pp == 1 and ex.shape.tp == 1
