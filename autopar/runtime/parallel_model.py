"""``ParallelModel``: this rank's share of a model trained as a plan says (built by ``wrap``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.plan.schema import Plan
from autopar.runtime.checkpoint_io import load_checkpoint, save_checkpoint
from autopar.runtime.clip import clip_coefficient, global_grad_norm, optimizer_grads, scale_grads
from autopar.runtime.context_parallel import plan_cp
from autopar.runtime.grad_sync import UnitGradSync
from autopar.runtime.guards import check_same_batch, finite_step
from autopar.runtime.hf_checkpoint import load_hf_checkpoint
from autopar.runtime.hf_save import MAX_FILE_BYTES, save_hf_checkpoint
from autopar.runtime.layout import Placement
from autopar.runtime.outputs import gather_outputs, global_loss
from autopar.runtime.p2p import Mailbox
from autopar.runtime.sharding import AsyncReducer, FlatShard, Zero2Reducer, reshard_kept
from autopar.runtime.stage import LocalUnit, StageRunner
from autopar.runtime.step_log import StepLogger
from autopar.runtime.ties import TiedGrads
from autopar.runtime.unit_rng import RNGClock

log = logging.getLogger(__name__)


@dataclass
class _UnitState:
    unit: LocalUnit
    place: Placement
    sync: UnitGradSync
    proxies: list[torch.Tensor]  # what the optimizer steps for this unit
    shard: FlatShard | None  # ZeRO-1/2
    zero2: Zero2Reducer | AsyncReducer | None  # ZeRO-2 (or ZeRO-1 zero_overlap) reducing in backward


class ParallelModel:
    """This rank's share of a model trained as a plan says. Build it with ``wrap``.

    Every call below is collective (all ranks call it, in the same order, with the same batch):

    - ``step(inputs, targets, accumulate=False)``: forward and backward over the whole global batch
      (batch dimension first, the same full tensors on every rank) and, unless ``accumulate``, the
      optimizer step; returns the global mean loss of this batch (the same on every rank).
    - ``eval_step(inputs, targets)``: the global mean loss, forward only (no graph, no gradients,
      no optimizer; pipelines included). ``predict(inputs)`` / ``pm(inputs)``: the model's output
      for a batch of any size, gathered on every rank.
    - ``train()`` / ``eval()``: the training flag of every local unit (dropout, ...).
    - ``save(dir)`` / ``load(dir)``: a torch.distributed.checkpoint of the whole training state,
      loadable under another plan (autopar.runtime.checkpoint_io).
    - ``full_state_dict()``: every unsharded parameter on every rank.

    ``optimizer`` is the optimizer the factory built over this rank's tensors. ``skipped_steps``
    lists the steps (numbered from 1 by ``step`` call) skipped under ``on_nonfinite="skip"``;
    ``optimizer_steps`` counts the optimizer steps taken; ``last_grad_norm`` is the global gradient
    norm of the last optimizer step (before clipping) when ``max_grad_norm`` is set, else None.
    """

    def __init__(self, plan: Plan, device: torch.device, runner: StageRunner, states: list[_UnitState],
                 optimizer: torch.optim.Optimizer, mailbox: Mailbox, shapes: dict, places: dict,
                 on_nonfinite: str, max_grad_norm: float | None = None, log_every: int = 0,
                 tied: TiedGrads | None = None, rng_clock: RNGClock | None = None) -> None:
        self.plan, self.device, self.runner, self.optimizer = plan, device, runner, optimizer
        self._tied = tied  # gradients of tensors two units share (autopar.runtime.ties)
        self._rng_clock = rng_clock or RNGClock()  # the call the units' random streams are at (runtime.unit_rng)
        self.hf = None  # the transformers model's names, config and conversions (autopar.models.hf.HFSource)
        self._states, self._mailbox, self._shapes, self._places = states, mailbox, shapes, places
        self.rank = dist.get_rank()
        self.pipeline, self.stage = runner.spec.pipeline, runner.spec.stage
        self.on_nonfinite, self.skipped_steps, self._calls = on_nonfinite, [], 0
        self.max_grad_norm, self.last_grad_norm = max_grad_norm, None
        self.optimizer_steps, self._accumulated, self._accumulated_loss, self.training = 0, 0, 0.0, True
        self._accumulated_weight = 1.0  # valid targets of the first accumulated call (token-mean loss)
        num_params = sum(torch.Size(s).numel() for shapes_ in shapes.values() for _, s, _ in shapes_)
        self._logger = StepLogger(log_every, plan, num_params, self.rank, device)

    @property
    def local_units(self) -> dict[str, nn.Module]:
        """The units this rank runs (TP / FSDP-wrapped modules), by name."""
        return {s.unit.name: s.unit.module for s in self._states}

    # -- modes and forward-only calls ------------------------------------------------------------
    def train(self, mode: bool = True) -> ParallelModel:
        """Set the training flag of every local unit (as ``nn.Module.train``); returns self."""
        self.training = mode
        for st in self._states:
            st.unit.module.train(mode)
        return self

    def eval(self) -> ParallelModel:
        """``train(False)``: dropout off, as ``nn.Module.eval``; returns self."""
        return self.train(False)

    def _batch(self, what: str, inputs: torch.Tensor, targets: torch.Tensor | None,
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch on this rank's device, after checking it is the same on every rank and whole."""
        inputs = inputs.to(self.device)
        targets = targets.to(self.device) if targets is not None else None
        check_same_batch(inputs, targets if targets is not None else inputs[:0], self._calls)
        self._rng_clock.tick = (self._calls, what)
        gbs = self.plan.global_batch_size
        if inputs.shape[0] != gbs or (targets is not None and targets.shape[0] != gbs):
            got = inputs.shape[0] if targets is None else f"{inputs.shape[0]} / {targets.shape[0]}"
            raise AutoparError(f"{what} inputs", f"batch dimensions {got} differ from the plan's "
                               f"global_batch_size {gbs}", "pass the whole global batch on every rank")
        return inputs, targets

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """The global mean loss of a global batch, forward only (in the current train/eval mode)."""
        inputs, targets = self._batch("eval_step", inputs, targets)
        loss_sum, _ = self.runner.run_forward(inputs, targets)
        reshard_kept(self.local_units.values())
        self._mailbox.flush()
        return global_loss(loss_sum)

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        """The model's output for a batch of any size, forward only, on every rank (a collective).

        The batch runs as consecutive global batches of the plan's size, the last one padded with
        copies of its first row (their outputs are dropped: rows must not interact, as in any model
        without batch statistics in the current mode). Rows come in batch order; vocabulary-sharded
        logits are gathered. The output is as the last unit computed it (its dtype included); each
        global batch's rows travel in one all-reduce over the world.
        """
        gbs = self.plan.global_batch_size
        if inputs.dim() == 0 or inputs.shape[0] == 0:
            raise AutoparError("predict inputs", "the batch is empty", "pass at least one row (batch dimension first)")
        if plan_cp(self.plan):  # each rank holds part of every sequence: gathering outputs is not built
            raise AutoparError("predict", "is not available under a context-parallel plan (cp > 1)",
                               "use eval_step for the loss, or predict under a plan with cp 1")
        pieces = []
        for lo in range(0, inputs.shape[0], gbs):
            chunk = inputs[lo:lo + gbs]
            rows = chunk.shape[0]
            if rows < gbs:
                chunk = torch.cat([chunk, chunk[:1].expand(gbs - rows, *chunk.shape[1:])])
            chunk, _ = self._batch("predict", chunk, None)
            _, outputs = self.runner.run_forward(chunk, None)
            reshard_kept(self.local_units.values())
            self._mailbox.flush()
            pieces.append(gather_outputs(self.runner, outputs, gbs, self.device)[:rows])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    __call__ = predict

    # -- training --------------------------------------------------------------------------------
    def step(self, inputs: torch.Tensor, targets: torch.Tensor, *, accumulate: bool = False) -> float:
        """Forward and backward over the global batch, then (unless ``accumulate``) the optimizer step.

        Returns this batch's global mean loss (same on every rank). ``accumulate=True`` keeps the
        gradients and takes no optimizer step; the next ``step`` without it steps on the mean
        gradient over every accumulated batch, i.e. the gradient of the mean loss over all their
        samples (each call's batch has the same size, so each call's mean weighs 1/N). With the
        token-mean loss that holds only when every accumulated call has as many valid (not ignored)
        targets as the first: a call with another count is refused before it runs, the same on every
        rank (its mean would weigh 1/N instead of by its tokens). With
        ``max_grad_norm`` that mean gradient is clipped to the global norm first.

        Raises AutoparError, the same on every rank, if the ranks passed different batches, or (with
        ``on_nonfinite="raise"``) if the loss or a gradient is NaN/inf; ``"skip"`` leaves the
        parameters and optimizer state untouched for that step instead and returns the loss.
        """
        self._calls += 1
        inputs, targets = self._batch("step", inputs, targets)
        weight = self.runner.loss.weight(targets)
        if self._accumulated and weight != self._accumulated_weight:
            raise AutoparError("step targets", f"{weight:g} valid targets, where the {self._accumulated} accumulated "
                               f"call(s) before had {self._accumulated_weight:g}: equal-weight means would differ "
                               "from one process's mean over all their tokens",
                               "accumulate batches with the same number of valid targets, or step this one alone")
        if not self._accumulated:
            self._accumulated_weight = weight
        self._logger.count(inputs)
        loss_sum = self.runner.run(inputs, targets)
        self._mailbox.flush()
        self._accumulated += 1
        if accumulate:
            for st in self._states:
                if st.zero2 is not None:
                    st.zero2.flush()
            loss = global_loss(loss_sum)
            self._accumulated_loss += loss
            return loss
        for st in self._states:
            if st.zero2 is not None:  # already reduce-scattered during backward
                st.zero2.flush()
                continue
            synced = st.sync.sync()
            if st.shard is not None:
                st.shard.set_grad_from_full(synced)
            else:
                for proxy, g in zip(st.proxies, synced):
                    proxy.grad = g
            self._free_accumulated_grads(st)
        if self._tied is not None:  # before clipping: the norm needs every tie's summed gradient
            self._tied.sync(self._states)
        calls, earlier_loss = self._accumulated, self._accumulated_loss
        if calls > 1:
            scale_grads(self._states, 1.0 / calls)
        self._accumulated, self._accumulated_loss = 0, 0.0
        if self.max_grad_norm is not None:
            self.last_grad_norm = global_grad_norm(self._states, self._places, self.rank, self.device,
                                                   self._tied)
            coef = clip_coefficient(self.last_grad_norm, self.max_grad_norm)
            scale_grads(self._states, coef)
        loss, problem = finite_step(loss_sum, optimizer_grads(self._states), self._calls)
        if problem is None:
            self.optimizer.step()
            self.optimizer_steps += 1
        for st in self._states:
            if st.shard is not None and problem is None:
                st.shard.all_gather_params()  # with zero_overlap only issued: all units' gathers at once
            for p in st.unit.module.parameters():
                p.grad = None
        for st in self._states:
            if st.shard is not None:
                st.shard.wait_params()
        self.optimizer.zero_grad(set_to_none=True)
        if problem is not None:
            if self.on_nonfinite == "raise":
                raise AutoparError("step", problem, "check this step's batch and the learning rate, or pass "
                                   "wrap(..., on_nonfinite='skip') to skip such steps")
            self.skipped_steps.append(self._calls)
            if self.rank == 0:
                log.warning("autopar: %s: optimizer step skipped (on_nonfinite='skip')", problem)
        # The line reports the optimizer step's loss: the mean over its accumulated calls.
        self._logger.after_step(self.optimizer_steps + len(self.skipped_steps), (earlier_loss + loss) / calls,
                                self.last_grad_norm)
        return loss

    # -- checkpoints -----------------------------------------------------------------------------
    def _no_pending_gradients(self, what: str) -> None:
        if self._accumulated:
            raise AutoparError(what, f"{self._accumulated} accumulate=True step call(s) hold gradients no optimizer "
                               "step has used (a checkpoint holds no gradients)",
                               "finish the accumulation with step(..., accumulate=False) first")

    def save(self, path: str | os.PathLike) -> None:
        """Write the training state to directory ``path`` (collective; see checkpoint_io)."""
        self._no_pending_gradients("save")
        save_checkpoint(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Replace this model's training state by a checkpoint ``save`` wrote under any plan (collective)."""
        self._no_pending_gradients("load")
        load_checkpoint(self, path)

    def load_hf(self, path: str | os.PathLike) -> None:
        """Read a Hugging Face checkpoint folder (``save_pretrained``'s safetensors) into this wrapped transformers
        model before training, each rank reading only what it holds (collective; see hf_checkpoint)."""
        self._no_pending_gradients("load_hf")
        load_hf_checkpoint(self, path)

    def save_hf(self, path: str | os.PathLike, max_file_bytes: int = MAX_FILE_BYTES) -> None:
        """Write this wrapped transformers model to the new folder ``path`` as its ``save_pretrained`` would (config
        and safetensors files of at most ``max_file_bytes``, which ``from_pretrained`` loads), each rank writing
        only what it holds (collective; see hf_save)."""
        save_hf_checkpoint(self, path, max_file_bytes)

    @staticmethod
    def _free_accumulated_grads(st: _UnitState) -> None:
        """Drop the unit's accumulated gradients once the optimizer's copies are set.

        The optimizer reads the synced gradients from the proxies (or the ZeRO-1/2 shard); the
        module's own ``.grad`` (a DTensor wrapper under TP, the full gradient under ZeRO-1/2) would
        otherwise stay alive beside them through the optimizer step. A plain parameter that is its
        own proxy keeps its gradient (the proxies share storage with what they were given).
        """
        proxies = {id(t) for t in st.proxies}
        for p in st.unit.module.parameters():
            if id(p) not in proxies:
                p.grad = None

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model, unsharded, on the CPU of every rank (call on all ranks).

        Each unit is taken from its first placement (pipeline 0) and broadcast from that stage's
        first device.
        """
        local = {s.unit.name: s for s in self._states}
        out: dict[str, torch.Tensor] = {}
        # Gathering FSDP x TP parameters takes two all-gathers and torch logs a warning per parameter
        # about it; this runs once per export, so keep the log readable.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        for name, shapes in self._shapes.items():
            if not shapes:
                continue
            owner = self._places[name][0]
            flat = None
            if name in local and self.runner.spec.pipeline == owner.pipeline:
                fulls = [p.full_tensor() if isinstance(p, DTensor) else p.detach()
                         for p in local[name].unit.module.parameters()]
                flat = torch.cat([f.reshape(-1) for f in fulls]).to(self.device)
            numel = sum(torch.Size(s).numel() for _, s, _ in shapes)
            if self.rank != owner.devices[0]:
                flat = torch.empty(numel, dtype=shapes[0][2], device=self.device)
            dist.broadcast(flat, src=owner.devices[0])
            offset = 0
            for fqn, shape, _ in shapes:
                n = torch.Size(shape).numel()
                out[f"{name}.{fqn}"] = flat[offset:offset + n].view(shape).cpu().clone()
                offset += n
        return out
