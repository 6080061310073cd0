"""SLURM: an sbatch file that runs the per-node torchrun scripts, one task per node.

``srun`` starts one task per node; each task runs ``node<k>.sh`` with ``k = SLURM_NODEID + offset``
(SLURM_NODEID is the node's index inside the job step), so node ranks, and with them global ranks,
follow the plan's node order. The head node, which hosts torchrun's static rendezvous, is the first
host of the allocation: ``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1``.

Nodes that differ (GPU type or GPU count) cannot share one ``--gpus-per-node``: the file is then a
heterogeneous job, one ``#SBATCH hetjob`` component per run of equal consecutive nodes, one ``srun
--het-group=c`` per component (offset = nodes before it), and the head node is the first host of
component 0 (``SLURM_JOB_NODELIST_HET_GROUP_0``). If any component fails, the job is cancelled so
the others do not wait in a collective.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from autopar.cluster.cluster import Cluster
from autopar.launch.options import Resolved
from autopar.launch.torchrun import default_resolved, free_port_lines, rank_map_lines, render
from autopar.plan.schema import Plan


@dataclass(frozen=True)
class Component:
    """A run of consecutive equal nodes: plan nodes ``first .. first + nodes - 1``."""

    first: int
    nodes: int
    gpus_per_node: int
    gpu: str
    is_cpu: bool


def components(cluster: Cluster) -> list[Component]:
    """Consecutive nodes with the same GPU type and count, in plan node order."""
    out: list[Component] = []
    for i, nd in enumerate(cluster.nodes):
        is_cpu = nd.gpu.vendor == "cpu" or nd.gpu.name.lower() == "cpu"
        last = out[-1] if out else None
        if last and (last.gpu, last.gpus_per_node) == (nd.gpu.name, nd.count):
            out[-1] = Component(last.first, last.nodes + 1, last.gpus_per_node, last.gpu, last.is_cpu)
        else:
            out.append(Component(i, 1, nd.count, nd.gpu.name, is_cpu))
    return out


def _directives(c: Component, first: bool, job_name: str, res: Resolved) -> list[str]:
    nodes = f"nodes {c.first}-{c.first + c.nodes - 1}" if c.nodes > 1 else f"node {c.first}"
    site = "" if res.partition else f" (add your site's --partition/--constraint for {c.gpu} here)"
    lines = [f"## plan {nodes}: {c.gpus_per_node} x {c.gpu} each{site}"]
    if first:
        lines += [f"#SBATCH --job-name={job_name}", "#SBATCH --output=%x-%j.out"]
    lines += [f"#SBATCH --nodes={c.nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive"]
    if not c.is_cpu:
        lines.append(f"#SBATCH --gpus-per-node={res.gpus_per_node or c.gpus_per_node}")
    # checked in autopar.launch.options: no space or shell character can reach these lines
    lines += [f"#SBATCH --{flag}={value}" for flag, value in (("time", res.time), ("partition", res.partition),
                                                               ("cpus-per-task", res.cpus_per_task)) if value]
    return lines


def _head_lines(nodelist: str, res: Resolved) -> list[str]:
    """Find the head node, its address and a free port. The batch script runs on the first node of the
    allocation, which is the head node: the port is picked there, and the address resolved there too
    (a name that resolves to loopback on its own host, as Debian's /etc/hosts does, gives way to the
    host's first address). Inherited MASTER_ADDR / MASTER_PORT are ignored (sbatch exports the submitting
    shell's environment); ``--master-addr`` / ``--port`` fix them."""
    # awk, not head -n 1: head would close the pipe early and scontrol's SIGPIPE would end the script
    lines = [f'HEAD_NODE="$(scontrol show hostnames "{nodelist}" | awk \'NR == 1\')" || true',
             ': "${HEAD_NODE:?could not read the head node from scontrol}"']
    if res.master_addr:
        lines.append(f"MASTER_ADDR={shlex.quote(res.master_addr)}")
    else:
        lines += ["MASTER_ADDR=\"$(getent ahostsv4 \"$HEAD_NODE\" | awk 'NR == 1 {print $1}')\" || true",
                  'case "$MASTER_ADDR" in',
                  '  ""|127.*)',
                  '    if [ "${SLURMD_NODENAME:-}" = "$HEAD_NODE" ]; then',
                  "      MASTER_ADDR=\"$(hostname -I 2>/dev/null | awk '{print $1}')\" || true",
                  "    fi",
                  '    MASTER_ADDR="${MASTER_ADDR:-$HEAD_NODE}";;',
                  "esac"]
    lines.append(f'MASTER_PORT="{res.port or ""}"')
    lines += free_port_lines()
    lines += ["export MASTER_ADDR MASTER_PORT",
              'echo "autopar: job ${SLURM_JOB_ID:-?}: head node $HEAD_NODE; every node waits for the rendezvous at '
              '$MASTER_ADDR:$MASTER_PORT"']
    return lines


def sbatch_script(plan: Plan, scripts_dir: Path, job_name: str = "autopar", res: Resolved | None = None) -> str:
    """The sbatch file text; ``scripts_dir`` (absolute) holds ``node<k>.sh`` and ``plan.yaml``; ``res``: the
    checked launch options (SLURM settings, address, port, the Python that picks the port)."""
    res = res or default_resolved()
    comps = components(plan.cluster)
    het = len(comps) > 1
    lines = ["#!/usr/bin/env bash"]
    for ci, c in enumerate(comps):
        if ci:
            lines.append("#SBATCH hetjob")
        lines += _directives(c, ci == 0, job_name, res)
    lines += [f"# autopar: {plan.cluster.num_nodes} nodes, {plan.world_size} ranks, cluster "
              f"{plan.cluster.describe()}. Submit with: sbatch {shlex.quote(str(Path(scripts_dir, 'autopar.sbatch')))}"]
    if het:
        lines += ["# The nodes differ, so this is a heterogeneous job: one component per run of equal nodes,",
                  "# started with its own srun; node<k>.sh gets k = SLURM_NODEID + the nodes before it."]
    lines += ["# Each node runs node<SLURM_NODEID>.sh (torchrun, static rendezvous at the head node); arguments",
              "# after the file name (sbatch autopar.sbatch --steps 10) go on to the training script."]
    lines += rank_map_lines(plan)
    nodelist = "$SLURM_JOB_NODELIST_HET_GROUP_0" if het else "$SLURM_JOB_NODELIST"
    lines += [
        "set -euo pipefail",
        "",
        f"export AUTOPAR_DIR={shlex.quote(str(scripts_dir))}",
        f"PYTHON={shlex.quote(res.python)}  # picks a free port",
        'PYTHON="${AUTOPAR_PYTHON:-$PYTHON}"',
    ]
    if res.cpus_per_task:  # srun does not inherit sbatch's --cpus-per-task since SLURM 22.05
        lines.append(f"export SRUN_CPUS_PER_TASK={res.cpus_per_task}")
    lines += _head_lines(nodelist, res) + [""]
    if not het:
        lines.append("srun --kill-on-bad-exit=1 bash -c 'exec bash \"$AUTOPAR_DIR/node${SLURM_NODEID}.sh\" \"$@\"' "
                     'autopar-node "$@"')
        return render(lines)
    for ci, c in enumerate(comps):
        lines.append(f"srun --het-group={ci} --kill-on-bad-exit=1 "
                     f"bash -c 'exec bash \"$AUTOPAR_DIR/node$((SLURM_NODEID + {c.first})).sh\" \"$@\"' "
                     'autopar-node "$@" &')
    lines += [
        "# Wait for every component; the first failure cancels the job (the rest would hang in a collective).",
        f"for _ in {' '.join(str(i) for i in range(len(comps)))}; do",
        "  if ! wait -n; then",
        '    echo "autopar: a node group failed; cancelling job $SLURM_JOB_ID" >&2',
        '    scancel "$SLURM_JOB_ID"',
        "    exit 1",
        "  fi",
        "done",
    ]
    return render(lines)
