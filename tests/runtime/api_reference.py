"""Training-API references: a scripted run under a plan on forked gloo ranks, and the same script on one process.

A script is a list of calls ``(batch index, accumulate)``; batches come from ``batches(model, n)``
(distinct global batches of the model's test data shape). The single-process reference follows the
API's definitions: accumulated calls add ``1/N`` of each batch's mean-loss gradient (N = calls in the
optimizer step), ``max_grad_norm`` clips with ``torch.nn.utils.clip_grad_norm_``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autopar.runtime.local_ranks import run_distributed
from tests.runtime.cases import MODELS

Script = list[tuple[int, bool]]


def batches(model: str, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` distinct global batches shaped like the model's test data (batch 0 is that data)."""
    x, y = MODELS[model][2]
    g = torch.Generator().manual_seed(99)
    out = [(x, y)]
    for _ in range(n - 1):
        if x.is_floating_point():
            out.append((torch.randn(x.shape, generator=g), torch.randn(y.shape, generator=g)))
        else:
            out.append((torch.randint(0, 64, x.shape, generator=g), torch.randint(0, 64, y.shape, generator=g)))
    return out


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


def adamw(ps):
    """AdamW with eps 1e-6: under torch's 1e-8 an element whose true gradient is ~0 (one of Llama's
    up-projection here) turns float-order noise into a 1e-4 step in any distributed run."""
    return torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, eps=1e-6)


def _rank(rank, world, model, plan, script, optimizer, wrap_kwargs):
    from autopar.runtime import wrap

    build, _, _, loss_fn = MODELS[model]
    data = batches(model, 1 + max(i for i, _ in script))
    torch.manual_seed(0)
    pm = wrap(build(), plan, optimizer=optimizer, loss_fn=loss_fn, **wrap_kwargs)
    losses, norms = [], []
    for i, acc in script:
        losses.append(pm.step(*data[i], accumulate=acc))
        if not acc:
            norms.append(pm.last_grad_norm)
    return losses, norms, pm.full_state_dict()


def run_script(model: str, plan, script: Script, optimizer: Callable = sgd, **wrap_kwargs):
    """Per rank: (losses per call, grad norm per optimizer step, full state)."""
    return run_distributed(_rank, plan.world_size, model, plan, script, optimizer, wrap_kwargs)


def reference_script(model: str, script: Script, optimizer: Callable = sgd, max_grad_norm: float | None = None):
    """The script on one process: (losses per call, grad norm per optimizer step, parameters)."""
    from autopar.runtime.stage import cross_entropy

    build, _, _, loss_fn = MODELS[model]
    loss_fn = loss_fn or cross_entropy
    data = batches(model, 1 + max(i for i, _ in script))
    torch.manual_seed(0)
    m = build()
    opt = optimizer(list(m.parameters()))
    losses, norms, pending = [], [], []
    for i, acc in script:
        pending.append(i)
        if acc:
            with torch.no_grad():
                losses.append(loss_fn(m(data[i][0]), data[i][1]).item())
            continue
        opt.zero_grad()
        for j in pending:  # the gradient of the mean loss over every accumulated sample
            loss = loss_fn(m(data[j][0]), data[j][1])
            (loss / len(pending)).backward()
        losses.append(loss.item())
        if max_grad_norm is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), max_grad_norm).item())
        else:
            norms.append(None)
        opt.step()
        pending = []
    return losses, norms, {k: v.detach().clone() for k, v in m.named_parameters()}


def assert_script_matches(model: str, plan, script: Script, optimizer: Callable = sgd, tol: float = 1e-5,
                          **wrap_kwargs) -> dict:
    """Run ``script`` under ``plan`` and on one process; assert losses, norms and parameters agree."""
    got = run_script(model, plan, script, optimizer, **wrap_kwargs)
    ref_losses, ref_norms, ref_state = reference_script(model, script, optimizer, wrap_kwargs.get("max_grad_norm"))
    worst = 0.0
    for rank, (losses, norms, state) in enumerate(got):
        assert losses == got[0][0] and norms == got[0][1], f"rank {rank} differs from rank 0"
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=tol, rtol=tol)
        if ref_norms and ref_norms[0] is not None:
            torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), atol=tol, rtol=tol)
        for name, ref in ref_state.items():
            torch.testing.assert_close(state[name], ref, atol=tol, rtol=tol, msg=lambda m, n=name: f"{n}: {m}")
            worst = max(worst, (state[name] - ref).abs().max().item())
    return {"losses": got[0][0], "norms": got[0][1], "ref_norms": ref_norms, "max_param_diff": worst}
