"""Human-readable tables for the CLI: the plan, its predicted figures, and the baselines."""

from __future__ import annotations

from autopar.estimate.plan_cost import PlanEstimate
from autopar.plan.rules import id_ranges
from autopar.plan.schema import Plan, Stage


def param_count(n: float) -> str:
    """A parameter count with three significant digits and its unit: ``6.74B``, ``12.3M``, ``1.2K``, ``87``
    (never ``0.00B`` for a small model)."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale * 0.9995:  # 999,950 prints as 1.00M, not 1000K
            v = n / scale
            return f"{v:.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{n:.0f}"


def stage_strategies(stage: Stage) -> str:
    """Runs of equal strategies: 'embed tp1 z1 | layers.0-15 tp2 z2 sp | head tp2 z0'."""
    runs: list[tuple[str, str, str]] = []
    for ly in stage.layers:
        label = ly.strategy.short()
        if runs and runs[-1][2] == label:
            runs[-1] = (runs[-1][0], ly.name, label)
        else:
            runs.append((ly.name, ly.name, label))
    parts = []
    for first, last, label in runs:
        name = first if first == last else f"{first}..{last}"
        parts.append(f"{name} {label}")
    return " | ".join(parts)


def plan_shape(plan: Plan) -> str:
    pipes = plan.pipelines
    if len(pipes) == 1:
        p = pipes[0]
        chunks = f" x {p.virtual_stages} chunks" if p.virtual_stages > 1 else ""
        return (f"1 pipeline x {p.num_stages} stage(s){chunks}, {p.num_microbatches} micro-batches of "
                f"{p.micro_batch_size} ({plan.schedule})")
    shapes = ", ".join(f"{len(p.stages)}st/{p.batch_share}smp" for p in pipes)
    return f"{len(pipes)} pipelines [{shapes}] ({plan.schedule})"


def plan_table(plan: Plan, est: PlanEstimate) -> str:
    rows = [("pipe", "stage", "devices", "layers", "strategies", "ms/mb", "GiB")]
    for pi, (pipe, stages) in enumerate(zip(plan.pipelines, est.pipelines)):
        for si, (st, se) in enumerate(zip(pipe.stages, stages)):
            rows.append((str(pi), str(si), id_ranges(st.devices, ","), str(len(st.layers)), stage_strategies(st),
                         f"{se.cost_per_microbatch_s * 1e3:.1f}", f"{se.memory_gib:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    widths[4] = min(widths[4], 70)
    lines = []
    for r in rows:
        cells = [c if i != 4 or len(c) <= 70 else c[:67] + "..." for i, c in enumerate(r)]
        lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip())
    return "\n".join(lines)


def figures_line(est: PlanEstimate) -> str:
    return (f"step {est.step_time_s:.4g} s | {est.tokens_per_s:,.0f} tokens/s | tps {est.tps:,.0f} | "
            f"tflops {est.tflops:.1f} | MFU {est.mfu * 100:.1f}% | peak memory {est.max_memory_gib:.1f} GiB")


def baseline_table(best: PlanEstimate, base: dict) -> str:
    rows = [("baseline", "shape", "step s", "tokens/s", "MFU", "GiB", "autopar speed-up")]
    for name, v in base.items():
        if v is None:
            rows.append((name, "-", "does not fit", "-", "-", "-", "-"))
            continue
        plan, est = v
        rows.append((name, _baseline_shape(plan), f"{est.step_time_s:.4g}", f"{est.tokens_per_s:,.0f}",
                     f"{est.mfu * 100:.1f}%", f"{est.max_memory_gib:.1f}", f"{est.step_time_s / best.step_time_s:.2f}x"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def _baseline_shape(plan: Plan) -> str:
    pipe = plan.pipelines[0]
    st = pipe.stages[0]
    blk = max(st.layers, key=lambda ly: ly.strategy.tp).strategy
    n = len(st.devices)
    return (f"pp{len(pipe.stages)} tp{blk.tp} dp{n // blk.tp} z{blk.zero} {blk.ckpt}"
            f"{' sp' if blk.sp else ''} m{pipe.num_microbatches}")
