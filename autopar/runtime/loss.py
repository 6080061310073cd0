"""The loss of a step: exactly the single-process loss over the whole global batch, however it is split.

The global batch is split over pipelines, data-parallel ranks and micro-batches; each piece's loss
is scaled so that the pieces add up to the single-process loss, and so do their gradients.

* Token cross entropy (the default loss, or an ``nn.CrossEntropyLoss`` with ``reduction="mean"``
  and no class weights): the single-process value is the mean over the *valid* tokens of the whole
  batch (targets equal to ``ignore_index``, -100 by default, do not count). Each piece contributes
  its summed loss divided by the global number of valid tokens. Every rank holds the whole global
  batch, so that count is computed locally, without a collective (``begin``).
* Any other ``loss_fn(output rows, target rows)`` is taken as a mean over rows: each piece's value
  is weighted by its share of the global batch's rows. That equals the single-process loss when
  every row weighs the same (MSE, a per-row mean); a loss that averages over a data-dependent count
  (masked tokens) is not split exactly this way: use the default / ``nn.CrossEntropyLoss`` for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Default loss: token-mean cross entropy of logits ``[..., V]`` against class indices ``[...]``,
    ignoring targets equal to -100 (``F.cross_entropy``'s own default)."""
    return F.cross_entropy(output.flatten(0, -2), target.flatten(), ignore_index=IGNORE_INDEX)


class TokenCrossEntropy:
    """Cross entropy summed over a piece's valid tokens, divided by the global batch's valid-token count."""

    def __init__(self, ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0, class_dim: int = -1) -> None:
        # class_dim -1: logits [..., V] (the default loss); 1: nn.CrossEntropyLoss's [N, C, d1, ...]
        self.ignore_index, self.label_smoothing, self.class_dim = ignore_index, label_smoothing, class_dim
        self.count = 1.0

    def weight(self, targets: torch.Tensor) -> float:
        """The global batch's valid targets (every rank holds the whole batch: no collective)."""
        if targets.is_floating_point():  # class probabilities: every position counts
            return float(targets.numel() // targets.shape[self.class_dim])
        return float((targets != self.ignore_index).sum().item())

    def begin(self, targets: torch.Tensor) -> None:
        """Count the global batch's valid targets: the divisor of every piece's sum."""
        self.count = self.weight(targets)

    def __call__(self, output: torch.Tensor, target: torch.Tensor, rows: int, global_rows: int) -> torch.Tensor:
        if self.class_dim == -1:
            output = output.flatten(0, -2)
            target = target.flatten(0, -2) if target.is_floating_point() else target.flatten()
        total = F.cross_entropy(output, target, ignore_index=self.ignore_index, reduction="sum",
                                label_smoothing=self.label_smoothing)
        # 0 valid tokens: 0 / 0 = nan, as single-process F.cross_entropy gives.
        return total / self.count if self.count else total * float("nan")


class RowMean:
    """A user loss (a mean over the rows it is given), weighted by the rows' share of the global batch."""

    def __init__(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.loss_fn = loss_fn

    def weight(self, targets: torch.Tensor) -> float:
        """Every global batch weighs the same (its rows do, and every batch has the plan's size)."""
        return 1.0

    def begin(self, targets: torch.Tensor) -> None:
        """Nothing to count: rows weigh the same."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor, rows: int, global_rows: int) -> torch.Tensor:
        return self.loss_fn(output, target) * (rows / global_rows)


def step_loss(loss_fn: Callable | None) -> TokenCrossEntropy | RowMean:
    """The splitter for ``loss_fn``: token-exact for the default and plain ``nn.CrossEntropyLoss``."""
    if loss_fn is None or loss_fn is cross_entropy:
        return TokenCrossEntropy()
    if (isinstance(loss_fn, nn.CrossEntropyLoss) and loss_fn.reduction == "mean" and loss_fn.weight is None):
        return TokenCrossEntropy(loss_fn.ignore_index, loss_fn.label_smoothing, class_dim=1)
    return RowMean(loss_fn)
