"""The one reader of stored cost parameters: a plan's ``search.cost_params`` and a profile's ``cost_params``.

Every field is typed and in range, so a hand-edited file cannot make the memory check or the estimate
absurd (``reserve_gib: -100``, a byte count of 0, an efficiency of 7): reserve and times >= 0, byte
counts >= 1, efficiencies in (0, 4] (a measured curve is relative to the measured matmul peak, which a
quick profile's small units can beat), overlaps in [0, 1], every number finite. Unknown keys are refused.
A profile sets only the fields it measures (``partial``); a plan written by autopar stores them all (those
of ``_LATER``, added since, may be absent from an older plan: their defaults).
"""

from __future__ import annotations

import math
from dataclasses import fields

from autopar.errors import AutoparError
from autopar.fields import Fields, as_int, as_list, as_num, as_str
from cost_models import CostParams

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
_BYTES = ("param_bytes", "grad_comm_bytes", "grad_bytes", "state_bytes", "opt_bytes_touched")
_EFF = ("eff_max", "zero3_comm_eff", "link_efficiency")
_FRACTIONS = ("overlap_sync", "overlap_zero3", "overlap_grad_reduce", "overlap_param_gather", "async_tp_overlap",
              "tp_boundary_gather", "tp_async_backward", "tied_copy_one_stage", "tied_sync_full")
_FACTORS = ("act_mem_factor",)
_SHARES = ("linear_input_share",)  # in (0, 1]
_NONNEG = ("layer_overhead_s", "collective_call_s", "zero3_rate_gbps", "reserve_gib", "step_overhead_per_unit_s", "act_traffic",
           "slot_overhead_s", "loss_copies", "grad_accum_bytes", "grad_cast_bytes")
EFF_HIGH = 4.0
# Fields added after plans were first written: absent from an older plan, they take CostParams' default (the
# plans written before them hold no strategy that reads them: ep and zero_overlap came with them; every plan
# reads link_efficiency, so an older plan is re-estimated at its default, as after any change of the model).
_LATER = ("moe_imbalance", "overlap_grad_reduce", "overlap_param_gather", "zero3_comm_eff", "async_tp_overlap",
          "loss_copies", "link_efficiency", "grad_accum_bytes", "linear_input_share", "tp_boundary_gather",
          "tp_async_backward", "tied_copy_one_stage", "tied_sync_full", "collective_call_s",
          "zero3_rate_gbps", "grad_cast_bytes")


def _finite(x: float, field: str, fix: str, high: float | None = None) -> float:
    if math.isinf(x):
        raise AutoparError(field, "is infinite", fix)
    if high is not None and x > high:
        raise AutoparError(field, f"must be <= {high:g}, got {x}", fix)
    return x


def _num(value: object, field: str, fix: str, *, gt: float | None = None, ge: float | None = None,
         high: float | None = None) -> float:
    return _finite(as_num(value, field, gt=gt, ge=ge, fix=fix), field, fix, high)


def _row(value: object, field: str, n: int, fix: str) -> list:
    row = as_list(value, field, fix=fix)
    if len(row) != n:
        raise AutoparError(field, f"has {len(row)} entries, expected {n}", fix)
    return row


def _eff_by_kind(value: object, field: str, fix: str) -> tuple:
    out = []
    for i, r in enumerate(as_list(value, field, fix=fix)):
        at = f"{field}[{i}]"
        kind, tp, zero, eff, over = _row(r, at, 5, fix)
        out.append((as_str(kind, f"{at}[0]", fix=fix), as_int(tp, f"{at}[1]", low=1, fix=fix),
                    as_int(zero, f"{at}[2]", low=0, high=3, fix=fix), _num(eff, f"{at}[3]", fix, gt=0, high=EFF_HIGH),
                    _num(over, f"{at}[4]", fix, ge=0)))
    return tuple(out)


def _comm_fit(value: object, field: str, fix: str) -> tuple:
    out = []
    for i, r in enumerate(as_list(value, field, fix=fix)):
        at = f"{field}[{i}]"
        coll, n, alpha, beta = _row(r, at, 4, fix)
        out.append((as_str(coll, f"{at}[0]", choices=COLLECTIVES, fix=fix), as_int(n, f"{at}[1]", low=2, fix=fix),
                    _num(alpha, f"{at}[2]", fix, ge=0), _num(beta, f"{at}[3]", fix, ge=0)))
    return tuple(out)


def _state_table(value: object, field: str, fix: str) -> tuple:
    rows = as_list(value, field, fix=fix)
    if rows and len(rows) != 4:
        raise AutoparError(field, f"has {len(rows)} rows, expected 4 (ZeRO stages 0..3) or none", fix)
    return tuple((_num(a, f"{field}[{z}][0]", fix, ge=0), _num(b, f"{field}[{z}][1]", fix, ge=0))
                 for z, (a, b) in enumerate(_row(r, f"{field}[{z}]", 2, fix) for z, r in enumerate(rows)))


def read_cost_params(doc: object, path: str, fix: str, *, partial: bool = False) -> dict:
    """The checked fields of a stored ``cost_params`` mapping at ``path`` (all of them unless ``partial``)."""
    names = [f.name for f in fields(CostParams)]
    top = Fields(doc, path, kind="cost_params", keys=names, fix=fix)
    out: dict = {}
    for name in names:
        if not top.has(name):
            if partial or name in _LATER:
                continue
            raise AutoparError(top.at(name), "is missing", fix)
        value, at = top.doc[name], top.at(name)
        if name in _BYTES:
            num = _num(value, at, fix, ge=1)
            out[name] = int(num) if isinstance(value, int) else num
        elif name in _EFF:
            out[name] = _num(value, at, fix, gt=0, high=EFF_HIGH)
        elif name == "moe_imbalance":  # the most loaded EP rank's tokens over the even share
            out[name] = _num(value, at, fix, ge=1, high=10)
        elif name in _SHARES:
            out[name] = _num(value, at, fix, gt=0, high=1)
        elif name in _FACTORS:
            out[name] = _num(value, at, fix, gt=0, high=10)
        elif name in _FRACTIONS:
            out[name] = _num(value, at, fix, ge=0, high=1)
        elif name in _NONNEG:
            out[name] = _num(value, at, fix, ge=0)
        else:
            out[name] = {"eff_by_kind": _eff_by_kind, "comm_fit": _comm_fit, "state_table": _state_table}[name](
                value, at, fix)
    if all(k in out for k in ("state_bytes", "param_bytes", "grad_bytes")):
        check_state_bytes(out, top.at("state_bytes"))
    return out


def check_state_bytes(values: dict, where: str) -> None:
    """Refuse byte counts whose optimizer part (``state_bytes - param_bytes - grad_bytes``) is negative."""
    opt = values["state_bytes"] - values["param_bytes"] - values["grad_bytes"]
    if opt < 0:
        raise AutoparError(where, f"state_bytes {values['state_bytes']} is below param_bytes {values['param_bytes']} + "
                           f"grad_bytes {values['grad_bytes']}", "state_bytes counts parameter, gradient and "
                           "optimizer bytes: raise it with grad_bytes")
