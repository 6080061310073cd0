"""Use a profile: measured numbers in place of catalogue figures, and the record a plan keeps of it.

* ``apply_profile(cluster, params, profile)`` -> (cluster', params'): every node of the profiled
  device type gets the measured matmul peak (TFLOPS), copy bandwidth (HBM GB/s) and point-to-point
  link (intra-node GB/s and latency); the cost parameters get the measured compute curves, the
  alpha-beta fits of the collectives for each measured group size, the ZeRO state table, the
  optimizer's bytes per parameter and the training dtype.
* ``apply_profile_model(model, profile)``: the model's units with their measured TP-sharded parameter
  counts and saved-activation split (the profile was measured for this very model).
* ``profile_record(profile)``: what a plan stores in ``plan.search["profile"]`` so that ``autopar
  estimate`` reproduces the search's numbers without the file (the cluster' and cost parameters are
  stored in the plan anyway); ``model_from_record`` applies it again.

A calibration (``Profile.kind == "calibration"``) replaces CostParams fields (and, where it measured
them with nccl-tests, the intra-node link of every node and the network, ``with_links``, the one path
a profile's link takes too): the model stays as it is, the cluster's GPU types must be among those it was fitted on, and its record
in a plan names it (path, sha256, GPU types) without any model numbers.

Anything that does not match (another model or sequence length, a device type the cluster lacks, a
cluster of mixed types, groups larger than the profile measured) is an AutoparError, one line.
"""

from __future__ import annotations

from dataclasses import fields, replace

from autopar.cluster.cluster import MAMF_FIELDS, Cluster
from autopar.errors import AutoparError
from autopar.modelspec.spec import ModelSpec
from autopar.profile.io import Profile
from cost_models import CostParams

UNIT_FIELDS = ("tp_params", "act_tp_bytes", "act_seq_bytes", "act_attn_bytes", "boundary_bytes")
PARAM_FIELDS = {f.name for f in fields(CostParams)} - {"reserve_gib"}


def check_cluster(cluster: Cluster, profile: Profile) -> None:
    """The cluster must consist of the profiled device type, in nodes no larger than the profiled groups."""
    kind = profile.device_type
    types = sorted({nd.gpu.name for nd in cluster.nodes})
    if kind not in types:
        raise AutoparError("profile.device", f"measured {kind!r} but cluster {cluster.describe()} has "
                           f"{', '.join(types)}", f"search a cluster of {kind} (e.g. --cluster 2x{kind}) or "
                           "profile on the machine the cluster has")
    if len(types) > 1:
        raise AutoparError("profile.device", f"cluster {cluster.describe()} mixes {', '.join(types)}; the profile "
                           f"covers {kind} only", f"search a cluster of {kind} alone with this profile")
    need = max(nd.count for nd in cluster.nodes)
    have = set(profile.group_sizes)
    missing = [n for n in range(2, need + 1) if n not in have]
    if missing:
        got = f"groups of {sorted(have)}" if have else "no groups (1 process)"
        raise AutoparError("profile.communication", f"has no measurements for groups of {missing} devices "
                           f"(it has {got}); nodes of {cluster.describe()} hold {need}",
                           f"run `autopar profile --nproc {need}` on this machine")


def with_links(cluster: Cluster, link: dict | None = None, inter_link: dict | None = None, gpu=None) -> Cluster:
    """``cluster`` with a measured intra-node ``link`` ({bw_gbps, lat_us}) on every node, a measured
    ``inter_link`` as its network, and ``gpu(node.gpu)`` as each node's GPU (``gpu``: None keeps it)."""
    if inter_link and (cluster.bw_matrix_gbps is not None or cluster.lat_matrix_us is not None):
        raise AutoparError("calibration.communication.inter_link", f"is one link for every node pair but cluster "
                           f"{cluster.describe()} gives a matrix of them", "use a cluster without bw/lat matrices")
    intra = {"intra_bw_gbps": float(link["bw_gbps"]), "intra_lat_us": float(link["lat_us"])} if link else {}
    nodes = [replace(nd, gpu=gpu(nd.gpu) if gpu else nd.gpu, **intra) for nd in cluster.nodes]
    inter = (float(inter_link["bw_gbps"]), float(inter_link["lat_us"])) if inter_link else (
        cluster.inter_bw_gbps, cluster.inter_lat_us)
    return Cluster(nodes=nodes, inter_bw_gbps=inter[0], inter_lat_us=inter[1], bw_matrix_gbps=cluster.bw_matrix_gbps,
                   lat_matrix_us=cluster.lat_matrix_us, name=cluster.name, meta=dict(cluster.meta))


def _apply_calibration(cluster: Cluster, params: CostParams, calibration: Profile) -> tuple[Cluster, CostParams]:
    """(cluster with the calibration's measured links, if any; params with its fitted fields): the
    cluster's GPU types must be fitted ones."""
    fitted_on = list(calibration["gpus"])
    other = sorted({nd.gpu.name for nd in cluster.nodes} - set(fitted_on))
    if other:
        raise AutoparError("calibration.gpus", f"were fitted on {', '.join(fitted_on)} but cluster "
                           f"{cluster.describe()} has {', '.join(other)}",
                           f"calibrate on measured runs of {', '.join(other)} (autopar calibrate)")
    fitted = {k: v for k, v in calibration["cost_params"].items() if k in PARAM_FIELDS}
    links = calibration.get("communication") or {}
    if links.get("link") or links.get("inter_link"):
        cluster = with_links(cluster, links.get("link"), links.get("inter_link"))
    return cluster, params.with_fitted(fitted)


def apply_profile(cluster: Cluster, params: CostParams, profile: Profile) -> tuple[Cluster, CostParams]:
    """(cluster', params') with the profile's measured figures (a calibration's: its fitted cost
    parameters alone); see the module docstring."""
    if profile.kind == "calibration":
        return _apply_calibration(cluster, params, profile)
    check_cluster(cluster, profile)
    comp = profile["compute"]
    # The measured copy bandwidth is what kernels reach: on a gddr_ecc part, the line rate it implies is larger.
    new_cluster = with_links(cluster, profile["communication"].get("link"), gpu=lambda g: replace(
        g, tflops=float(comp["peak_tflops"]), hbm_gbps=float(comp["hbm_gbps"]) * g.hbm_gbps * 1e9 / g.hbm_bw,
        sustained=1.0, **dict.fromkeys(MAMF_FIELDS, 0.0)))  # the measured peak is what its matmuls reach
    # Measured unit times include their memory-bound kernels: a profile written before act_traffic
    # existed must not have them added again.
    measured = {"act_traffic": 0.0, **{k: v for k, v in profile["cost_params"].items() if k in PARAM_FIELDS}}
    return new_cluster, replace(params, **measured)


def _check_model(model: ModelSpec, rec: dict, where: str, path: str) -> None:
    m = rec["model"]
    if model.name != m["name"] or model.seq_len != m["seq_len"]:
        raise AutoparError(f"{where}.model", f"was measured for {m['name']} at seq_len {m['seq_len']}, not "
                           f"{model.name} at seq_len {model.seq_len}",
                           f"run `autopar profile --model {model.source or model.name} --seq-len {model.seq_len}`"
                           f" (profile: {path})")
    names = [ly.name for ly in model.layers]
    if names != list(m["units"]):
        raise AutoparError(f"{where}.model.units", f"lists {len(m['units'])} units, {model.name} has {len(names)}",
                           f"run `autopar profile --model {model.source or model.name}` again")
    if model.dtype_bytes != m["dtype_bytes"]:
        raise AutoparError(f"{where}.model.dtype_bytes", f"is {m['dtype_bytes']} but the model spec has "
                           f"{model.dtype_bytes}", f"load the model with dtype_bytes={m['dtype_bytes']}")


def _patched(model: ModelSpec, units: dict) -> ModelSpec:
    layers = []
    for ly in model.layers:
        row = units[ly.name]
        vals = {k: (int(row[k]) if k == "tp_params" else float(row[k])) for k in UNIT_FIELDS}
        vals["tp_params"] = min(vals["tp_params"], ly.params)
        layers.append(replace(ly, **vals))
    return replace(model, layers=layers)


def apply_profile_model(model: ModelSpec, profile: Profile) -> ModelSpec:
    """``model`` with the profile's measured per-unit parameters split and saved-activation bytes
    (``model`` itself for a calibration, which measures no units)."""
    if profile.kind == "calibration":
        return model
    _check_model(model, profile, "profile", profile.path)
    return _patched(model, profile["memory"]["units"])


def profile_record(profile: Profile) -> dict:
    """What a plan keeps of the profile it was searched with (``plan.search["profile"]``)."""
    if profile.kind == "calibration":
        return {"kind": "calibration", "path": profile.path, "sha256": profile.sha256,
                "created": profile.get("created", ""), "gpus": list(profile["gpus"])}
    return {
        "path": profile.path,
        "sha256": profile.sha256,
        "created": profile.get("created", ""),
        "device": {k: profile["device"][k] for k in ("type", "name", "nproc") if k in profile["device"]},
        "model": {k: profile["model"][k] for k in ("name", "seq_len", "dtype_bytes", "units")},
        "units": {n: {k: profile["memory"]["units"][n][k] for k in UNIT_FIELDS} for n in profile["model"]["units"]},
    }


def model_from_record(model: ModelSpec, record: dict) -> ModelSpec:
    """Apply a plan's stored profile record to ``model`` (as the search did; a calibration's leaves it)."""
    if isinstance(record, dict) and record.get("kind") == "calibration":
        return model
    if not isinstance(record, dict) or not {"model", "units"} <= set(record):
        raise AutoparError("plan.search.profile", "is incomplete", "search the plan again with --profile")
    _check_model(model, record, "plan.search.profile", record.get("path", "?"))
    return _patched(model, record["units"])
