"""One line per logged optimizer step on rank 0, with torchtitan's metric names.

``step: 10  loss: 3.2104  grad_norm: 1.0312  memory: 1.52GiB(max_allocated)  tps: 12,345  tflops: 1.23  mfu: 4.56%``

- ``tps``: tokens per second per device (torchtitan's tps): the tokens of every ``step`` call since
  the last logged line (integer inputs count their elements, token ids; other inputs count
  samples) over the wall time since then, divided by the world size.
- ``tflops``: model TFLOP/s per device = tps x FLOPs per token. FLOPs per token are what the plan's
  cost model counted when the plan records them (``predicted.tflops`` x devices / ``tokens_per_s``),
  else 6 N (N = the model's parameter count; forward + backward, attention scores not counted).
- ``mfu``: those FLOP/s over the peak of the plan's cluster devices (``plan.cluster``, at the plan's
  precision), as the planner's MFU is defined.
- ``memory``: ``torch.cuda.max_memory_allocated`` on CUDA, else the process's peak RSS.

Written to the ``autopar.steps`` logger at INFO (its level is set to INFO unless you set one); when
no handler would print them, it gets its own stdout handler so the lines show up as in torchtitan.
"""

from __future__ import annotations

import logging
import resource
import sys
import time

import torch

from autopar.plan.schema import Plan

GIB = 1024 ** 3
log = logging.getLogger("autopar.steps")


def flops_per_token(plan: Plan, num_params: int) -> tuple[float, str]:
    """FLOPs one token costs in forward + backward, and where the figure comes from."""
    pred = plan.predicted or {}
    tflops, tokens_per_s = pred.get("tflops"), pred.get("tokens_per_s")
    if tflops and tokens_per_s:
        return float(tflops) * 1e12 * plan.world_size / float(tokens_per_s), "plan"
    return 6.0 * num_params, "6N"


def peak_flops(plan: Plan) -> float:
    """Sum of the dense peak FLOP/s of the plan's devices (0 when the cluster does not say)."""
    try:
        return sum(plan.cluster.gpu_of(d).flops for d in range(plan.world_size))
    except Exception:  # noqa: BLE001  (a plan without a usable cluster: no MFU, not an error)
        return 0.0


def memory_figure(device: torch.device) -> tuple[float, str]:
    """(GiB, what it is): CUDA max allocated, or the peak resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB, "max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, "max_rss"


def tokens_of(inputs: torch.Tensor) -> int:
    """Tokens in a batch: the element count of integer inputs (token ids), else the sample count."""
    return inputs.numel() if not inputs.is_floating_point() else int(inputs.shape[0])


class StepLogger:
    """Formats and emits the step lines of one rank (only rank 0 writes)."""

    def __init__(self, every: int, plan: Plan, num_params: int, rank: int, device: torch.device) -> None:
        self.every, self.rank, self.device, self.world = every, rank, device, plan.world_size
        self.flops_per_token, self.flops_source = flops_per_token(plan, num_params)
        self.peak = peak_flops(plan)
        self.tokens = 0
        self.since = time.perf_counter()
        if rank == 0 and every:
            if log.level == logging.NOTSET:  # asking for step lines means showing them
                log.setLevel(logging.INFO)
            if not log.hasHandlers():
                handler = logging.StreamHandler(sys.stdout)
                handler.setFormatter(logging.Formatter("%(message)s"))
                log.addHandler(handler)

    def count(self, inputs: torch.Tensor) -> None:
        """Add one ``step`` call's batch to the tokens of the next line."""
        self.tokens += tokens_of(inputs)

    def line(self, step: int, loss: float, grad_norm: float | None) -> str:
        """The line for ``step`` (and restart the counters)."""
        now = time.perf_counter()
        elapsed = max(now - self.since, 1e-9)
        tps = self.tokens / elapsed / self.world
        flops = tps * self.flops_per_token
        mem, what = memory_figure(self.device)
        parts = [f"step: {step}", f"loss: {loss:.4f}"]
        if grad_norm is not None:
            parts.append(f"grad_norm: {grad_norm:.4f}")
        parts += [f"memory: {mem:.2f}GiB({what})", f"tps: {tps:,.0f}", f"tflops: {flops / 1e12:.2f}"]
        if self.peak > 0:
            parts.append(f"mfu: {100 * flops * self.world / self.peak:.2f}%")
        self.tokens, self.since = 0, now
        return "  ".join(parts)

    def after_step(self, step: int, loss: float, grad_norm: float | None) -> None:
        """Emit the line on rank 0 when ``step`` is a multiple of ``every`` (0: never)."""
        if not self.every or step % self.every:
            return
        text = self.line(step, loss, grad_norm)
        if self.rank == 0:
            log.info(text)
