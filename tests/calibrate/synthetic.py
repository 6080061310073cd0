"""Synthetic measured runs: an ``autopar-measured/1`` file whose times are what ``estimate_plan`` predicts
under known cost parameters, so a calibration must find those parameters again."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import yaml

from autopar.estimate import estimate_plan, plan_cost_params
from autopar.measured import load_runs

TRUE = {"eff_max": 0.3, "layer_overhead_s": 4e-4, "overlap_sync": 0.3}
# (pp, tp, dp, micro_batch_size per DP rank, micro-batches, zero, ckpt): global batch 32 on 8 GPUs
SHAPES = [(1, 1, 8, 1, 4, 0, "none"), (1, 1, 8, 2, 2, 0, "none"), (1, 1, 8, 4, 1, 0, "full"),
          (1, 2, 4, 1, 8, 0, "none"), (1, 2, 4, 4, 2, 0, "none"), (1, 4, 2, 2, 8, 0, "full"),
          (1, 4, 2, 4, 4, 0, "none"), (2, 1, 4, 1, 8, 0, "none"), (2, 2, 2, 2, 8, 0, "none"),
          (2, 4, 1, 4, 8, 0, "full"), (4, 1, 2, 2, 8, 0, "none"), (4, 2, 1, 4, 8, 0, "none"),
          (1, 1, 8, 2, 2, 3, "none"), (2, 1, 4, 2, 4, 3, "none")]
MODEL = {"name": "gpt2-12L", "seq_len": 512,
         "hf_config": {"model_type": "gpt2", "n_layer": 12, "n_embd": 1024, "n_head": 16, "n_inner": 4096,
                       "vocab_size": 50304, "n_positions": 512, "tie_word_embeddings": True}}
CLUSTER = {"description": "2 nodes of 4 A100", "nodes": [{"gpu": "A100-80G", "count": 4, "repeat": 2,
                                                          "intra_bw_gbps": 100.0}], "inter_bw_gbps": 5.0}


def measured_doc(shapes=SHAPES, name: str = "synthetic") -> dict:
    """The measured file of ``shapes`` with a placeholder time (1.0 s) per case."""
    cases = [{"id": f"syn-{i:02d}", "pp": pp, "tp": tp, "dp": dp, "micro_batch_size": mbs, "num_microbatches": m,
              "zero": zero, "ckpt": ckpt, "measured_s": 1.0}
             for i, (pp, tp, dp, mbs, m, zero, ckpt) in enumerate(shapes)]
    return {"format": "autopar-measured/1", "name": name, "source": {"repo": "tests"}, "model": copy.deepcopy(MODEL),
            "cluster": copy.deepcopy(CLUSTER), "global_batch_size": 32, "schedule": "1f1b", "cases": cases}


def write_measured(path: Path, true: dict | None = None, shapes=SHAPES, name: str = "synthetic") -> Path:
    """Write the measured file of ``shapes`` at ``path``, each time predicted under ``true`` (``TRUE``)."""
    doc = measured_doc(shapes, name)
    path.write_text(yaml.safe_dump(doc))
    true = TRUE if true is None else true  # over each run's own parameters (the reader's framework defaults)
    times = {r.case_id: estimate_plan(r.plan, r.model, replace(plan_cost_params(r.plan), **true)).step_time_s
             for r in load_runs(path).runs}
    for c in doc["cases"]:
        c["measured_s"] = times[c["id"]]
    path.write_text(yaml.safe_dump(doc))
    return path
