"""The plan rules of context parallelism (a layer's ``cp``), applied by ``plan_rules`` like the others.

Context parallelism (CP) splits every sample's sequence over ``cp`` ranks. Layout inside a stage of n
devices for a unit with tp t and cp c (Megatron's tp-cp-dp order): TP groups are consecutive chunks of
t devices (as without CP); t * c consecutive devices hold one data-parallel replica, in which the TP
groups are the CP ranks 0..c-1 (devices with equal TP coordinate form a CP group); dp = n / (t * c).
Each CP rank holds sequence chunks r and 2c-1-r of 2c equal chunks (load-balanced causal attention).

The rules:

* one cp per pipeline: every unit of every stage of a pipeline has the same cp, so the sequence stays
  split the same way through each stage and across stage boundaries (no re-split in the p2p);
* t * c divides the stage's device count (dp = n / (t * c) is checked against the micro-batch size by
  the per-layer rules);
* the sequence length divides into 2 * c equal chunks;
* ``sp`` (sequence parallel inside TP) is not combined with cp > 1: the runtime does not run them
  together (the pair is named).
"""

from __future__ import annotations

from autopar.plan.schema import Plan

Problem = tuple[str, str, str]


def cp_rules(plan: Plan) -> list[Problem]:
    """Every problem of the plan's ``cp`` fields (empty when every unit has cp 1)."""
    out: list[Problem] = []
    seq = plan.model.seq_len
    for pi, p in enumerate(plan.pipelines):
        first: tuple[int, str] | None = None  # the pipeline's cp and where it was first stated
        for si, st in enumerate(p.stages):
            n = len(st.devices)
            for li, ly in enumerate(st.layers):
                at = f"pipelines[{pi}].stages[{si}].layers[{li}]"
                s = ly.strategy
                if first is None:
                    first = (s.cp, at)
                elif s.cp != first[0]:
                    out.append((f"{at}.cp", f"cp {s.cp} differs from cp {first[0]} at {first[1]}: the sequence must "
                                "stay split the same way through the whole pipeline",
                                f"give every unit of pipeline {pi} the same cp"))
                    continue
                if s.cp == 1:
                    continue
                if s.sp:
                    out.append((f"{at}.cp", f"cp {s.cp} with sp: true: the runtime does not combine context "
                                "parallel with sequence parallel", "set sp: false on context-parallel units"))
                if n and n % (s.tp * s.cp):
                    out.append((f"{at}.cp", f"tp {s.tp} x cp {s.cp} = {s.tp * s.cp} does not divide the stage's "
                                f"{n} devices", "make tp x cp a divisor of the stage's device count"))
                if isinstance(seq, int) and seq % (2 * s.cp):
                    out.append((f"{at}.cp", f"sequence length {seq} does not split into 2 x cp = {2 * s.cp} equal "
                                "chunks (load-balanced context parallel)",
                                f"use a sequence length that is a multiple of {2 * s.cp}, or a smaller cp"))
    return out
