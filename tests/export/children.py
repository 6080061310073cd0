"""The tools' parsers run in child processes: what torchtitan, megatron-core, DeepSpeed and accelerate import
(native thread pools, a process group, environment variables) stays out of the test process, whose later
tests fork workers. Each child reads a JSON list of exports, parses every one with the tool's own code and
prints ``RESULT`` + one JSON object: per export the facts it parsed, or ``{"error": ...}``."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TORCHTITAN = r"""
import json, sys
from torchtitan.config import ConfigManager
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.distributed.parallel_dims import ParallelDims

out = {}
for item in json.load(open(sys.argv[1])):
    try:
        # The overrides do not touch the model: any registry entry stands in for TT_MODULE/TT_CONFIG.
        cfg = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_8b", *item["args"]])
        par, tr = cfg.parallelism, cfg.training
        dims = ParallelDims.from_config(par, item["world"])  # the degrees must multiply to the world size
        ac = cfg.activation_checkpoint
        out[item["name"]] = {
            "pp": dims.pp, "tp": dims.tp, "dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard,
            "fsdp": dims.fsdp_enabled, "reshard": par.fsdp_reshard_after_forward, "sp": par.enable_sequence_parallel,
            "ac": "none" if ac is None else "op" if isinstance(ac, SelectiveAC.Config) else
                  "full" if isinstance(ac, FullAC.Config) else type(ac).__name__,
            "global": tr.global_batch_size, "local": tr.local_batch_size, "seq": tr.seq_len,
            "pp_mb": par.pipeline_parallel_microbatch_size, "parts": par.module_fqns_per_model_part,
            "schedule": par.pipeline_parallel_schedule, "dtype": tr.mixed_precision_param,
            "no_cuda_graphs": tr.disable_cuda_graphs}
    except BaseException as e:
        out[item["name"]] = {"error": repr(e)[:2000]}
print("RESULT" + json.dumps(out))
"""

MEGATRON = r"""
import dataclasses, json, sys
import torch
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_config import MLATransformerConfig

def megatron_args(argv):
    # Megatron-LM's argparse convention: --a-b v -> a_b (ints where numbers), a bare flag -> True
    out, i = {}, 0
    while i < len(argv):
        key = argv[i][2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            v = argv[i + 1]
            out[key], i = int(v) if v.isdigit() else v, i + 2
        else:
            out[key], i = True, i + 1
    return out

out = {}
for item in json.load(open(sys.argv[1])):
    try:
        a = megatron_args(item["args"])
        cls = MLATransformerConfig if a.get("multi_latent_attention") else TransformerConfig  # as Megatron-LM picks
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in a.items() if k in fields}  # what Megatron-LM copies into TransformerConfig
        dtype = torch.bfloat16 if a.get("bf16") else torch.float16 if a.get("fp16") else torch.float32
        kw.update(params_dtype=dtype, pipeline_dtype=dtype)  # what Megatron-LM derives from --bf16/--fp16
        if "num_experts" in a:  # renamed as Megatron-LM does (megatron/training/argument_utils.py @ d98e8a64 l.308)
            kw["num_moe_experts"] = a["num_experts"]
        if a.get("swiglu"):  # Megatron-LM's --swiglu: a gated linear unit of SiLU
            kw.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
        if a.get("disable_bias_linear"):
            kw.update(add_bias_linear=False)
        for k in ("attention_dropout", "hidden_dropout"):
            if k in kw:
                kw[k] = float(kw[k])
        cfg = cls(**kw)
        layout = cfg.pipeline_model_parallel_layout
        blocks = None if layout is None else [
            sum(1 for t in layout.layout[p][0] if str(t).endswith("decoder")) for p in range(cfg.pipeline_model_parallel_size)]
        ddp = DistributedDataParallelConfig(**{k: a[k] for k in ("use_distributed_optimizer", "use_megatron_fsdp",
                                                                  "data_parallel_sharding_strategy", "overlap_grad_reduce",
                                                                  "overlap_param_gather") if k in a})
        dp = item["world"] // (cfg.tensor_model_parallel_size * cfg.pipeline_model_parallel_size)
        calc = ConstantNumMicroBatchesCalculator(a["global_batch_size"], a["micro_batch_size"], dp, False, 0)
        out[item["name"]] = {
            "tp": cfg.tensor_model_parallel_size, "pp": cfg.pipeline_model_parallel_size, "sp": cfg.sequence_parallel,
            "recompute": cfg.recompute_granularity, "blocks_per_stage": blocks,
            "distributed_optimizer": ddp.use_distributed_optimizer, "sharding": ddp.data_parallel_sharding_strategy,
            "overlap": [ddp.overlap_grad_reduce, ddp.overlap_param_gather],
            "microbatches": calc.get(), "bf16": cfg.bf16,
            "arch": {"normalization": cfg.normalization, "glu": cfg.gated_linear_unit, "bias": cfg.add_bias_linear,
                     "qkv_bias": cfg.add_qkv_bias, "kv_channels": cfg.kv_channels, "qk_layernorm": cfg.qk_layernorm,
                     "dropout": [cfg.attention_dropout, cfg.hidden_dropout],
                     "mla": [getattr(cfg, k, None) for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim",
                                                             "qk_pos_emb_head_dim", "v_head_dim")]}}
    except BaseException as e:
        out[item["name"]] = {"error": repr(e)[:2000]}
print("RESULT" + json.dumps(out))
"""

# DeepSpeedConfig takes the data-parallel world size from DeepSpeed's process group and the model-parallel
# unit (``mpu``, Megatron's interface); without a group it counts 1 and the batch check cannot hold. The
# child opens a real 1-process gloo group (its CPU shared-memory all-reduce op, which DeepSpeed would compile
# with g++ for minutes and config parsing never calls, is marked unavailable) and gives the plan's
# data-parallel size through ``mpu``.
DEEPSPEED = r"""
import json, os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed.ops, deepspeed.comm
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.utils import partition_balanced  # PipelineModule's "type:" partition

class DataParallel:  # mpu: the one method DeepSpeedConfig asks
    def __init__(self, size):
        self.size = size
    def get_data_parallel_world_size(self):
        return self.size

out = {}
for item in json.load(open(sys.argv[1])):
    try:
        c = DeepSpeedConfig(item["path"], mpu=DataParallel(item["dp"]))
        stages = c.pipeline["stages"]
        out[item["name"]] = {
            "train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
            "gas": c.gradient_accumulation_steps, "zero": int(c.zero_optimization_stage), "pipeline": c.pipeline,
            "autotp": c.tensor_parallel_config.autotp_size, "bf16": c.bfloat16_config.enabled, "world": c.world_size,
            "parts": None if stages == "auto" else [int(x) for x in partition_balanced(item["blocks"], stages)]}
    except AssertionError as e:
        out[item["name"]] = {"refused": str(e)}
    except BaseException as e:
        out[item["name"]] = {"error": repr(e)[:2000]}
print("RESULT" + json.dumps(out))
"""

ACCELERATE = r"""
import json, os, sys
import torch
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_multi_gpu_env

out, base = {}, dict(os.environ)
for item in json.load(open(sys.argv[1])):
    try:
        cc = load_config_from_file(item["path"])
        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", item["path"], "t.py"]))
        env = prepare_multi_gpu_env(args)  # what `accelerate launch` hands the training processes
        if not torch.cuda.is_available():  # launch's default sync_module_states builds its init function on a GPU
            env.update(FSDP_SYNC_MODULE_STATES="false", FSDP_CPU_RAM_EFFICIENT_LOADING="false")
        os.environ.clear()
        os.environ.update({**base, **env})
        plugin = FullyShardedDataParallelPlugin()
        out[item["name"]] = {"num_processes": cc.num_processes, "distributed_type": str(cc.distributed_type),
                             "env_sharding": env["FSDP_SHARDING_STRATEGY"], "sharding": plugin.sharding_strategy.name,
                             "env_reshard": env["FSDP_RESHARD_AFTER_FORWARD"],
                             "ac": plugin.activation_checkpointing, "mixed_precision": env["ACCELERATE_MIXED_PRECISION"]}
    except BaseException as e:
        out[item["name"]] = {"error": repr(e)[:2000]}
print("RESULT" + json.dumps(out))
"""


def missing(*modules: str) -> str:
    """The first of ``modules`` not installed (found, not imported: the child imports them), else ''."""
    for m in modules:
        try:
            if importlib.util.find_spec(m) is None:
                return m
        except ModuleNotFoundError:  # its parent package is missing
            return m
    return ""


def needs(*modules: str):
    """Skip a test (before its fixtures run) unless ``modules`` are installed."""
    gone = missing(*modules)
    return pytest.mark.skipif(bool(gone), reason=f"{gone} is not installed (pip install -e '.[test]')")


def run_child(script: str, items: list[dict], tmp: Path) -> dict:
    """Run a child ``script`` on ``items``; its per-export results (a failed child fails the test)."""
    payload = tmp / "items.json"
    payload.write_text(json.dumps(items))
    with socket.socket() as s:  # a free port, for DeepSpeed's 1-process group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([sys.executable, "-c", script, str(payload), str(port)], capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0 and "RESULT" in run.stdout, run.stderr[-4000:]
    return json.loads(run.stdout.split("RESULT", 1)[1])
