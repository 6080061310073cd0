"""Layers to the stages of one asymmetric pipeline: per-stage tables, then the exact partition DP.

Each stage has its own StageContext (its GPU type, size, links and memory), so a stage table
``C[a, b]``, the least per-micro-batch cost of layers a..b-1 on that stage with the best per-layer
(tp, zero, ckpt, sp) under *that* stage's memory, comes from the same frontier DP and ``layer_costs``
as the homogeneous search. ``best_partition`` then splits the layers for the given tables, exactly
under the closed form: the slowest stage gets fewer layers, the small-memory stage only what fits.
The split is then priced as ``estimate_plan`` prices a pipeline (``estimate_pipeline``: its schedule
table simulated), and that is the time the splits and micro-batch sizes are compared by.

Tables are cached by stage *kind* (GPU types, devices per node, links, memory budget): stages on
equal nodes share them. ``buckets`` thins the frontiers for fast screening: points whose memory falls
in the same (layout, memory bucket) keep only the fastest. Every kept point is a real assignment with
its true memory, so a thinned table is never optimistic (its plans are real and fit); with
``buckets=None`` the tables are exact.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from autopar.cluster.cluster import Cluster
from autopar.estimate import CostCache, StageContext, device_budget_bytes, stage_link
from autopar.estimate.pipeline import estimate_pipeline
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Pipeline, Stage, StageLayer
from autopar.search.frontier import Frontier, RangeTrie, pareto_by_group
from autopar.search.hetero.candidates import candidates_at, score_kind
from autopar.search.homogeneous import layer_signatures
from autopar.search.options import SearchOptions
from autopar.search.partition import best_partition, minmax_partition
from cost_models.memory import inflight_microbatches
from cost_models.pipeline import boundary_p2p_time

Devices = tuple[int, ...]


class ThinTrie(RangeTrie):
    """RangeTrie whose frontiers keep one point per (layout, memory bucket): fast, never optimistic."""

    def __init__(self, candidates, switch, inflight: int, mem_cap: float, buckets: int):
        super().__init__(candidates, switch, inflight, mem_cap)
        self.bucket_bytes = max(mem_cap, 1.0) / buckets

    def _extend(self, parent: int, sig: int) -> int:
        cand = self.candidates[sig]
        c, m, lay = cand.costs.cost, self._mem[sig], cand.layouts
        if parent < 0:
            new_m, new_t, new_l, new_s = m.copy(), c.copy(), lay.copy(), cand.costs.step.copy()
            pp, st = np.full(len(c), -1), np.arange(len(c))
        else:
            pf = self.nodes[parent]
            sw = self.switch[pf.sig][pf.layout][:, lay]
            new_t = (pf.time[:, None] + (c[None, :] + sw)).ravel()
            new_m = (pf.mem[:, None] + m[None, :]).ravel()
            new_s = (pf.step[:, None] + cand.costs.step[None, :]).ravel()
            P, S = len(pf.time), len(c)
            pp, st, new_l = np.repeat(np.arange(P), S), np.tile(np.arange(S), P), np.tile(lay, P)
        self.points_examined += len(new_t)
        ok = np.flatnonzero(new_m <= self.mem_cap)
        if len(ok):
            key = new_l[ok].astype(np.int64) * (1 << 32) + np.floor(new_m[ok] / self.bucket_bytes).astype(np.int64)
            order = np.lexsort((new_t[ok], key))
            first = np.r_[True, key[order][1:] != key[order][:-1]]
            ok = ok[order[first]]
        new_m, new_t, new_l, pp, st, new_s = new_m[ok], new_t[ok], new_l[ok], pp[ok], st[ok], new_s[ok]
        keep = pareto_by_group(new_l, new_m, new_t)
        self.nodes.append(Frontier(new_m[keep], new_t[keep], new_l[keep], pp[keep], st[keep], parent, sig,
                                   new_s[keep]))
        return len(self.nodes) - 1


@dataclass
class StageTable:
    C: np.ndarray  # (L+1, L+1): least cost per micro-batch of layers a..b-1; inf where nothing fits
    S: np.ndarray  # (L+1, L+1): the step tail of C's strategies (0 where nothing fits)
    trie: RangeTrie
    node_of: dict
    cands: dict
    room: float  # bytes for states + activations (budget - reserve)
    transient: list[float]


@dataclass
class PipelineSplit:
    """One pipeline with its layers placed: what ``best_partition`` chose for given stages and batching."""

    stages: list[Devices]
    micro_batch_size: int
    num_microbatches: int
    time: float  # the pipeline's step time as ``estimate_pipeline`` gives it (its schedule simulated)
    bounds: list[int]
    layers: list[list[StageLayer]] = field(default_factory=list)
    key: tuple = ()  # equal for pipelines of equal kinds, links and batching (same split, same rate)

    @property
    def share(self) -> int:
        return self.micro_batch_size * self.num_microbatches

    def plan_stages(self) -> list[Stage]:
        return [Stage(list(d), list(ls)) for d, ls in zip(self.stages, self.layers)]


def role(i: int, p: int) -> str:
    """Which layer ranges stage i of p can hold: the first stage starts at layer 0, the last ends at L."""
    if p == 1:
        return "only"
    return "first" if i == 0 else "last" if i == p - 1 else "middle"


class LayerSplitter:
    """Stage tables (cached by kind) and the per-pipeline layer split for one model and cluster."""

    def __init__(self, model: ModelSpec, cluster: Cluster, opts: SearchOptions, buckets: int | None = None):
        self.model, self.cluster, self.opts, self.buckets = model, cluster, opts, buckets
        self.sigs = layer_signatures(model)
        self.sig_layer = {s: model.layers[i] for i, s in enumerate(self.sigs)}
        self.L = model.num_layers
        self.bb = np.array([0.0] + [ly.boundary_bytes for ly in model.layers])
        self.pruned: Counter = Counter()
        self._cands: dict = {}
        self._kind_batches: dict = {}
        self._tables: dict = {}
        self._kinds: dict = {}
        self._needs: dict = {}
        self._least: dict = {}
        self._splits: dict = {}
        self._best: dict = {}
        self.builds = 0
        self.candidates = 0
        self.costs = CostCache()  # per-layer costs of the splits priced

    # -- stage kinds and tables ----------------------------------------------------------------
    def kind(self, devices: Devices) -> tuple:
        """Everything a stage's costs depend on besides batching: equal kinds have equal tables."""
        hit = self._kinds.get(devices)
        if hit is not None:
            return hit
        c = self.cluster
        nodes: list[int] = []
        for d in devices:
            if not nodes or nodes[-1] != c.node_of(d):
                nodes.append(c.node_of(d))
        per_node = tuple((c.nodes[n].gpu, sum(1 for d in devices if c.node_of(d) == n), c.nodes[n].intra_bw,
                          c.nodes[n].intra_lat_us) for n in nodes)
        links = tuple(c.node_link(a, b) for a in nodes for b in nodes if a != b)
        budget = min(device_budget_bytes(c, d, self.opts.memory_budget_gib) for d in devices)
        key = (per_node, tuple(nodes.count(n) for n in nodes), links, budget)
        self._kinds[devices] = key
        return key

    def _candidates(self, devices: Devices, mbs: int, m: int):
        """(context, candidates per signature, switch costs) of a stage kind at (mbs, m)."""
        key = (self.kind(devices), mbs, m)
        hit = self._cands.get(key)
        if hit is None:
            kb_key = key[:2]
            kb = self._kind_batches.get(kb_key)
            if kb is None:
                ctx = StageContext(self.cluster, tuple(devices), mbs, 1, self.opts.params)
                kb = score_kind(self.sig_layer, ctx, self.pruned, self.opts.max_tp)
                self._kind_batches[kb_key] = kb
            cands = candidates_at(kb, m, self.opts.prune_dominated, self.pruned)
            hit = (kb.ctx, cands, kb.switch)
            self._cands[key] = hit
        return hit

    def least_costs(self, devices: Devices, mbs: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, its cheapest strategy's cost on this stage and that strategy's step tail (memory
        ignored; inf and 0 if none is legal)."""
        key = (self.kind(devices), mbs, m)
        hit = self._least.get(key)
        if hit is None:
            _, cands, _ = self._candidates(devices, mbs, m)
            arg = {s: int(np.argmin(c.costs.cost)) for s, c in cands.items() if len(c.strategies)}
            hit = (np.array([float(cands[s].costs.cost[arg[s]]) if s in arg else np.inf for s in self.sigs]),
                   np.array([float(cands[s].costs.step[arg[s]]) if s in arg else 0.0 for s in self.sigs]))
            self._least[key] = hit
        return hit

    def table(self, devices: Devices, mbs: int, m: int, k: int, role: str = "any") -> StageTable:
        """The table of a stage of this kind; ``role`` limits the ranges to those its position can hold.

        first: ranges from layer 0; last: ranges to the last layer; middle: neither end; only: the
        whole model; any: every range. The trie then builds only the frontiers those ranges need.
        """
        key = (self.kind(devices), mbs, m, k, role)
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        ctx, cands, switch = self._candidates(devices, mbs, m)
        reserve = self.opts.params.reserve_bytes
        room = min(device_budget_bytes(self.cluster, d, self.opts.memory_budget_gib) for d in devices) - reserve
        if self.buckets:
            trie: RangeTrie = ThinTrie(cands, switch, k, room, self.buckets)
        else:
            trie = RangeTrie(cands, switch, k, room)
        L = self.L
        transient = [cands[s].transient for s in self.sigs]
        C = np.full((L + 1, L + 1), np.inf)
        S = np.zeros((L + 1, L + 1))
        node_of: dict = {}
        memo: dict = {}
        a_range = {"first": range(1), "only": range(1), "middle": range(1, L)}.get(role, range(L))
        b_top = L - 1 if role in ("first", "middle") else L
        for a in a_range:
            node, tmax = -1, 0.0
            for b in range(a + 1, L + 1):
                if b > b_top:
                    break
                node = trie.child(node, self.sigs[b - 1])
                tmax = max(tmax, transient[b - 1])
                if role in ("last", "only") and b < L:
                    continue
                if node not in memo:
                    memo[node] = trie.best(node, room - tmax)
                C[a, b] = memo[node][0]
                S[a, b] = trie.step(node, memo[node][1])
                node_of[(a, b)] = node
        self.builds += 1
        self.candidates += trie.points_examined
        tab = StageTable(C, S, trie, node_of, cands, room, transient)
        self._tables[key] = tab
        return tab

    # -- one pipeline --------------------------------------------------------------------------
    def p2p_costs(self, stages: list[Devices], mbs: int) -> list[np.ndarray]:
        """P_i[b]: both directions of stage i's boundary send when it ends at layer b (0 for the last)."""
        out = []
        for i in range(len(stages)):
            Pi = np.zeros(self.L + 1)
            if i + 1 < len(stages):
                bw, lat = stage_link(self.cluster, list(stages[i]), list(stages[i + 1]))
                Pi = 2.0 * boundary_p2p_time(self.bb, mbs, bw, lat)
                Pi[0] = 0.0
            out.append(Pi)
        return out

    def _need(self, devices: Devices, mbs: int, m: int, k: int, role_: str) -> np.ndarray:
        """need[a, b] / room: a lower bound on the memory share layers a..b-1 take on this stage.

        Each layer's least-memory strategy plus the largest transient: no assignment needs less,
        so a partition this bound rules out cannot fit (no trie needed: cheap).
        """
        key = (self.kind(devices), mbs, m, k, role_)
        hit = self._needs.get(key)
        if hit is not None:
            return hit
        ctx, cands, _ = self._candidates(devices, mbs, m)
        L = self.L
        least = np.array([float(cands[s].costs.mem(k).min()) if len(cands[s].strategies) else np.inf
                          for s in self.sigs])
        trans = np.array([cands[s].transient for s in self.sigs])
        room = min(device_budget_bytes(self.cluster, d, self.opts.memory_budget_gib) for d in devices) \
            - self.opts.params.reserve_bytes
        cs = np.r_[0.0, np.cumsum(least)]
        need = np.full((L + 1, L + 1), np.inf)
        for a in range(L):
            tmax = np.maximum.accumulate(trans[a:])
            need[a, a + 1:] = (cs[a + 1:] - cs[a] + tmax) / max(room, 1.0)
        lo_a = {"first": (0, 1), "only": (0, 1), "middle": (1, L)}.get(role_, (0, L))
        mask = np.zeros_like(need, dtype=bool)
        mask[lo_a[0]:lo_a[1], :] = True
        if role_ in ("first", "middle"):
            mask[:, L] = False
        if role_ in ("last", "only"):
            mask[:, :L] = False
        need[~mask] = np.inf
        self._needs[key] = need
        return need

    def may_fit(self, stages: list[Devices], mbs: int, m: int) -> bool:
        """False when no layer split can fit memory (a lower bound per stage rules every split out)."""
        return self.least_memory_ratio(stages, mbs, m) <= 1.0

    def split(self, stages: list[Devices], mbs: int, m: int) -> PipelineSplit | None:
        """The best layer split (and per-layer strategies) of one pipeline; None if nothing fits.

        Memoised by the stages' kinds and links: equal pipelines on other devices reuse the split.
        """
        key = (self.pipeline_kind(stages), mbs, m)
        if key in self._splits:
            hit = self._splits[key]
            if hit is None:
                return None
            return PipelineSplit(list(stages), mbs, m, hit.time, hit.bounds, hit.layers, key)
        res = self._split(stages, mbs, m)
        if res is not None:
            res.key = key
        self._splits[key] = res
        return res

    def pipeline_kind(self, stages: list[Devices]) -> tuple:
        """The stages' kinds and the links between them: pipelines of equal kind split alike."""
        links = tuple(stage_link(self.cluster, list(a), list(b)) for a, b in zip(stages, stages[1:]))
        return tuple(self.kind(st) for st in stages), links

    def _split(self, stages: list[Devices], mbs: int, m: int) -> PipelineSplit | None:
        p = len(stages)
        if p > self.L or not self.may_fit(stages, mbs, m):
            return None
        ks = [inflight_microbatches(self.opts.schedule, p, i, m) for i in range(p)]
        tabs = [self.table(st, mbs, m, k, role(i, p)) for i, (st, k) in enumerate(zip(stages, ks))]
        part = best_partition([t.C for t in tabs], self.p2p_costs(stages, mbs), m, self.opts.params.slot_overhead_s,
                              [t.S for t in tabs])
        if part is None or not np.isfinite(part.step_time):
            return None
        res = PipelineSplit(list(stages), mbs, m, part.step_time, part.bounds)  # time: re-priced below
        for i, tab in enumerate(tabs):
            a, b = part.bounds[i], part.bounds[i + 1]
            node = tab.node_of[(a, b)]
            _, point = tab.trie.best(node, tab.room - max(tab.transient[a:b]))
            picks = tab.trie.trace(node, point)
            res.layers.append([StageLayer(self.model.layers[j].name, tab.cands[self.sigs[j]].strategies[picks[j - a]])
                               for j in range(a, b)])
        pipe = Pipeline(mbs * m, mbs, m, res.plan_stages())
        res.time = estimate_pipeline(pipe, self.model, self.cluster, self.opts.schedule, self.opts.params, self.costs)[1]
        return res

    def least_memory_ratio(self, stages: list[Devices], mbs: int, m: int) -> float:
        """Least, over layer splits, of the largest (lower bound on memory need) / (room) of any stage."""
        p = len(stages)
        if p > self.L:
            return np.inf
        ks = [inflight_microbatches(self.opts.schedule, p, i, m) for i in range(p)]
        return minmax_partition([self._need(st, mbs, m, k, role(i, p)) for i, (st, k) in enumerate(zip(stages, ks))])[0]

    def guess(self, stages: list[Devices], mbs: int, m: int) -> float:
        """A quick guess of the pipeline time (memory ignored): stages balanced by their speed, or every
        layer on the fastest stage when that is quicker (few micro-batches), plus each boundary's
        cheapest send. Orders the micro-batch sizes ``best`` solves."""
        least = [self.least_costs(st, mbs, m) for st in stages]
        C = [float(c.sum()) for c, _ in least]
        if not all(np.isfinite(C)):
            return np.inf
        S = [float(s.sum()) for _, s in least]
        W = [c - s / m for c, s in zip(C, S)]  # each stage kind's forward + backward of the whole model
        balanced = 1.0 / sum(1.0 / w for w in W if w > 0)
        sends = sum(float(P[1:].min()) for P in self.p2p_costs(stages, mbs)[:-1])
        # a stage balanced to ``balanced`` seconds holds balanced / W_i of the model, and that share of its tail
        tail = max(s * balanced / w if w > 0 else s for s, w in zip(S, W))
        lopsided = min(m * w + s for w, s in zip(W, S))  # (nearly) every layer on the fastest stage: few m
        return min((m - 1 + len(stages)) * balanced + tail, lopsided) + sends

    def best(self, stages: list[Devices], share: int, tries: int = 2) -> PipelineSplit | None:
        """Best split over micro-batch sizes dividing ``share``: the ``tries`` best guesses are solved
        (and more while none fits). Memoised by pipeline kind."""
        key = (self.pipeline_kind(stages), share, tries)
        if key in self._best:
            hit = self._best[key]
            return None if hit is None else self.split(stages, hit.micro_batch_size, hit.num_microbatches)
        res = self._best_uncached(stages, share, tries)
        self._best[key] = res
        return res

    def _best_uncached(self, stages: list[Devices], share: int, tries: int) -> PipelineSplit | None:
        opts = []
        for mbs in range(1, share + 1):
            if share % mbs:
                continue
            m = share // mbs
            if self.opts.num_microbatches and m not in self.opts.num_microbatches:
                continue
            opts.append((self.guess(stages, mbs, m), mbs, m))
        opts.sort()
        best: PipelineSplit | None = None
        solved = 0
        for g, mbs, m in opts:
            if not np.isfinite(g) or solved >= tries and best is not None:
                break
            r = self.split(stages, mbs, m)
            solved += 1
            if r is not None and (best is None or r.time < best.time):
                best = r
        return best
