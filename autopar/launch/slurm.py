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
from autopar.launch.torchrun import rank_map_lines, render
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


def _directives(c: Component, first: bool, job_name: str) -> list[str]:
    nodes = f"nodes {c.first}-{c.first + c.nodes - 1}" if c.nodes > 1 else f"node {c.first}"
    lines = [f"## plan {nodes}: {c.gpus_per_node} x {c.gpu} each "
             f"(add your site's --partition/--constraint for {c.gpu} here)"]
    if first:
        lines += [f"#SBATCH --job-name={job_name}", "#SBATCH --output=%x-%j.out"]
    lines += [f"#SBATCH --nodes={c.nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive"]
    if not c.is_cpu:
        lines.append(f"#SBATCH --gpus-per-node={c.gpus_per_node}")
    return lines


def sbatch_script(plan: Plan, scripts_dir: Path, job_name: str = "autopar") -> str:
    """The sbatch file text; ``scripts_dir`` (absolute) holds ``node<k>.sh`` and ``plan.yaml``."""
    comps = components(plan.cluster)
    het = len(comps) > 1
    lines = ["#!/usr/bin/env bash"]
    for ci, c in enumerate(comps):
        if ci:
            lines.append("#SBATCH hetjob")
        lines += _directives(c, ci == 0, job_name)
    lines += [f"# autopar: {plan.cluster.num_nodes} nodes, {plan.world_size} ranks, cluster "
              f"{plan.cluster.describe()}. Submit with: sbatch {shlex.quote(str(Path(scripts_dir, 'autopar.sbatch')))}"]
    if het:
        lines += ["# The nodes differ, so this is a heterogeneous job: one component per run of equal nodes,",
                  "# started with its own srun; node<k>.sh gets k = SLURM_NODEID + the nodes before it."]
    lines += ["# Each node runs node<SLURM_NODEID>.sh (torchrun, static rendezvous at the head node)."]
    lines += rank_map_lines(plan)
    nodelist = "$SLURM_JOB_NODELIST_HET_GROUP_0" if het else "$SLURM_JOB_NODELIST"
    lines += [
        "set -euo pipefail",
        "",
        f"export AUTOPAR_DIR={shlex.quote(str(scripts_dir))}",
        f'export MASTER_ADDR="$(scontrol show hostnames "{nodelist}" | head -n 1)"',
        ': "${MASTER_ADDR:?could not read the head node from scontrol}"',
        'export MASTER_PORT="${MASTER_PORT:-29500}"',
        "",
    ]
    if not het:
        lines.append("srun --kill-on-bad-exit=1 bash -c 'exec bash \"$AUTOPAR_DIR/node${SLURM_NODEID}.sh\"'")
        return render(lines)
    for ci, c in enumerate(comps):
        lines.append(f"srun --het-group={ci} --kill-on-bad-exit=1 "
                     f"bash -c 'exec bash \"$AUTOPAR_DIR/node$((SLURM_NODEID + {c.first})).sh\"' &")
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
