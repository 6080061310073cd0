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

Node 0 hosts the rendezvous: without MASTER_ADDR / MASTER_PORT (or ``--master-addr`` / ``--port``) it
takes its own first address and a free port and prints the command line for the other nodes, which
need both and print what they wait on. torchrun is called by the path the scripts were written for
(autopar.launch.options); each rank's output goes to its own log file and, prefixed with its global
rank, to the console.
"""

from __future__ import annotations

import shlex

from autopar.cluster.cluster import Cluster
from autopar.errors import AutoparError
from autopar.launch.options import LaunchOptions, Resolved, resolve
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


# What a plan's precision asks of fp32 matmuls, set whatever the environment holds (the plan was priced at that rate):
# NGC's PyTorch images turn TF32 on for every fp32 matmul (ENV TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1), and
# NVIDIA_TF32_OVERRIDE=0 turns it off in cuBLAS whatever PyTorch asks. (lines, why) per precision; others leave both.
PRECISION_ENV = {
    "fp32": (["export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=0", "export NVIDIA_TF32_OVERRIDE=0"],
             "the plan was priced at plain FP32 matmuls: TF32 off, even in NGC images (search with --precision tf32 "
             "to run TF32)"),
    "tf32": (["export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1", "unset NVIDIA_TF32_OVERRIDE"],
             "the plan was priced at TF32 matmuls: on for fp32 tensors, whatever the training script sets"),
}


def _precision_lines(precision: str) -> list[str]:
    if precision not in PRECISION_ENV:
        return []
    lines, why = PRECISION_ENV[precision]
    return [f"# {why}"] + lines


def _env_block(nproc: int, precision: str) -> list[str]:
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
    lines += ["# Each console line of a rank starts with its global rank (torchrun's own prefix is the local rank).",
              'if [ -z "${TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:-}" ]; then',
              "  TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]: '",
              "fi",
              "export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"]
    return lines + _precision_lines(precision)


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


def _header(title: str, res: Resolved) -> list[str]:
    return ["#!/usr/bin/env bash", f"# {title}",
            f"# Written by autopar launch for the environment of {res.torchrun} (autopar launch --torchrun PATH",
            "# writes it for another; AUTOPAR_TORCHRUN=PATH overrides it when run). Edit SCRIPT below if the",
            "# nodes see another path.", ""]


def _paths_block(script: str, script_args: list[str], res: Resolved) -> list[str]:
    return [
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'PLAN="${AUTOPAR_PLAN:-$HERE/plan.yaml}"',
        f"SCRIPT={shlex.quote(script)}",
        "SCRIPT_ARGS=(" + " ".join(shlex.quote(a) for a in script_args) + ")",
        f"TORCHRUN={shlex.quote(res.torchrun)}",
        'TORCHRUN="${AUTOPAR_TORCHRUN:-$TORCHRUN}"',
        f"PYTHON={shlex.quote(res.python)}  # picks a free port",
        'PYTHON="${AUTOPAR_PYTHON:-$PYTHON}"',
        "# Each rank's stdout and stderr: LOG_DIR/node<k>/<run>/attempt_0/<local rank>/{stdout,stderr}.log, and on",
        "# this console with a [rank<global rank>]: prefix (torchrun --log-dir --tee 3).",
        f"LOG_DIR={shlex.quote(res.log_dir)}" if res.log_dir else 'LOG_DIR="$HERE/logs"',
        'LOG_DIR="${AUTOPAR_LOG_DIR:-$LOG_DIR}"',
        'if ! command -v "$TORCHRUN" >/dev/null 2>&1; then',
        '  echo "autopar: error: torchrun: $TORCHRUN not found on $(hostname); set AUTOPAR_TORCHRUN=PATH, or write the '
        'scripts again with autopar launch --torchrun PATH" >&2',
        "  exit 2",
        "fi",
    ]


FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'


def free_port_lines(indent: str = "") -> list[str]:
    """Set MASTER_PORT to a free TCP port of this host when it is empty (picked by "$PYTHON"; the port is
    released before torchrun binds it, a short window in which another program could take it)."""
    return [f'{indent}if [ -z "$MASTER_PORT" ]; then',
            f'{indent}  MASTER_PORT="$("$PYTHON" -c {shlex.quote(FREE_PORT)})"',
            f"{indent}fi"]


def _rendezvous_block(node: int, res: Resolved, num_nodes: int) -> list[str]:
    addr = res.master_addr or ""  # checked: letters, digits, . : -
    lines = [f'MASTER_ADDR="${{MASTER_ADDR:-{addr}}}"', f'MASTER_PORT="${{MASTER_PORT:-{res.port or ""}}}"']
    if node == 0:
        lines += ["# Node 0 hosts the rendezvous: unset, MASTER_ADDR is this host's first address and MASTER_PORT",
                  "# a free port here; the line printed below gives both to the other nodes.",
                  'if [ -z "$MASTER_ADDR" ]; then',
                  "  MASTER_ADDR=\"$(hostname -I 2>/dev/null | awk '{print $1}')\" || true",
                  '  MASTER_ADDR="${MASTER_ADDR:-$(hostname)}"',
                  "fi"]
        lines += free_port_lines()
        lines += ["export MASTER_ADDR MASTER_PORT",
                  f'echo "autopar: node 0 of {num_nodes} hosts the rendezvous at $MASTER_ADDR:$MASTER_PORT" >&2']
        if num_nodes == 1:
            return lines
        lines += ['if [ -z "${SLURM_JOB_ID:-}" ]; then',
                  '  echo "autopar: start every other node k with: MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT '
                  'bash node<k>.sh" >&2',
                  "fi"]
        return lines
    return lines + [
        ': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0 (node0.sh prints it)}"',
        ': "${MASTER_PORT:?set MASTER_PORT to the port node0.sh printed (or write the scripts with autopar launch '
        '--port P)}"',
        "export MASTER_ADDR MASTER_PORT",
        f'echo "autopar: node {node} of {num_nodes} waits for the rendezvous at $MASTER_ADDR:$MASTER_PORT '
        '(hosted by node 0)" >&2',
    ]


def _run_line(torchrun_args: list[str]) -> list[str]:
    lines = ['exec "$TORCHRUN" \\'] + [f"  {a} \\" for a in torchrun_args]
    # ${A[@]+"${A[@]}"}: an empty array under `set -u` on bash < 4.4 too
    lines.append('  "$SCRIPT" --plan "$PLAN" ${SCRIPT_ARGS[@]+"${SCRIPT_ARGS[@]}"} "$@"')
    return lines


def _log_args(node: int) -> list[str]:
    return [f'--log-dir "$LOG_DIR/node{node}"', "--tee 3"]


def node_script(plan: Plan, node: int, script: str, script_args: list[str], rendezvous: str = "static",
                res: Resolved | None = None) -> str:
    """The shell script that starts node ``node``'s ranks with torchrun. Node 0 hosts the rendezvous (its
    own address and a free port unless MASTER_ADDR / MASTER_PORT or ``res`` give them); the other nodes
    need MASTER_ADDR and MASTER_PORT (or ``res.master_addr`` / ``res.port``) and print what they wait on."""
    if rendezvous not in RENDEZVOUS:
        raise AutoparError("rendezvous", f"unknown rendezvous {rendezvous!r}", f"use one of {', '.join(RENDEZVOUS)}")
    cluster = plan.cluster
    if rendezvous == "c10d" and not cluster.is_homogeneous:
        raise AutoparError("rendezvous", "c10d orders nodes by hostname, which keeps the plan's device ids only on "
                           "a homogeneous cluster", "use the static rendezvous (the default)")
    res = res or default_resolved()
    nproc = cluster.nodes[node].count
    lines = _header(f"autopar: node {node} of {cluster.num_nodes} for cluster {cluster.describe()}", res)
    lines += ["# Start node 0 first: it prints its address and rendezvous port; then on each other node k:",
              "#   MASTER_ADDR=<node 0 address> MASTER_PORT=<port> bash node<k>.sh [extra script args]"]
    lines += rank_map_lines(plan, this_node=node)
    if rendezvous == "static":
        lines += ["# Static rendezvous: --node-rank fixes this node's place (c10d would ignore it and order nodes",
                  "# by hostname, breaking rank = device id)."]
    else:
        lines += ["# c10d rendezvous: nodes are ordered by hostname; on this homogeneous cluster any order is an",
                  "# equivalent plan, and c10d tolerates nodes joining in any order."]
    lines += ["set -euo pipefail", ""] + _paths_block(script, script_args, res) + [""]
    lines += _rendezvous_block(node, res, cluster.num_nodes) + [""] + _env_block(nproc, plan.precision) + [""]
    args = [f"--nnodes {cluster.num_nodes}", f"--nproc-per-node {nproc}"]
    if rendezvous == "static":
        args += [f"--node-rank {node}", "--rdzv-backend static", '--master-addr "$MASTER_ADDR"',
                 '--master-port "$MASTER_PORT"']
    else:
        args += ["--rdzv-backend c10d", '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"',
                 '--rdzv-id "${RDZV_ID:-autopar}"']
    args += ["--max-restarts 0"] + _log_args(node)
    return render(lines + _run_line(args))


def local_script(plan: Plan, script: str, script_args: list[str], res: Resolved | None = None) -> str:
    """``run_local.sh``: all ranks of a one-node cluster on this machine (torchrun --standalone)."""
    cluster = plan.cluster
    if cluster.num_nodes != 1:
        raise AutoparError("cluster", f"has {cluster.num_nodes} nodes; run_local.sh is for one-node clusters",
                           "use the per-node scripts node<i>.sh")
    res = res or default_resolved()
    nproc = cluster.nodes[0].count
    lines = _header(f"autopar: all {nproc} ranks of cluster {cluster.describe()} on this machine", res)
    lines += ["# Usage: bash run_local.sh [extra script args]"] + rank_map_lines(plan)
    lines += ["set -euo pipefail", ""] + _paths_block(script, script_args, res) + [""]
    lines += _env_block(nproc, plan.precision) + [""]
    args = ["--standalone", "--nnodes 1", f"--nproc-per-node {nproc}", "--max-restarts 0"] + _log_args(0)
    return render(lines + _run_line(args))


def default_resolved() -> Resolved:
    """The options' defaults (the torchrun beside this interpreter, no fixed address or port)."""
    return resolve(LaunchOptions(), None, "torchrun")
