"""A small hand-written autopar-measured/1 file (GPT-2 small shape, one node of 4 A100), and a writer."""

from __future__ import annotations

import copy

import yaml

DOC = {
    "format": "autopar-measured/1",
    "name": "tiny",
    "source": {"repo": "example/tiny", "path": "results.txt", "commit": "0" * 40},
    "model": {"hf_config": {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 1024,
                            "n_positions": 512}, "seq_len": 512, "precision": "fp16"},
    "cluster": {"nodes": [{"gpu": "A100 80GB", "count": 4, "repeat": None, "intra_bw_gbps": None}],
                "inter_bw_gbps": None},
    "global_batch_size": 16,
    "schedule": "1f1b",
    "cases": [
        {"id": "pp2", "pp": 2, "tp": 1, "dp": 2, "micro_batch_size": 2, "num_microbatches": 4, "zero": 0,
         "ckpt": "full", "layers_per_stage": [3, 3], "measured_s": 0.5, "status": "ok"},
        {"id": "tp2-even", "pp": 1, "tp": 2, "dp": 2, "micro_batch_size": 4, "num_microbatches": 2, "zero": 1,
         "ckpt": "none", "sequence_parallel": True, "layers_per_stage": None, "measured_s": 0.4},
        {"id": "oom", "pp": 1, "tp": 1, "dp": 4, "micro_batch_size": 4, "num_microbatches": 1, "zero": 0,
         "ckpt": "none", "layers_per_stage": [6], "measured_s": None, "status": "failed"},
        {"id": "interleaved", "pp": 2, "tp": 1, "dp": 2, "virtual_stages": 2, "micro_batch_size": 1,
         "num_microbatches": 8, "zero": 0, "ckpt": "none", "layers_per_stage": None, "measured_s": 0.3,
         "status": "inexpressible"},
        {"id": "no-mbs", "pp": 1, "tp": 1, "dp": 4, "micro_batch_size": None, "num_microbatches": None, "zero": 0,
         "ckpt": "none", "layers_per_stage": [6], "measured_s": 0.3, "status": "ok"},
    ],
}


def write(tmp_path, edit=None, name: str = "tiny.yaml"):
    """Write the tiny file (after ``edit(doc)`` when given) under ``tmp_path``; returns its path."""
    doc = copy.deepcopy(DOC)
    if edit is not None:
        edit(doc)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
