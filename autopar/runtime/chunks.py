"""A rank's model chunks: one stage of a plain pipeline, or the v chunks of an interleaved one.

With ``virtual_stages`` v > 1 a pipeline's stage list holds p * v chunks and this rank runs chunks
s, s + p, ... (chunk g on the devices of chunk g mod p). Each chunk is a ``StageRunner`` of a pipeline
of p * v virtual stages (its boundaries, tags and header caches are the virtual stage's), and
``ChunkedRunner`` drives them through the rank's slots of the interleaved table (``stage_slots``), so
the boundary from the last physical stage back to the first is an ordinary chunk boundary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autopar.errors import AutoparError
from autopar.plan.schema import Plan
from autopar.runtime.boundaries import BoundaryCheck
from autopar.runtime.layout import Layout
from autopar.runtime.p2p import Mailbox
from autopar.runtime.schedule import stage_slots
from autopar.runtime.stage import LocalUnit, StageRunner, StageSpec, run_slots


def rank_chunks(plan: Plan, rank: int) -> tuple[int, list[int]]:
    """(pipeline index, indices in its stage list of the chunks ``rank`` runs, in order)."""
    pi = next(pi for pi, p in enumerate(plan.pipelines) if any(rank in st.devices for st in p.stages))
    return pi, [si for si, st in enumerate(plan.pipelines[pi].stages) if rank in st.devices]


def chunk_spec(plan: Plan, pi: int, si: int) -> StageSpec:
    """Where chunk ``si`` of pipeline ``pi`` sits: its virtual stage, batch block and neighbours' layouts."""
    pipe = plan.pipelines[pi]
    n = len(pipe.stages)

    def layout(j: int, at: int) -> Layout:
        st = pipe.stages[j]
        return Layout(tuple(st.devices), st.layers[at].strategy.tp, st.layers[at].strategy.cp)

    return StageSpec(
        pipeline=pi, stage=si, num_stages=n, micro_batch_size=pipe.micro_batch_size,
        num_microbatches=pipe.num_microbatches,
        batch_offset=sum(p.batch_share for p in plan.pipelines[:pi]), global_batch=plan.global_batch_size,
        prev_layout=layout(si - 1, -1) if si > 0 else None,
        next_layout=layout(si + 1, 0) if si + 1 < n else None,
    )


class ChunkedRunner:
    """This rank's v chunks of an interleaved pipeline, run in the order of its slots of the table."""

    def __init__(self, chunks: list[StageRunner], slots: list, mailbox: Mailbox) -> None:
        self.chunks, self.slots, self.mailbox = chunks, slots, mailbox

    @property
    def loss(self):
        """The loss splitter (every chunk holds the same kind)."""
        return self.chunks[0].loss

    @property
    def spec(self) -> StageSpec:
        """The first chunk's spec: its pipeline, and its stage index, which is the physical stage's."""
        return self.chunks[0].spec

    def run(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One step of the interleaved schedule; returns this rank's weighted loss sum."""
        return run_slots(self.chunks, self.slots, self.mailbox, inputs, targets)

    def run_forward(self, inputs: torch.Tensor, targets: torch.Tensor | None) -> None:
        """Forward-only calls are not built for interleaved tables: refused, the same on every rank."""
        raise AutoparError("eval_step / predict", "forward-only calls on an interleaved pipeline are not supported",
                           "evaluate under a 1f1b or gpipe plan: pm.save(dir) here, then wrap that plan and pm.load(dir)")


def build_runner(rank: int, plan: Plan, pi: int, chunk_ids: list[int], units: list[LocalUnit], mailbox: Mailbox,
                 loss_fn: Callable, logits_sharded: bool, boundary_check: BoundaryCheck | None = None,
                 ) -> StageRunner | ChunkedRunner:
    """The runner of this rank's chunks (``units``: theirs, in chunk order): a ``StageRunner`` for one
    chunk, else a ``ChunkedRunner`` over the interleaved table."""
    pipe = plan.pipelines[pi]
    if len(chunk_ids) == 1:
        return StageRunner(rank, units, chunk_spec(plan, pi, chunk_ids[0]), plan.schedule, mailbox, loss_fn,
                           logits_sharded, boundary_check)
    runners, at = [], 0
    for si in chunk_ids:
        n = len(pipe.stages[si].layers)
        last = si == len(pipe.stages) - 1
        runners.append(StageRunner(rank, units[at:at + n], chunk_spec(plan, pi, si), plan.schedule, mailbox, loss_fn,
                                   logits_sharded and last, boundary_check, slots=[]))
        at += n
    slots = stage_slots(plan.schedule, pipe.num_stages, chunk_ids[0], pipe.num_microbatches, pipe.virtual_stages)
    return ChunkedRunner(runners, slots, mailbox)
