"""``autopar launch``'s arguments (cli.py wires the sub-command in and runs ``handler``)."""

from __future__ import annotations

import sys
from pathlib import Path

from autopar.fields import int_at_least
from autopar.launch import SCHEDULERS
from autopar.launch.options import LaunchOptions


def add_parser(sub, handler) -> None:
    """The ``launch`` sub-command: the plan, the training script, the scripts' environment, SLURM settings."""
    here = Path(sys.executable).parent / "torchrun"
    la = sub.add_parser("launch", help="write torchrun / SLURM scripts for a plan",
                        epilog="arguments after a bare -- are passed on to the training script")
    la.add_argument("plan", help="a plan file written by autopar search")
    la.add_argument("--script", required=True, help="the training script each rank runs (it gets --plan PLAN)")
    la.add_argument("--scheduler", choices=SCHEDULERS, default="torchrun",
                    help="torchrun: a script per node; slurm: also an sbatch file")
    la.add_argument("-o", "--output", default="launch", metavar="DIR", help="write the scripts into DIR (new, empty, "
                    "or written by autopar launch before: its files are replaced, stale ones removed)")
    la.add_argument("--force", action="store_true", help="write scripts for a plan over its memory budget "
                    "(the plan's structure is still checked)")
    la.add_argument("--torchrun", metavar="PATH", help=f"the torchrun the scripts call: a path, or a command name "
                    f"looked up on the nodes (default: the one beside this Python, {here})")
    la.add_argument("--master-addr", metavar="ADDR", help="node 0's address for the other nodes (default: node 0 "
                    "uses its own first address; under SLURM the head node's, resolved in the job)")
    la.add_argument("--port", type=int_at_least("--port"), help="rendezvous port (default: a free port, "
                    "picked on the head node when the job starts)")
    la.add_argument("--log-dir", metavar="DIR", help="each rank's stdout/stderr files go under DIR/node<k>/ "
                    "(default: logs/ beside the scripts)")
    la.add_argument("--time", help="SLURM time limit, e.g. 90 or 1-12:00:00 (slurm only; default: the partition's)")
    la.add_argument("--partition", help="SLURM partition(s) (slurm only; default: the site's default)")
    la.add_argument("--cpus-per-task", type=int_at_least("--cpus-per-task"),
                    help="SLURM CPUs for each node's task, all its ranks (slurm only; default: the site's)")
    la.add_argument("--gpus-per-node", metavar="[TYPE:]N", help="SLURM GPUs per node: the plan's count, optionally "
                    "with a GPU type (slurm only; default: the plan's count)")
    la.set_defaults(func=handler)


def options_from(args) -> LaunchOptions:
    """The launch options of parsed ``autopar launch`` arguments (checked later, by ``resolve``)."""
    return LaunchOptions(torchrun=args.torchrun, master_addr=args.master_addr, port=args.port, log_dir=args.log_dir,
                         time=args.time, partition=args.partition, cpus_per_task=args.cpus_per_task,
                         gpus_per_node=args.gpus_per_node)
