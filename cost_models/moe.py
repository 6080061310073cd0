"""Expert parallelism: the time and memory of an MoE layer unit whose experts are split over ep ranks.

``layer.layer_costs`` prices every strategy of a unit; for the strategies with ``ep`` > 1 of a unit with
routed experts (``Layer.moe``, autopar's ``MoESpec``) it hands over to ``expert_parallel_costs``, which
prices them with the same terms (``compute_times``, ``activation_traffic_times``, ``dp_comm_times``,
``zero_exposed``, ``model_state_bytes``; layer.py passes its own as ``terms``, so this module does not
import it), with these differences, as Megatron-Core's expert parallelism
runs them (``--expert-model-parallel-size``, the EP group a sub-group of the DP group):

* The unit's parameters split in two: the routed experts (``moe.expert_params``), of which a rank holds
  ``1 / ep``, and the rest (attention, router, norms, shared experts). The rest syncs its gradients and
  shards its ZeRO state over the whole DP group of dp ranks, as a dense unit; the experts over their
  expert-data-parallel group, the dp / ep ranks that hold the same experts.
* The groups, for the contract's layout (an EP group = ep consecutive DP ranks; tp is 1 with ep > 1):
  EP groups are consecutive stage devices (``stage.tp_links(ep)``), expert-DP groups strided by ep
  (``stage.dp_links(ep)``).
* Dispatch and combine: two all-to-alls in forward and two in backward per MoE unit, each of the tokens'
  ``top_k`` copies of their hidden state (``moe.dispatch_bytes`` per sample) over the EP group
  (``communication.alltoall_time``); full recomputation reruns the forward's two.
* Load imbalance: the most loaded rank computes and exchanges ``CostParams.moe_imbalance`` times its
  even share of expert tokens, and holds that many expert activations (``moe.expert_act_bytes``). With
  ep = 1 every rank runs its own tokens' experts, exactly ``top_k`` per token: no imbalance term.

The router's FLOPs are part of the unit's forward FLOPs (``LayerSpec.flops``), as every dense FLOP.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from cost_models import communication as comm
from cost_models.compute import compute_time, layer_efficiency, memory_bound_time
from cost_models.memory import model_state_bytes

_FIELDS = ("fwd", "bwd", "step", "cost", "mem_states", "mem_act")
FULL = 2  # layer.CKPT_CODE["full"]


def ep_of(strategy) -> int:
    """The strategy's expert-parallel degree (1 for strategies that do not state one)."""
    return int(getattr(strategy, "ep", 1))


def ep_shard_params(layer, ep: int, tp: float = 1.0) -> float:
    """Parameters one rank holds of ``layer`` with expert parallel ``ep``: its TP share of the non-expert
    parameters plus ``1 / ep`` of the routed experts (``layer.shard_params`` for ep = 1)."""
    moe = getattr(layer, "moe", None)
    dense = layer.tp_params / tp + (layer.params - layer.tp_params)
    if moe is None or ep <= 1:
        return dense
    return dense - moe.expert_params + moe.expert_params / ep


def expert_parallel_costs(layer, strategies: list, stage, base, terms) -> dict[str, np.ndarray]:
    """The fields of ``base`` (a ``LayerCosts``: every strategy priced as a dense unit) with the strategies of
    ep > 1 re-priced as above; ``terms``: the module ``cost_models.layer`` (its term functions)."""
    eps = np.array([ep_of(s) for s in strategies])
    out = {f: np.array(getattr(base, f), dtype=float, copy=True) for f in _FIELDS}
    for e in np.unique(eps[eps > 1]):
        sel = np.flatnonzero(eps == e)
        part = _ep_rows(layer, [strategies[i] for i in sel], stage, int(e), terms)
        for f in _FIELDS:
            out[f][sel] = part[f]
    return out


def alltoall_seconds(layer, stage, ep: int, b_local: np.ndarray) -> np.ndarray:
    """One all-to-all of a micro-batch's dispatched tokens (``b_local`` samples per rank) over the EP group,
    on the most loaded rank (``moe_imbalance``)."""
    g = stage.tp_links(ep)  # ep consecutive devices (tp = 1 with ep > 1)
    bw, lat = g.slowest
    nbytes = layer.moe.dispatch_bytes * b_local * stage.params.moe_imbalance
    return comm.alltoall_time(nbytes, ep, bw, lat)


def _ep_rows(layer, strategies: list, stage, ep: int, t) -> dict[str, np.ndarray]:
    p, coll, moe = stage.params, stage.collectives, layer.moe
    tp, zero, ckpt, sp = t.strategy_arrays(strategies)
    dp = stage.n / tp
    edp = dp / ep
    b_local = stage.micro_batch_size / dp

    f_comp, b_comp = t.compute_times(layer, tp, zero, ckpt, dp, b_local, stage.peak_flops, p, stage.attn_peak_flops,
                                     stage.sms, stage.matmul_ratios)
    extra = compute_time(moe.expert_flops * (p.moe_imbalance - 1.0) * b_local / tp, stage.peak_flops,
                         layer_efficiency(p.eff_max, stage.matmul_ratios[0]), 0.0)
    full = ckpt == FULL
    f_comp = f_comp + extra
    b_comp = b_comp + 2.0 * extra + np.where(full, extra, 0.0)
    share = p.linear_input_share
    saved = np.array([layer.saved_bytes(s.ckpt, s.tp, s.sp, share) for s in strategies], dtype=float)
    if p.act_traffic > 0:
        saved_none = np.array([layer.saved_bytes("none", s.tp, s.sp, share) for s in strategies], dtype=float)
        m_fwd, m_bwd = t.activation_traffic_times(saved_none, saved, ckpt, b_local, stage.hbm_bw, p)
        f_comp, b_comp = f_comp + m_fwd, b_comp + m_bwd
    a2a = alltoall_seconds(layer, stage, ep, b_local)
    a2a_fwd = 2.0 * a2a
    a2a_bwd = 2.0 * a2a + np.where(full, 2.0 * a2a, 0.0)

    dense = SimpleNamespace(params=layer.params - moe.expert_params,
                            tp_params=max(0, layer.tp_params - moe.expert_params))
    experts = SimpleNamespace(params=moe.expert_params / ep, tp_params=0)
    ar_d, ag_d, rs_d = t.dp_comm_times(dense, tp, stage.dp_links, coll, p)
    ar_e, ag_e, rs_e = t.dp_comm_times(experts, tp, lambda t: stage.dp_links(ep), coll, p)
    shard_d = t.shard_params(dense, tp)
    shard_e = np.full_like(tp, experts.params)
    floors = [d + e for d, e in zip(t.zero3_floors(shard_d, dp, p), t.zero3_floors(shard_e, edp, p))]
    z_fwd, z_bwd = t.zero_exposed(f_comp, b_comp, ag_d + ag_e, rs_d + rs_e, zero, p.overlap_zero3,
                                  p.zero3_comm_eff, floors)
    fwd = f_comp + z_fwd + a2a_fwd
    bwd = b_comp + z_bwd + a2a_bwd
    sync = np.select([zero == 0, zero == 1, zero == 2], [ar_d + ar_e, rs_d + ag_d + rs_e + ag_e, ag_d + ag_e], 0.0)
    exposed = np.maximum(0.0, sync - p.overlap_sync * b_comp)
    owned = np.where(zero >= 1, shard_d / dp + shard_e / edp, shard_d + shard_e)
    step = exposed + memory_bound_time(owned * p.opt_bytes_touched, stage.hbm_bw) + p.step_overhead_per_unit_s

    mem_states = (model_state_bytes(shard_d, zero, dp, p.state_bytes, p.param_bytes, p.state_table, p.grad_bytes)
                  + model_state_bytes(shard_e, zero, np.full_like(tp, edp), p.state_bytes, p.param_bytes,
                                      p.state_table, p.grad_bytes))
    kept_expert = np.where(full, 0.0, moe.expert_act_bytes)
    mem_act = (saved + (p.moe_imbalance - 1.0) * kept_expert) * b_local * p.act_mem_factor
    cost = fwd + bwd + step / stage.num_microbatches
    return dict(fwd=fwd, bwd=bwd, step=step, cost=cost, mem_states=mem_states, mem_act=mem_act)
