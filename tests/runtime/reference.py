"""Single-process references for the runtime tests: train a model on one process, or under a plan on
fork-started gloo ranks, and assert the two agree (losses and every parameter)."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

from autopar.plan.schema import Plan
from autopar.runtime.local_ranks import run_distributed


def _build(build: Callable[[], nn.Module], seed: int, meta: bool) -> nn.Module:
    if meta:
        with torch.device("meta"):
            return build()
    torch.manual_seed(seed)
    return build()


def reference_train(build: Callable[[], nn.Module], inputs: torch.Tensor, targets: torch.Tensor, steps: int,
                    lr: float, loss_fn: Callable | None = None, seed: int = 0, meta: bool = False,
                    ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process SGD on the whole batch: (losses, final parameters), the runtime's ground truth."""
    from autopar.runtime.materialize import init_weights
    from autopar.runtime.stage import cross_entropy

    model = init_weights(build(), seed) if meta else _build(build, seed, False)
    loss_fn = loss_fn or cross_entropy
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # Every name of a tied tensor (the runtime keeps one synchronised copy per unit); the names of one
    # tensor share one clone, so a name the runtime lists once per unit can be matched to it.
    clones: dict[int, torch.Tensor] = {}
    return losses, {k: clones.setdefault(id(v), v.detach().clone())
                    for k, v in model.named_parameters(remove_duplicate=False)}


def _train_rank(rank: int, world: int, build, plan, inputs, targets, steps, lr, loss_fn, seed, meta):
    from autopar.runtime.wrap import wrap

    pm = wrap(_build(build, seed, meta), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=lr), loss_fn=loss_fn,
              seed=seed)
    losses = [pm.step(inputs, targets) for _ in range(steps)]
    state = pm.full_state_dict()
    return losses, (state if rank == 0 else None)


def train_distributed(build: Callable[[], nn.Module], plan: Plan | str | os.PathLike, inputs: torch.Tensor, targets: torch.Tensor,
                      steps: int = 3, lr: float = 0.1, loss_fn: Callable | None = None, seed: int = 0,
                      meta: bool = False, timeout_s: float = 30.0,
                      ) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    """``wrap`` + ``steps`` SGD steps on the plan's ranks: (losses per rank, rank 0's full state).

    ``plan`` may be a path: the ranks then hand the path itself to ``wrap``.
    """
    if isinstance(plan, Plan):
        world = plan.world_size
    else:
        from autopar.plan.io import load_plan

        world = load_plan(plan).world_size
    out = run_distributed(_train_rank, world, build, plan, inputs, targets, steps, lr, loss_fn, seed, meta,
                          timeout_s=timeout_s)
    return [losses for losses, _ in out], out[0][1]


def assert_matches_reference(build: Callable[[], nn.Module], plan: Plan | str | os.PathLike, inputs: torch.Tensor,
                             targets: torch.Tensor, *, steps: int = 3, lr: float = 0.1,
                             loss_fn: Callable | None = None, seed: int = 0, meta: bool = False,
                             tol: float = 1e-5, timeout_s: float = 30.0) -> dict:
    """Train ``steps`` SGD steps under ``plan`` and on one process; assert equal losses and parameters.

    Every rank must report the same losses; losses and every parameter must agree with the
    single-process run within ``tol`` (absolute and relative). Returns the figures for reporting.
    """
    losses, state = train_distributed(build, plan, inputs, targets, steps, lr, loss_fn, seed, meta, timeout_s)
    ref_losses, ref_state = reference_train(build, inputs, targets, steps, lr, loss_fn, seed, meta)
    for rank, ls in enumerate(losses):
        assert ls == losses[0], f"rank {rank} reports losses {ls}, rank 0 {losses[0]}"
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(ref_losses), atol=tol, rtol=tol)
    aliases = {k for k in set(ref_state) - set(state) if any(ref_state[k] is ref_state[n] for n in state)}
    assert set(state) == set(ref_state) - aliases, f"parameter names differ: {sorted(set(state) ^ set(ref_state))}"
    worst = 0.0
    for name, ref in ref_state.items():
        if name in aliases:  # another name of a tensor inside one unit, checked under that name
            continue
        torch.testing.assert_close(state[name], ref, atol=tol, rtol=tol, msg=lambda m, n=name: f"{n}: {m}")
        worst = max(worst, (state[name] - ref).abs().max().item())
    return {"losses": losses[0], "ref_losses": ref_losses, "max_param_diff": worst}


def _wrap_outcome(rank: int, world: int, build: Callable[[], nn.Module], plan: Plan) -> str:
    from autopar.errors import AutoparError
    from autopar.runtime.wrap import wrap

    try:
        wrap(build(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    except AutoparError as e:
        return str(e)
    return "wrapped"


def wrap_outcomes(build: Callable[[], nn.Module], plan: Plan) -> list[str]:
    """Per rank of ``plan``: the AutoparError ``wrap(build(), plan)`` raises there, or "wrapped"."""
    return run_distributed(_wrap_outcome, plan.world_size, build, plan)
