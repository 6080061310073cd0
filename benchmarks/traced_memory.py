"""What a plan searched on the formulas needs when ``autopar.wrap`` runs the transformers model, and the plan
``search --trace`` finds instead.

The formulas (``autopar/modelspec/hf.py``) count the activations fused kernels keep (Megatron-core, torchtitan,
the frameworks ``autopar export`` writes for) and price Megatron's TP; ``wrap`` runs the transformers model's own
modules (HF's RMSNorm keeps an fp32 copy of its input, rotary embeddings keep their inputs) and the TP its units
view offers (none on the MoE families' blocks). For published configs of formula families, each case: the plan
searched on the formulas, the same plan estimated on the traced model (what ``wrap`` keeps), and the plan searched
on the traced model. Nothing is measured: both sides are autopar's estimates, the traced one checked against what
the layers keep on CPU by tests/modelspec/test_trace_saved.py.

    python benchmarks/traced_memory.py    # prints the table, writes results/traced_memory.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from autopar.cluster.parse import load_cluster
from autopar.errors import AutoparError
from autopar.estimate import estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.precision import activation_bytes, at_precision
from autopar.plan.validate import validate_plan
from autopar.report import plan_shape
from autopar.search import SearchOptions, search

# Published config.json fields that shape each model (the Hugging Face repository named)
CONFIGS = {
    "meta-llama/Llama-2-7b-hf": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05, "tie_word_embeddings": False},
    "mistralai/Mistral-7B-v0.1": {
        "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
        "sliding_window": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False},
    "Qwen/Qwen2-7B": {
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False},
    "mistralai/Mixtral-8x7B-v0.1": {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "tie_word_embeddings": False},
}
# (config, cluster, global batch, seq len)
CASES = [
    ("meta-llama/Llama-2-7b-hf", "8xA100-40G", 32, 4096),
    ("meta-llama/Llama-2-7b-hf", "8xA100-80G", 64, 4096),
    ("mistralai/Mistral-7B-v0.1", "8xA100-40G", 32, 4096),
    ("Qwen/Qwen2-7B", "8xA100-80G", 64, 4096),
    ("mistralai/Mixtral-8x7B-v0.1", "2x8xH100-80G", 256, 4096),
]


def _search(model, cluster_spec: str, batch: int):
    opts = SearchOptions(progress=False)
    cluster, opts.params = at_precision(load_cluster(cluster_spec), opts.params, "bf16", profiled=False)
    return search(model, cluster, batch, opts, with_baselines=False), opts.params


def run_case(folder: Path, name: str, cluster: str, batch: int, seq: int) -> dict:
    """The three figures of one case (see the module docstring)."""
    path = folder / (name.replace("/", "__") + ".json")
    path.write_text(json.dumps(CONFIGS[name]))
    formula = load_model(str(path), seq, dtype_bytes=activation_bytes("bf16"))
    traced = load_model(str(path), seq, dtype_bytes=activation_bytes("bf16"), trace=True)
    searched, params = _search(formula, cluster, batch)
    try:  # a strategy the units view does not run (TP on an MoE family's blocks) is refused, not estimated
        validate_plan(searched.plan, traced)
        under_wrap, refused = estimate_plan(searched.plan, traced, params), None
    except AutoparError as err:
        under_wrap, refused = None, str(err)
    traced_search, _ = _search(traced, cluster, batch)
    return {
        "model": name, "cluster": cluster, "global_batch_size": batch, "seq_len": seq,
        "formula_plan": plan_shape(searched.plan), "formula_step_s": searched.estimate.step_time_s,
        "formula_gib": searched.estimate.max_memory_gib, "device_budget_gib": min(searched.estimate.budget_gib.values()),
        "same_plan_traced_gib": under_wrap and under_wrap.max_memory_gib,
        "same_plan_traced_fits": under_wrap is not None and bool(under_wrap.fits), "same_plan_refused": refused,
        "traced_plan": plan_shape(traced_search.plan), "traced_step_s": traced_search.estimate.step_time_s,
        "traced_gib": traced_search.estimate.max_memory_gib,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "traced_memory.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_case(Path(tmp), *case) for case in CASES]
    print(f"{'model':<30} {'cluster':<13} {'formula plan GiB':>16} {'traced GiB':>10} {'fits':>5} "
          f"{'--trace plan GiB':>16} {'step ratio':>10}")
    for r in rows:
        traced = "-" if r["same_plan_refused"] else f"{r['same_plan_traced_gib']:.1f}"
        fits = "wrap refuses" if r["same_plan_refused"] else "yes" if r["same_plan_traced_fits"] else "NO"
        print(f"{r['model']:<30} {r['cluster']:<13} {r['formula_gib']:>16.1f} {traced:>10} {fits:>12} "
              f"{r['traced_gib']:>16.1f} {r['traced_step_s'] / r['formula_step_s']:>10.3f}")
    for r in rows:
        if r["same_plan_refused"]:
            print(f"{r['model']} on {r['cluster']}, the formulas' plan under wrap: {r['same_plan_refused']}")
    Path(args.output).write_text(json.dumps({"what": __doc__.splitlines()[0], "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
