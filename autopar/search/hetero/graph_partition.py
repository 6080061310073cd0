"""Hierarchical partition of the device graph: devices into pipelines, each pipeline into ordered stages.

Level 1, pipelines (data-parallel replicas): balanced in compute. Their gradient all-reduce crosses
the cut between them, so the cut should run along *fast* links: METIS minimises the cut weight, and
the weight of an edge is its slowness (fastest bandwidth / its bandwidth). The opposite cut (weight =
bandwidth: pipelines keep whole fast islands, like one GPU type per pipeline) is offered too, and the
cost model judges. Without pymetis (or when METIS refuses a tiny graph) a greedy balanced-compute
assignment makes the same two cuts (``_greedy``): networkx's bisections balance vertex counts, not compute.

Level 2, stages: a pipeline's devices on one node form a piece; a stage is a piece or an equal chunk
of one, so every stage sits inside one machine and TP groups (level 3, chosen per layer by the
frontier DP as consecutive chunks of the stage) stay on the node fabric. Stages are ordered along
fast links, memory-rich first (1F1B's first stage holds the most micro-batches in flight).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

from autopar.cluster.cluster import Cluster

Devices = tuple[int, ...]
Shape = tuple[tuple[Devices, ...], ...]  # pipelines -> ordered stages -> devices


def canonical(shape: Shape) -> Shape:
    """The same shape with its pipelines in a fixed order (pipeline order does not change the cost)."""
    return tuple(sorted(shape, key=lambda p: min(min(s) for s in p)))


def pieces(cluster: Cluster, devices) -> list[Devices]:
    """The devices grouped by node, in node order."""
    by_node: dict[int, list[int]] = {}
    for d in sorted(devices):
        by_node.setdefault(cluster.node_of(d), []).append(d)
    return [tuple(v) for _, v in sorted(by_node.items())]


def chunk(piece: Devices, size: int) -> list[Devices]:
    """``piece`` cut into consecutive chunks of ``size`` devices (the whole piece if size does not divide it)."""
    if size <= 0 or len(piece) % size:
        return [piece]
    return [piece[i:i + size] for i in range(0, len(piece), size)]


def stage_split(cluster: Cluster, devices, parts_per_piece: int | dict[str, int] = 1) -> list[Devices]:
    """Stages of one pipeline: each of its node pieces cut into equal chunks, ``parts_per_piece`` of
    them (or per GPU type name, when a dict)."""
    out: list[Devices] = []
    for pc in pieces(cluster, devices):
        n = parts_per_piece if isinstance(parts_per_piece, int) else parts_per_piece.get(cluster.gpu_of(pc[0]).name, 1)
        n = n if len(pc) % n == 0 else 1
        out.extend(chunk(pc, len(pc) // n))
    return out


def _link_bw(cluster: Cluster, a: Devices, b: Devices) -> float:
    return min(cluster.link(x, y)[0] for x in a[:1] for y in b[:1]) if a and b else 0.0


def order_stages(cluster: Cluster, stages: list[Devices]) -> tuple[Devices, ...]:
    """A path through the stages along fast links, starting memory-rich (then fast).

    Greedy: start from the stage with the most memory per device (ties: fastest, then lowest id);
    append the stage with the fastest link to the last one (ties: more memory, faster, lower id).
    """
    if not stages:
        return ()

    def rank(s: Devices):
        g = cluster.gpu_of(s[0])
        return (-min(cluster.gpu_of(d).usable_memory_gib for d in s), -g.tflops, s[0])

    left = sorted(stages, key=rank)
    path = [left.pop(0)]
    while left:
        last = path[-1]
        nxt = min(left, key=lambda s: (-_link_bw(cluster, last, s), rank(s)))
        left.remove(nxt)
        path.append(nxt)
    return tuple(path)


# -- level 1: pipelines ---------------------------------------------------------------------------
def _chunks_for(cluster: Cluster, parts: int) -> list[Devices]:
    """Vertices of the pipeline-level graph: node chunks small enough to give every part a share."""
    out: list[Devices] = []
    for n in range(cluster.num_nodes):
        devs = tuple(cluster.node_devices(n))
        size = math.gcd(len(devs), max(1, len(devs) // max(1, parts)))
        out.extend(chunk(devs, max(1, size)))
    return out


def _edge_weights(cluster: Cluster, chunks: list[Devices], cut: str) -> dict[tuple[int, int], int]:
    bws = {(i, j): cluster.link(chunks[i][0], chunks[j][0])[0] for i in range(len(chunks))
           for j in range(i + 1, len(chunks))}
    if not bws:
        return {}
    lo, hi = min(bws.values()), max(bws.values())
    if cut == "fast":  # cutting a slow link is expensive: keep slow links inside pipelines
        return {e: max(1, round(100 * hi / bw)) for e, bw in bws.items()}
    return {e: max(1, round(100 * bw / lo)) for e, bw in bws.items()}


def _pymetis():
    """The pymetis module, or None when it is not installed (the greedy cut runs instead)."""
    try:
        import pymetis  # optional dependency: imported where used, so its absence is found per search
    except ImportError:
        return None
    return pymetis


def _metis(pymetis, nparts: int, n: int, weights: dict[tuple[int, int], int], vweights: list[int]
           ) -> list[int] | None:
    adj: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for (i, j), w in weights.items():
        adj[i].append((j, w))
        adj[j].append((i, w))
    xadj, adjncy, ew = [0], [], []
    for row in adj:
        for j, w in row:
            adjncy.append(j)
            ew.append(w)
        xadj.append(len(adjncy))
    try:
        if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
            graph = {"adjacency": pymetis.CSRAdjacency(xadj, adjncy)}
        else:
            graph = {"xadj": xadj, "adjncy": adjncy}
        _, parts = pymetis.part_graph(nparts, vweights=vweights, eweights=ew, **graph)
    except Exception:  # METIS refuses some tiny or degenerate graphs; the greedy cut covers them
        return None
    return list(parts)


METIS, NO_PYMETIS, METIS_REFUSED = "metis", "pymetis not installed", "METIS refused the graph"


def describe_partitioner(cuts: Counter) -> str:
    """Which partitioner made the pipeline groupings counted in ``cuts``, in words for the plan file.

    ``metis``; ``greedy (pymetis not installed)``; ``greedy (METIS refused every graph)``;
    ``metis (greedy for k of n graphs METIS refused)``; or ``none`` when no grouping needed a cut.
    """
    metis, refused = cuts[METIS], cuts[METIS_REFUSED]
    if cuts[NO_PYMETIS]:
        return f"greedy ({NO_PYMETIS})"
    if refused:
        return f"metis (greedy for {refused} of {metis + refused} graphs METIS refused)" if metis else \
            "greedy (METIS refused every graph)"
    return "metis" if metis else "none (no pipeline grouping needed a graph cut)"


def _greedy(nparts: int, chunks: list[Devices], vweights: list[int], cut: str) -> list[int]:
    """Balanced-compute assignment without METIS: chunks by decreasing compute to the lightest part.

    ``fast`` cut: chunks of one node go to different parts in turn (the cut runs inside nodes);
    ``slow`` cut: whole nodes first (chunks arrive node by node, so a node's chunks stay together
    until its part is full).
    """
    load = [0] * nparts
    out = [0] * len(chunks)
    order = sorted(range(len(chunks)), key=lambda i: (-vweights[i], i)) if cut == "fast" else range(len(chunks))
    for i in order:
        j = min(range(nparts), key=lambda p: (load[p], p))
        out[i] = j
        load[j] += vweights[i]
    return out


def pipeline_groups(cluster: Cluster, parts: int, cuts: Counter | None = None) -> list[list[list[int]]]:
    """Candidate groupings of all devices into ``parts`` pipelines (distinct, none empty).

    ``cuts``, when given, counts the graph cuts made by partitioner (``METIS``, ``NO_PYMETIS``,
    ``METIS_REFUSED``; the last two ran the greedy cut): ``describe_partitioner`` words it.
    """
    cuts = Counter() if cuts is None else cuts
    if parts == 1:
        return [[list(range(cluster.num_devices))]]
    found: list[list[list[int]]] = []
    seen: set = set()

    def add(groups: list[list[int]]) -> None:
        groups = [sorted(g) for g in groups if g]
        if len(groups) != parts:
            return
        key = frozenset(frozenset(g) for g in groups)
        if key not in seen:
            seen.add(key)
            found.append(groups)

    # Node slicing: pipeline j takes slice j of every node (when parts divides every node).
    if all(nd.count % parts == 0 for nd in cluster.nodes):
        add([[d for n in range(cluster.num_nodes) for d in chunk(tuple(cluster.node_devices(n)),
                                                                 cluster.nodes[n].count // parts)[j]]
             for j in range(parts)])
    chunks = _chunks_for(cluster, parts)
    if len(chunks) >= parts:
        vw = [max(1, round(sum(cluster.gpu_of(d).tflops for d in c))) for c in chunks]
        pymetis = _pymetis()
        for cut in ("fast", "slow"):
            w = _edge_weights(cluster, chunks, cut)
            assign = _metis(pymetis, parts, len(chunks), w, vw) if pymetis is not None else None
            cuts[METIS if assign else NO_PYMETIS if pymetis is None else METIS_REFUSED] += 1
            assign = assign or _greedy(parts, chunks, vw, cut)
            add([[d for i, c in enumerate(chunks) if assign[i] == j for d in c] for j in range(parts)])
    return found


MAX_TYPE_VARIANTS = 16  # one-pipeline starts with 1 or 2 stages per piece chosen per GPU type


def initial_shapes(cluster: Cluster, max_pipelines: int, max_stages: int, cuts: Counter | None = None
                   ) -> list[Shape]:
    """Start points of the local search: each pipeline grouping with one or two stages per node piece.

    A single pipeline also gets every per-GPU-type mix of one or two stages per piece (up to
    MAX_TYPE_VARIANTS): slow and fast types often want different stage sizes. ``cuts`` as in
    ``pipeline_groups``.
    """
    shapes: list[Shape] = []
    seen: set = set()
    types = [g.name for g in cluster.gpu_types]
    mixes: list = [1, 2]
    if 2 ** len(types) <= MAX_TYPE_VARIANTS:
        mixes += [dict(zip(types, f)) for f in itertools.product((1, 2), repeat=len(types)) if len(set(f)) > 1]
    for parts in range(1, max_pipelines + 1):
        for groups in pipeline_groups(cluster, parts, cuts):
            for per_piece in mixes if parts == 1 else (1, 2):
                shape = canonical(tuple(order_stages(cluster, stage_split(cluster, g, per_piece)) for g in groups))
                if any(len(p) > max_stages for p in shape) or shape in seen:
                    continue
                seen.add(shape)
                shapes.append(shape)
    return shapes
