"""One path from a plan file to an export: load the plan (its model and cost parameters), find the closest
plan the target expresses, and hand the writers everything they print (never a silent approximation).

``prepare`` returns an ``Export``: the original plan and estimate, the expressed plan and estimate (the
same when the plan is expressible as it is), the ``Shape`` the writers configure, and ``changes``, one
line per field that moved; ``header_lines`` is the text every format carries as comments or a field.
"""

from __future__ import annotations

import os
import shlex
from collections import Counter
from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.estimate import PlanEstimate, estimate_plan
from autopar.export.caps import Caps, caps_of
from autopar.export.closest import closest, label
from autopar.export.shape import Shape, changes
from autopar.modelspec.spec import ModelSpec
from autopar.plan.schema import Plan
from autopar.plan.validate import validate_plan
from autopar.planned import check_predicted, load_planned
from autopar.version import __version__


@dataclass
class Export:
    """A plan ready to write for one target (see the module docstring)."""

    source: str
    caps: Caps
    model: ModelSpec
    original: Plan
    original_estimate: PlanEstimate
    plan: Plan
    estimate: PlanEstimate
    shape: Shape
    changes: list[str]

    @property
    def world(self) -> int:
        return self.plan.world_size

    def launch_shape(self) -> tuple[int, int]:
        """(nodes, processes per node) of a launch of the export: the nodes its devices are on."""
        nodes = Counter(self.plan.cluster.nodes_of(sorted(self.plan.devices)))
        return len(nodes), max(nodes.values())

    def torchrun(self) -> list[str]:
        """The script lines before ``exec``: a comment when nodes hold different numbers of devices, then
        ``NPROC`` (``NPROC_PER_NODE`` overrides it on such a node)."""
        nodes = Counter(self.plan.cluster.nodes_of(sorted(self.plan.devices)))
        lines = []
        if len(set(nodes.values())) > 1:
            lines.append("# devices per node differ (" + ", ".join(f"node {n}: {c}" for n, c in sorted(nodes.items()))
                         + "): set NPROC_PER_NODE on each node")
        return lines + [f'NPROC="${{NPROC_PER_NODE:-{max(nodes.values())}}}"']

    @property
    def dp(self) -> int:
        """Data-parallel ranks per stage of one replica."""
        return self.shape.dp(self.world)

    @property
    def micro_batch_per_rank(self) -> int:
        """Samples per micro-batch on one data-parallel rank (the tools' micro-batch size)."""
        pipe = self.plan.pipelines[0]
        return pipe.micro_batch_size // self.dp

    @property
    def units(self) -> list[str]:
        return [ly.name for ly in self.model.layers]

    def header_lines(self) -> list[str]:
        """What the export says about itself: source plan, exact or the changes, predicted step times."""
        a, b = self.original_estimate.step_time_s, self.estimate.step_time_s
        lines = [f"autopar {__version__} export of {os.path.basename(self.source)} for {self.caps.name}: "
                 f"{label(self.shape)}, {self.model.name}, {self.world} devices, global batch "
                 f"{self.plan.global_batch_size}, seq {self.model.seq_len}, {self.plan.precision}"]
        record = self.plan.search.get("profile")
        if isinstance(record, dict):
            lines.append(f"cost figures from {record.get('kind', 'profile')} {record.get('path', '?')} "
                         f"(sha256 {str(record.get('sha256'))[:12]})")
        if not self.changes:
            lines.append(f"exact: the plan as searched; predicted step {b:.4g} s")
            return [printable(x) for x in lines]
        lines.append(f"NOT the plan as searched: {self.caps.name} cannot express it; the closest plan it can "
                     f"express changes {len(self.changes)} field(s):")
        lines += [f"  {c}" for c in self.changes]
        lines.append(f"predicted step {b:.4g} s vs {a:.4g} s for the original ({(b / a - 1) * 100:+.1f}%), peak "
                     f"{self.estimate.max_memory_gib:.1f} GiB per device (same cost model)")
        return [printable(x) for x in lines]


def printable(text: str) -> str:
    """``text`` with every control character (a newline in a file name) as ``?``: safe in a comment line."""
    return "".join(c if c.isprintable() else "?" for c in text)


def bash_array(argv: list[str]) -> list[str]:
    """``ARGS=(`` ... ``)``: the shell-quoted arguments of ``argv``, an option and its values a line."""
    lines, i = ["ARGS=("], 0
    while i < len(argv):
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--") and ":" not in argv[j]:
            j += 1
        lines.append("  " + " ".join(shlex.quote(x) for x in argv[i:j]))
        i = j
    return lines + [")"]


def prepare(path: str | os.PathLike, target: str, profile: str | None = None, exact: bool = False) -> Export:
    """The export of the plan at ``path`` for ``target`` (re-based on ``profile`` when given).

    ``exact``: refuse (AutoparError, one line naming what is inexpressible and the closest alternative)
    instead of exporting a changed plan. Raises AutoparError for an unknown target, a precision the
    target does not train in, or a plan none of whose expressible neighbours is valid and fits.
    """
    caps = caps_of(target)
    planned = load_planned(path, profile, check=True)
    plan, model, params = planned
    validate_plan(plan, model)
    if plan.precision not in caps.precisions:
        raise AutoparError("plan.precision", f"{target} has no {plan.precision} training ({target} takes "
                           f"{', '.join(caps.precisions)})", f"search the plan again with --precision "
                           f"{caps.precisions[0]}")
    est = estimate_plan(plan, model, params)
    if profile is None:
        check_predicted(plan, est)  # the stored figures must be what the plan estimates to now
    chosen, _ = closest(plan, model, params, caps)
    moved = changes(plan, chosen.plan)
    if exact and moved:
        alt = f"{label(chosen.shape)}, predicted step {chosen.estimate.step_time_s:.4g} s vs {est.step_time_s:.4g} s"
        what = ", ".join(c.split(":")[0] for c in moved)
        raise AutoparError(f"export --to {target}", f"cannot express the plan exactly ({what} would change; "
                           f"{moved[0]}); closest: {alt}",
                           "drop --exact to export the closest plan with its changes listed")
    chosen.plan.predicted = chosen.estimate.predicted()
    return Export(str(path), caps, model, plan, est, chosen.plan, chosen.estimate, chosen.shape, moved)
