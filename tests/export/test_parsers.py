"""Every export read back by its tool's own parser (the ``test`` extra installs them; without them these skip).

The plans: the README example (llama2-7b, 2x8xA100-80G), two heterogeneous FlashFlex mixes, a small
gpt3-1.3b plan, and uniform ones (pipelined, uneven split, GPipe). Each test checks that the tool accepts
every file and that what it parsed is the exported plan (degrees, sharding, checkpointing, batch). The
parsers run in child processes (``children.py``).

What runs here (CPU): torchtitan's ConfigManager + its Trainer.Config checks + ParallelDims; megatron-core's
TransformerConfig (ModelParallelConfig), DistributedDataParallelConfig and micro-batch calculator; DeepSpeed's
DeepSpeedConfig and PipelineModule's partition; accelerate's config loader, ``accelerate launch``'s environment
and FullyShardedDataParallelPlugin.
What needs more: DeepSpeed takes the data-parallel world size from a process group and ``mpu`` (here a
1-process gloo group and the plan's data-parallel size, see ``children.DEEPSPEED``); ``accelerate launch``
turns on ``sync_module_states`` by default, whose parameter-init function the FSDP plugin builds on a GPU
device (here it is turned off); Megatron-LM's own argparse is not in the megatron-core wheel (its naming
convention maps the arguments onto the dataclasses, as Megatron-LM does).
"""

from __future__ import annotations

import json
import shlex

from autopar.export import prepare, render
from tests.export.children import ACCELERATE, DEEPSPEED, MEGATRON, TORCHTITAN, needs, run_child

PLANS = ["readme", "hetero", "hetero-13b", "small", "exact-pp2", "uneven-pp2", "gpipe-pp2", "exact-dp", "no-reshard",
         "overlap-pp2", "zero2-dp"]


def script_args(script: str) -> list[str]:
    """The ``ARGS=( ... )`` bash array of an exported launch script, as the argument list bash passes on."""
    return shlex.split(script.split("\nARGS=(\n", 1)[1].split("\n)\n", 1)[0])


def _clean(results: dict) -> dict:
    bad = {k: v["error"] for k, v in results.items() if "error" in v}
    assert not bad, bad
    return results


@needs("torchtitan", "triton")  # torchtitan 0.3's trainer imports triton kernels (in the test extra)
def test_torchtitan_config_manager_parses_every_export(plans, tmp_path):
    exports = {name: prepare(plans[name], "torchtitan") for name in PLANS}
    items = [{"name": n, "args": script_args(render(ex)), "world": ex.world} for n, ex in exports.items()]
    got = _clean(run_child(TORCHTITAN, items, tmp_path))
    for name, ex in exports.items():
        r, s = got[name], ex.shape
        assert (r["pp"], r["tp"], r["dp_replicate"] * r["dp_shard"]) == (s.pp, s.tp, ex.dp * s.replicas), name
        assert r["fsdp"] == (s.zero == 3), name
        if s.zero == 3:
            assert r["reshard"] == ("always" if s.reshard else "never"), name
        assert r["sp"] == s.sp or s.tp == 1, name
        assert r["ac"] == s.ckpt and r["dtype"] == "bfloat16", name
        assert (r["global"], r["seq"]) == (ex.plan.global_batch_size, ex.model.seq_len), name
        ranks = r["dp_replicate"] * r["dp_shard"]
        if s.pp > 1:  # one step of local_batch_size samples in pipeline micro-batches
            assert r["local"] * ranks == r["global"] and r["local"] // r["pp_mb"] == s.num_microbatches, name
            assert len(r["parts"]) == s.pp and r["no_cuda_graphs"], name
            assert r["schedule"] == {"1f1b": "1F1B", "gpipe": "GPipe"}[s.schedule], name
        else:  # gradient accumulation over micro-batches of local_batch_size
            assert r["global"] // (r["local"] * ranks) == s.num_microbatches, name


@needs("megatron.core")
def test_megatron_core_dataclasses_take_every_export(plans, tmp_path):
    from autopar.export.megatron import args

    exports = {name: prepare(plans[name], "megatron") for name in PLANS}
    items = [{"name": n, "args": script_args(render(ex)), "world": ex.world} for n, ex in exports.items()]
    assert all(i["args"] == args(exports[i["name"]]) for i in items)
    got = _clean(run_child(MEGATRON, items, tmp_path))
    for name, ex in exports.items():
        r, s = got[name], ex.shape
        assert (r["tp"], r["pp"], r["sp"]) == (s.tp, s.pp, s.sp), name
        assert r["recompute"] == {"none": None, "selective": "selective", "full": "full"}[s.ckpt], name
        if s.pp > 1:
            assert r["blocks_per_stage"] == [sum(ex.model.layers[i].kind == "block" for i in st) for st in s.split], name
        assert r["distributed_optimizer"] == (s.zero == 1), name
        assert r["overlap"] == [s.overlap, s.overlap], name
        assert r["sharding"] == {0: "no_shard", 1: "no_shard", 2: "optim_grads", 3: "optim_grads_params"}[s.zero], name
        assert r["microbatches"] == s.num_microbatches and r["bf16"], name


@needs("deepspeed")
def test_deepspeed_config_takes_every_export(plans, tmp_path):
    items, exports = [], {}
    for name in PLANS + ["wrong-batch"]:
        ex = prepare(plans["readme" if name == "wrong-batch" else name], "deepspeed")
        doc = json.loads(render(ex))
        assert doc["autopar_export"][:len(ex.header_lines())] == ex.header_lines()
        if name == "wrong-batch":  # the check this test relies on must fail on a batch that does not add up
            doc["train_batch_size"] += 1
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        exports[name] = ex
        items.append({"name": name, "path": str(path), "dp": ex.world // (ex.shape.tp * ex.shape.pp),
                      "blocks": [int(ly.kind == "block") for ly in ex.model.layers]})
    got = _clean(run_child(DEEPSPEED, items, tmp_path))
    assert "Check batch related parameters" in got.pop("wrong-batch")["refused"]
    for item in items[:-1]:
        name, dp = item["name"], item["dp"]
        r, ex = got[name], exports[name]
        s = ex.shape
        assert "refused" not in r, (name, r)
        assert r["world"] == dp and (r["train_batch_size"], r["gas"]) == (ex.plan.global_batch_size, s.num_microbatches)
        assert r["micro"] * s.num_microbatches * dp == ex.plan.global_batch_size, name
        assert r["zero"] == s.zero and r["bf16"] is True, name
        assert r["pipeline"]["stages"] == (s.pp if s.pp > 1 else "auto"), name
        if s.pp > 1:
            assert s.zero < 2, name  # DeepSpeed's PipelineEngine refuses ZeRO-2/3
            assert r["pipeline"]["activation_checkpoint_interval"] == (1 if s.ckpt == "full" else 0), name
            assert r["parts"] == [st[0] for st in s.split] + [ex.model.num_layers], name  # DeepSpeed's split
        assert r["autotp"] == (s.tp if s.tp > 1 else 0), name


@needs("accelerate")
def test_accelerate_launch_and_fsdp_plugin_take_every_export(plans, tmp_path):
    names = [p for p in PLANS if not p.startswith("hetero")]  # those are refused (test_closest.py)
    exports = {name: prepare(plans[name], "accelerate") for name in names}
    items = []
    for name, ex in exports.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(render(ex))
        items.append({"name": name, "path": str(path)})
    got = _clean(run_child(ACCELERATE, items, tmp_path))
    for name, ex in exports.items():
        r, s = got[name], ex.shape
        assert r["num_processes"] == ex.world and r["distributed_type"] in ("FSDP", "DistributedType.FSDP"), name
        want = {(3, True): "FULL_SHARD", (3, False): "SHARD_GRAD_OP", (0, True): "NO_SHARD"}[s.zero, s.reshard]
        # the plugin takes FSDP1's strategy from FSDP_SHARDING_STRATEGY; the newer key travels beside it
        assert r["env_sharding"] == want and r["sharding"] == want and r["env_reshard"].upper() == want, name
        assert r["ac"] == (s.ckpt == "full") and r["mixed_precision"] == "bf16", name
        assert s.pp == 1 and s.tp == 1, name
