"""torchrun scripts: one per node of the plan's cluster, plus ``run_local.sh`` for one-node clusters.

Ranks must equal the plan's device ids (devices are numbered node by node). torchrun gives node
``node_rank`` the global ranks ``sum(nproc of nodes before it) + local_rank`` (its elastic agent adds
up the per-node process counts in node-rank order, so nodes with different GPU counts work), but
only the *static* rendezvous takes the node rank from ``--node-rank``. The c10d rendezvous ignores
``--node-rank`` and orders nodes by their hostnames (torch.distributed.elastic
``DynamicRendezvousHandler`` sorts participants by FQDN), which would scramble the plan's device ids
on any cluster whose nodes differ. So the scripts use ``--rdzv-backend static`` with
``--master-addr/--master-port`` by default; ``rendezvous="c10d"`` is offered for homogeneous
clusters, where any node order is an equivalent plan.
"""

from __future__ import annotations

import shlex

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.plan.schema import Plan

RENDEZVOUS = ("static", "c10d")

# (variable, value, why). Each is exported with ``${VAR:-value}`` so a user's own setting wins.
ENV = (
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1", "one CUDA work queue: TP/SP collectives launch in program order "
                                         "and overlap with the compute queued behind them"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "a failed or timed-out NCCL collective ends the job, no hang"),
    ("NCCL_ASYNC_ERROR_HANDLING", "1", "the same for torch < 2.2"),
    ("NCCL_DEBUG", "WARN", "NCCL reports problems, not chatter"),
    ("PYTHONUNBUFFERED", "1", "rank output shows up as it is printed"),
)


def _env_block(nproc: int) -> list[str]:
    lines = [
        "# Threads per rank: the node's cores shared among its ranks (torchrun would force 1).",
        'if [ -z "${OMP_NUM_THREADS:-}" ]; then',
        f"  OMP_NUM_THREADS=$(( $(nproc) / {nproc} ))",
        '  if [ "$OMP_NUM_THREADS" -lt 1 ]; then OMP_NUM_THREADS=1; fi',
        "fi",
        "export OMP_NUM_THREADS",
    ]
    for var, value, why in ENV:
        lines += [f"# {why}", f'export {var}="${{{var}:-{value}}}"']
    return lines


def render(lines: list[str]) -> str:
    """The script text: one line per item. A comment line never holds a control character (a newline
    there would end the comment and run the rest); values on command lines are shlex-quoted already."""
    out = []
    for line in lines:
        if line.startswith("#"):
            line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
        out.append(line)
    return "\n".join(out) + "\n"


def _span(a: int, b: int) -> str:
    return f"{a}-{b}" if b > a else f"{a}"


def rank_map_lines(plan: Plan, this_node: int | None = None) -> list[str]:
    """Comment lines saying which global ranks (= plan device ids) each node runs, and what they hold."""
    cluster = plan.cluster
    stage_of = {d: f"pipeline {pi} stage {si}" for pi, p in enumerate(plan.pipelines)
                for si, st in enumerate(p.physical_stages) for d in st.devices}
    lines = ["# Ranks: the plan numbers devices node by node, and so does torchrun here: node i's local rank r",
             "# is global rank sum(nproc of nodes 0..i-1) + r, which is the plan's device id. Local rank r uses",
             "# GPU r of its node."]
    shown = list(range(cluster.num_nodes))
    if len(shown) > 8:
        shown = shown[:3] + [-1] + shown[-2:]
    for i in shown:
        if i < 0:
            lines.append("#   ...")
            continue
        lines.append(f"#   {_node_line(cluster, i, stage_of)}")
    if this_node is not None:
        lines.append(f"# This script: {_node_line(cluster, this_node, stage_of)}")
    return lines


def _node_line(cluster: Cluster, i: int, stage_of: dict[int, str]) -> str:
    devs = cluster.node_devices(i)
    nd = cluster.nodes[i]
    holds = sorted(set(stage_of.get(d, "nothing") for d in devs))
    return (f"node {i} ({nd.count} x {nd.gpu.name}): local ranks {_span(0, nd.count - 1)} = global ranks "
            f"{_span(devs[0], devs[-1])} ({', '.join(holds)})")


def _header(title: str) -> list[str]:
    return ["#!/usr/bin/env bash", f"# {title}", "# Written by autopar launch; edit SCRIPT below if the cluster sees "
            "another path.", ""]


def _paths_block(script: str, script_args: list[str]) -> list[str]:
    return [
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'PLAN="${AUTOPAR_PLAN:-$HERE/plan.yaml}"',
        f"SCRIPT={shlex.quote(script)}",
        "SCRIPT_ARGS=(" + " ".join(shlex.quote(a) for a in script_args) + ")",
    ]


def _run_line(torchrun_args: list[str]) -> list[str]:
    lines = ["exec torchrun \\"] + [f"  {a} \\" for a in torchrun_args]
    # ${A[@]+"${A[@]}"}: an empty array under `set -u` on bash < 4.4 too
    lines.append('  "$SCRIPT" --plan "$PLAN" ${SCRIPT_ARGS[@]+"${SCRIPT_ARGS[@]}"} "$@"')
    return lines


def node_script(plan: Plan, node: int, script: str, script_args: list[str], rendezvous: str = "static") -> str:
    """The shell script that starts node ``node``'s ranks with torchrun (needs MASTER_ADDR, MASTER_PORT)."""
    if rendezvous not in RENDEZVOUS:
        raise AutoparError("rendezvous", f"unknown rendezvous {rendezvous!r}", f"use one of {', '.join(RENDEZVOUS)}")
    cluster = plan.cluster
    if rendezvous == "c10d" and not cluster.is_homogeneous:
        raise AutoparError("rendezvous", "c10d orders nodes by hostname, which keeps the plan's device ids only on "
                           "a homogeneous cluster", "use the static rendezvous (the default)")
    nproc = cluster.nodes[node].count
    lines = _header(f"autopar: node {node} of {cluster.num_nodes} for cluster {cluster.describe()}")
    lines += [f"# Run on node {node}, with the same MASTER_ADDR (node 0's address) and MASTER_PORT on every node:",
              f"#   MASTER_ADDR=<node 0 host> MASTER_PORT=29500 bash node{node}.sh [extra script args]"]
    lines += rank_map_lines(plan, this_node=node)
    if rendezvous == "static":
        lines += ["# Static rendezvous: --node-rank fixes this node's place (c10d would ignore it and order nodes",
                  "# by hostname, breaking rank = device id)."]
    else:
        lines += ["# c10d rendezvous: nodes are ordered by hostname; on this homogeneous cluster any order is an",
                  "# equivalent plan, and c10d tolerates nodes joining in any order."]
    lines += ["set -euo pipefail", ""] + _paths_block(script, script_args)
    lines += [': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0 (the rendezvous host)}"',
              'export MASTER_PORT="${MASTER_PORT:-29500}"', ""] + _env_block(nproc) + [""]
    args = [f"--nnodes {cluster.num_nodes}", f"--nproc-per-node {nproc}"]
    if rendezvous == "static":
        args += [f"--node-rank {node}", "--rdzv-backend static", '--master-addr "$MASTER_ADDR"',
                 '--master-port "$MASTER_PORT"']
    else:
        args += ["--rdzv-backend c10d", '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"',
                 '--rdzv-id "${RDZV_ID:-autopar}"']
    args.append("--max-restarts 0")
    return render(lines + _run_line(args))


def local_script(plan: Plan, script: str, script_args: list[str]) -> str:
    """``run_local.sh``: all ranks of a one-node cluster on this machine (torchrun --standalone)."""
    cluster = plan.cluster
    if cluster.num_nodes != 1:
        raise AutoparError("cluster", f"has {cluster.num_nodes} nodes; run_local.sh is for one-node clusters",
                           "use the per-node scripts node<i>.sh")
    nproc = cluster.nodes[0].count
    lines = _header(f"autopar: all {nproc} ranks of cluster {cluster.describe()} on this machine")
    lines += ["# Usage: bash run_local.sh [extra script args]"] + rank_map_lines(plan)
    lines += ["set -euo pipefail", ""] + _paths_block(script, script_args) + [""] + _env_block(nproc) + [""]
    args = ["--standalone", "--nnodes 1", f"--nproc-per-node {nproc}", "--max-restarts 0"]
    return render(lines + _run_line(args))
