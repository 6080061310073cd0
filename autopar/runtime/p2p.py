"""Moving micro-batch rows between layouts: inside a stage (TP degree changes) and between stages.

Hand-written point-to-point rather than ``torch.distributed.pipelining.PipelineStage``, which needs
the same group layout on every stage and one sender per receiver: here a stage with TP 2 may feed a
single-rank stage, stages of one pipeline may have different sizes, and a unit's rows may come from
several senders.

Every exchange goes out as one ``batch_isend_irecv``: the sends of the action just finished and the
receives of the next action travel together (Megatron's ``send_forward_recv_backward`` pattern), so
two neighbours that both send and receive never wait on each other's order (NCCL would hang on
unbatched crossed sends; gloo would not, but the same code runs on both). Stage-boundary messages
carry a tag unique within the step; the first micro-batch of each step also sends a small header
(dtype and shape), which the receiver caches for the later micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from autopar.runtime.layout import Layout, Transfer, route

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
           torch.uint8, torch.int8, torch.int16]
_HEADER = 10  # dtype code, ndim, up to 8 dims


@dataclass(frozen=True)
class Exchange:
    """This rank's part of moving one micro-batch's rows from layout ``src`` to layout ``dst``."""

    rank: int
    transfers: tuple[Transfer, ...]
    src_lo: int  # first micro-batch row this rank holds in the source layout (when it is a source)
    dst_rows: tuple[int, int] | None  # rows this rank holds afterwards (None: not in dst)

    @classmethod
    def between(cls, src: Layout, dst: Layout, mbs: int, rank: int) -> Exchange:
        mine = tuple(t for t in route(src, dst, mbs) if rank in (t.src, t.dst))
        src_lo = src.my_rows(rank, mbs)[0] if rank in src.devices else 0
        dst_rows = dst.my_rows(rank, mbs) if rank in dst.devices else None
        return cls(rank, mine, src_lo, dst_rows)

    @property
    def sends(self) -> tuple[Transfer, ...]:
        return tuple(t for t in self.transfers if t.src == self.rank and t.dst != self.rank)

    @property
    def recvs(self) -> tuple[Transfer, ...]:
        return tuple(sorted((t for t in self.transfers if t.dst == self.rank), key=lambda t: t.lo))

    @property
    def is_local(self) -> bool:
        """True when no rows cross ranks for this rank (pure slicing)."""
        return all(t.src == t.dst for t in self.transfers)


@dataclass
class Send:
    x: torch.Tensor  # this rank's rows in the source layout
    ex: Exchange
    tag: int
    header: bool = False  # first micro-batch of a step across a stage boundary


@dataclass
class Recv:
    ex: Exchange
    tag: int
    like: torch.Tensor | None = None  # a tensor of the incoming trailing shape / dtype
    local: torch.Tensor | None = None  # this rank's own source rows (inside a stage)
    cache_key: tuple | None = None  # where the header's (shape, dtype) is cached; None: use ``like``


def _header(x: torch.Tensor) -> torch.Tensor:
    h = torch.zeros(_HEADER, dtype=torch.int64)
    h[0], h[1] = _DTYPES.index(x.dtype), x.dim()
    h[2:2 + x.dim()] = torch.tensor(x.shape, dtype=torch.int64)
    return h.to(x.device)


class Mailbox:
    """Posts batched exchanges; keeps sends alive until ``flush`` (end of step); caches header shapes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pending: list[tuple[dist.Work, list[torch.Tensor]]] = []
        self.shapes: dict[tuple, tuple[tuple[int, ...], torch.dtype]] = {}

    def flush(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()

    def _issue(self, ops: list[dist.P2POp]) -> list[dist.Work]:
        return dist.batch_isend_irecv(ops) if ops else []

    def post(self, sends: list[Send], recvs: list[Recv], wait_sends: bool = False) -> list[torch.Tensor | None]:
        """Send ``sends`` and receive ``recvs`` together; return each Recv's rows (None: nothing for this rank)."""
        ops, keep = [], []
        for s in sends:
            for t in s.ex.sends:
                piece = s.x[t.lo - s.ex.src_lo:t.hi - s.ex.src_lo].contiguous()
                if s.header:
                    h = _header(piece)
                    ops.append(dist.P2POp(dist.isend, h, t.dst, tag=2 * s.tag))
                    keep.append(h)
                ops.append(dist.P2POp(dist.isend, piece, t.dst, tag=2 * s.tag + 1))
                keep.append(piece)
        n_send = len(ops)
        heads = []
        for r in recvs:
            if r.cache_key is not None and r.cache_key not in self.shapes:
                for t in r.ex.recvs:
                    if t.src != r.ex.rank:
                        h = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                        ops.append(dist.P2POp(dist.irecv, h, t.src, tag=2 * r.tag))
                        heads.append((r, h))
        send_works: list = []
        if heads:  # header round: learn the shapes before allocating the payload buffers
            works = self._issue(ops)
            send_works, head_works = self._split(works, n_send, ops)
            for w in head_works:
                w.wait()
            for r, h in heads:
                h = h.cpu()
                self.shapes[r.cache_key] = (tuple(h[3:2 + int(h[1])].tolist()), _DTYPES[int(h[0])])
            ops, n_send = [], 0
        bufs: list[dict[int, torch.Tensor]] = []
        for r in recvs:
            trailing, dtype = (self.shapes[r.cache_key] if r.cache_key is not None
                               else (tuple(r.like.shape[1:]), r.like.dtype))
            b = {}
            for t in r.ex.recvs:
                if t.src != r.ex.rank:
                    b[t.src] = torch.empty((t.hi - t.lo, *trailing), dtype=dtype, device=self.device)
                    ops.append(dist.P2POp(dist.irecv, b[t.src], t.src, tag=2 * r.tag + 1))
            bufs.append(b)
        works = self._issue(ops)
        more_sends, recv_works = self._split(works, n_send, ops)
        send_works += more_sends
        for w in recv_works:
            w.wait()
        for w in send_works:
            if wait_sends:
                w.wait()
            else:
                self.pending.append((w, keep))
        out = []
        for r, b in zip(recvs, bufs):
            pieces = [b[t.src] if t.src != r.ex.rank else r.local[t.lo - r.ex.src_lo:t.hi - r.ex.src_lo]
                      for t in r.ex.recvs]
            out.append(None if not pieces else pieces[0] if len(pieces) == 1 else torch.cat(pieces))
        return out

    @staticmethod
    def _split(works: list, n_send: int, ops: list) -> tuple[list, list]:
        """(send works, receive works); a backend that coalesces returns one work for the whole batch."""
        if len(works) == len(ops):
            return works[:n_send], works[n_send:]
        return [], works


class _Reshard(torch.autograd.Function):
    """Rows of one stage re-spread for a different TP degree; backward re-spreads the gradient back."""

    @staticmethod
    def forward(ctx, x, mailbox: Mailbox, fwd: Exchange, bwd: Exchange, tag: int):
        ctx.mailbox, ctx.bwd, ctx.tag = mailbox, bwd, tag
        return _move(x, mailbox, fwd, 2 * tag)

    @staticmethod
    def backward(ctx, g):
        return _move(g.contiguous(), ctx.mailbox, ctx.bwd, 2 * ctx.tag + 1), None, None, None, None


def _move(x: torch.Tensor, mailbox: Mailbox, ex: Exchange, tag: int) -> torch.Tensor:
    return mailbox.post([Send(x, ex, tag)], [Recv(ex, tag, like=x, local=x)], wait_sends=True)[0]


def reshard(x: torch.Tensor, mailbox: Mailbox, fwd: Exchange, bwd: Exchange, tag: int) -> torch.Tensor:
    """Differentiable move of ``x`` from one in-stage layout to another (see ``Exchange``)."""
    if fwd.is_local and bwd.is_local:
        lo, hi = fwd.dst_rows
        return x[lo - fwd.src_lo:hi - fwd.src_lo]
    if not x.requires_grad:
        return _move(x, mailbox, fwd, 2 * tag)
    return _Reshard.apply(x, mailbox, fwd, bwd, tag)
