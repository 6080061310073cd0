"""Where a unit's data and parameters sit inside a stage: pure arithmetic over the plan, no torch.distributed.

Every rank evaluates these functions on the whole plan and gets the same answers, which is what lets
all ranks create the same process groups in the same order and route pipeline messages without
asking each other.

Conventions (autopar/plan/schema.py): a unit with TP degree t on a stage with devices D has TP
groups ``D[i*t:(i+1)*t]`` (chunk i = data-parallel rank i, which holds rows ``i*mbs/dp ...`` of each
micro-batch, replicated over the chunk) and dp = len(D) / t. Inside a TP group the *TP coordinate*
of a device is its index in the sorted chunk (process groups order their members by rank, and a
DTensor mesh must agree with that order); devices with the same TP coordinate hold the same shard
and form the unit's DP group in the stage (the plan's strided slices when D is increasing).

With context parallel degree c (autopar/plan/cp_rules.py) the TP groups stay the chunks of t devices;
t * c consecutive devices form data replica i (rows of replica i, dp = len(D) / (t * c)), whose TP
groups are its CP indices 0..c-1, each holding its own part of every sequence. The DP group above then
spans dp x cp devices (gradient sync and ZeRO shards over both); the CP group of a device is the
devices of its replica at its TP coordinate.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.plan.schema import Plan, Strategy


@dataclass(frozen=True)
class Layout:
    """One unit's activation layout on a stage: devices in plan order and the TP degree."""

    devices: tuple[int, ...]
    tp: int
    cp: int = 1

    @property
    def dp(self) -> int:
        """Data replicas (each holds its own rows of a micro-batch)."""
        return len(self.devices) // (self.tp * self.cp)

    def chunk(self, i: int) -> tuple[int, ...]:
        """Devices of TP group / data chunk ``i`` (plan order)."""
        return self.devices[i * self.tp:(i + 1) * self.tp]

    def chunk_of(self, rank: int) -> int:
        return self.devices.index(rank) // self.tp

    def rows(self, i: int, mbs: int) -> tuple[int, int]:
        """Rows [lo, hi) of a micro-batch of ``mbs`` samples that chunk ``i`` processes."""
        n = mbs // self.dp
        return i * n, (i + 1) * n

    def my_rows(self, rank: int, mbs: int) -> tuple[int, int]:
        return self.rows(self.chunk_of(rank) // self.cp, mbs)

    def cp_index(self, rank: int) -> int:
        """Which part of each sequence ``rank`` holds (0 without context parallel)."""
        return self.chunk_of(rank) % self.cp

    def cp_group(self, rank: int) -> tuple[int, ...]:
        """Sorted devices of ``rank``'s replica at its TP coordinate: its context-parallel group."""
        j, first = self.tp_coord(rank), self.chunk_of(rank) // self.cp * self.cp
        return tuple(sorted(sorted(self.chunk(first + i))[j] for i in range(self.cp)))

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """Sorted TP group of ``rank`` (the process-group member order)."""
        return tuple(sorted(self.chunk(self.chunk_of(rank))))

    def tp_coord(self, rank: int) -> int:
        return self.tp_group(rank).index(rank)

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """Devices of the stage holding the same TP shard as ``rank`` (sorted; dp x cp of them)."""
        j = self.tp_coord(rank)
        return tuple(sorted(sorted(self.chunk(i))[j] for i in range(self.dp * self.cp)))

    def fsdp_grid(self) -> list[list[int]] | None:
        """Rows = sorted TP groups ordered by first member; None when no row order makes every column
        increasing (then no 2-D DeviceMesh can match the sorted process groups)."""
        rows = sorted((sorted(self.chunk(i)) for i in range(self.dp * self.cp)), key=lambda r: r[0])
        for j in range(self.tp):
            col = [r[j] for r in rows]
            if col != sorted(col):
                return None
        return rows

    def fsdp_coord(self, rank: int) -> int:
        """Row index of ``rank`` in ``fsdp_grid`` (its shard index along the FSDP dimension)."""
        grid = self.fsdp_grid()
        assert grid is not None
        return next(i for i, row in enumerate(grid) if rank in row)


@dataclass(frozen=True)
class Placement:
    """One place a unit runs: (pipeline, stage), the stage's devices and the unit's strategy."""

    pipeline: int
    stage: int
    devices: tuple[int, ...]
    strategy: Strategy

    @property
    def layout(self) -> Layout:
        return Layout(self.devices, self.strategy.tp, self.strategy.cp)

    @property
    def fsdp(self) -> bool:
        """ZeRO-3 with something to shard over (dp x cp > 1); ZeRO-3 on dp x cp = 1 is plain replication."""
        return self.strategy.zero == 3 and self.layout.dp * self.layout.cp > 1

    @property
    def zero(self) -> int:
        """Effective ZeRO stage: 0 when dp x cp = 1 (nothing to shard)."""
        return self.strategy.zero if self.layout.dp * self.layout.cp > 1 else 0


def placements(plan: Plan) -> dict[str, list[Placement]]:
    """Unit name -> every place it runs, in pipeline order."""
    out: dict[str, list[Placement]] = {}
    for pi, pipe in enumerate(plan.pipelines):
        for si, st in enumerate(pipe.stages):
            for ly in st.layers:
                out.setdefault(ly.name, []).append(Placement(pi, si, tuple(st.devices), ly.strategy))
    return out


@dataclass(frozen=True)
class Transfer:
    """Rows [lo, hi) of a micro-batch go from ``src`` to ``dst`` (global ranks; src == dst: local copy)."""

    src: int
    dst: int
    lo: int
    hi: int


def route(src: Layout, dst: Layout, mbs: int) -> tuple[Transfer, ...]:
    """Transfers that give every device of ``dst`` its rows of a micro-batch from ``src``'s holders.

    Each destination receives each of its rows exactly once: from itself when it already holds
    them, else from the member of the holding TP group at the same position (spreads the load).
    Used forward (activations) and, with the layouts swapped, backward (gradients): every member
    of a TP group then gets the full gradient of its rows, as DTensor's replicated inputs expect.
    With context parallel both layouts have the same cp (one cp per pipeline: cp_rules), and a
    destination receives its rows' part of the sequence from a holder at its own CP index.
    """
    if src.cp != dst.cp:
        raise ValueError(f"cp changes from {src.cp} to {dst.cp} between units (refused by the plan rules)")
    out = []
    for q_pos, q in enumerate(dst.devices):
        lo, hi = dst.rows(q_pos // (dst.tp * dst.cp), mbs)
        ci = (q_pos // dst.tp) % dst.cp
        for c in range(src.dp):
            slo, shi = src.rows(c, mbs)
            a, b = max(lo, slo), min(hi, shi)
            if a >= b:
                continue
            holders = src.chunk(c * src.cp + ci)
            sender = q if q in holders else holders[q_pos % src.tp]
            out.append(Transfer(sender, q, a, b))
    return tuple(out)
