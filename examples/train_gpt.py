"""Train a small GPT end to end with a searched plan on a CPU "cluster" of local processes.

    python examples/train_gpt.py                 # search a plan for 4 CPU processes, launch, train
    python examples/train_gpt.py --nproc 2 --steps 10

What it does, top to bottom:
1. traces the reference GPT (autopar.models) on the meta device into a ModelSpec;
2. searches the fastest plan for it on ``<nproc>xcpu`` and writes ``runs/train_gpt/plan.yaml``;
3. writes the launch scripts with ``autopar.launch`` (the same as ``autopar launch``);
4. runs the generated ``run_local.sh``: torchrun starts the ranks, each re-enters this file with
   ``--plan`` and trains with ``autopar.wrap``; rank 0 prints the losses.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

from autopar.models.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=256, seq_len=32, dim=64, n_layers=4, n_heads=4, ffn_hidden=256)
GLOBAL_BATCH = 16


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic task: each sequence counts up from a random start (mod vocab)."""
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, CONFIG.vocab_size, (GLOBAL_BATCH, 1), generator=g)
    seq = (start + torch.arange(CONFIG.seq_len + 1)) % CONFIG.vocab_size
    return seq[:, :-1], seq[:, 1:]


def train(plan_path: str, steps: int) -> None:
    """One rank's training loop (run under torchrun)."""
    import torch.distributed as dist

    import autopar

    torch.manual_seed(0)
    model = GPT(CONFIG)  # same seed on every rank: same initial weights as single-device training
    pm = autopar.wrap(model, plan_path, optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3))
    for step in range(steps):
        x, y = batch(step)
        loss = pm.step(x, y)
        if dist.get_rank() == 0:
            print(f"step {step:3d}  loss {loss:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def search_and_launch(nproc: int, steps: int, out: Path) -> int:
    """Search a plan, write it and its launch scripts, run them; return the launcher's exit code."""
    from autopar.cluster.parse import load_cluster
    from autopar.launch import write_launch_scripts
    from autopar.modelspec.trace import spec_from_module
    from autopar.report import figures_line, plan_shape, plan_table
    from autopar.search import SearchOptions, search

    with torch.device("meta"):
        meta_model = GPT(CONFIG)
    spec = spec_from_module(meta_model, torch.zeros(1, CONFIG.seq_len, dtype=torch.long), name="gpt-example",
                            seq_len=CONFIG.seq_len)
    cluster = load_cluster(f"{nproc}xcpu")
    res = search(spec, cluster, GLOBAL_BATCH, SearchOptions(), with_baselines=False)
    print(f"plan for {spec.name} on {cluster.describe()}: {plan_shape(res.plan)}")
    print(plan_table(res.plan, res.estimate))
    print(f"predicted: {figures_line(res.estimate)}")
    paths = write_launch_scripts(res.plan, __file__, out, script_args=["--steps", str(steps)])
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)
    # torchrun lives beside this interpreter (a virtual environment need not be activated).
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return subprocess.run(["bash", str(out / "run_local.sh")], check=False, env=env).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="runs/train_gpt")
    ap.add_argument("--plan", help="(set by the launch script) train with this plan on this rank")
    args = ap.parse_args()
    if args.plan:
        train(args.plan, args.steps)
        return 0
    return search_and_launch(args.nproc, args.steps, Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
