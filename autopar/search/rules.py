"""The one registry of pruning rules: every count the searches keep, with what it means.

``Rule`` is a ``str`` enum whose values are the keys written to plan files, ``--json`` and the figures
snapshot, so renaming a member never changes a file; changing a value does. Counting sites index
their ``Counter`` with members (a typo is an AttributeError, not a new silent key), and
``rule_counts`` turns a counter into the plain-string dict that files hold (YAML's SafeDumper cannot
write Enum objects). Rules that only remove *equivalent* or *dominated* candidates, or candidates
that cannot beat a plan already found, never change the optimum.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class Rule(str, Enum):
    """A pruning rule: its value is the key counted, ``description`` says what it drops and why."""

    description: str

    def __new__(cls, value: str, description: str) -> Rule:
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.description = description
        return obj

    def __str__(self) -> str:  # the key, on every Python version (3.11 and 3.12 format mixins differently)
        return self.value

    # -- decision tree level 1: pipeline degree (homogeneous search) -------------------------
    PP_NOT_DIVIDING_DEVICES = ("pp-not-dividing-devices", "PP degree must divide the device count")
    PP_MORE_STAGES_THAN_LAYERS = ("pp-more-stages-than-layers", "every stage needs at least one unit")
    PP_STAGE_STRADDLES_NODE = ("pp-stage-straddles-node", "stages hold whole nodes or an equal share of one")
    # -- (pp, micro-batch) configurations, visited by lower bound (homogeneous search) -------
    CONFIG_LOWER_BOUND = ("config-lower-bound",
                          "a (pp, micro-batch) setting whose lower bound is above the best plan found")
    CONFIG_NO_STRATEGY = ("config-no-strategy", "some unit has no legal strategy in that setting")
    # -- per-layer strategies (both planners) ------------------------------------------------
    TP_NOT_DIVIDING_STAGE = ("tp-not-dividing-stage", "TP degree must divide the stage's device count")
    TP_CROSSES_NODE = ("tp-crosses-node", "TP groups stay inside one node (TP traffic needs the node fabric)")
    TP_ABOVE_MAX = ("tp-above-max", "TP degree above the search's --max-tp")
    TP_NOT_DIVIDING_UNIT = ("tp-not-dividing-unit",
                            "TP degree must divide the unit's heads, KV heads, FFN width and vocab")
    TP_UNSUPPORTED = ("tp-unsupported", "the unit has no TP plan, so it runs with tp = 1")
    DP_NOT_DIVIDING_MICROBATCH = ("dp-not-dividing-microbatch", "each data-parallel rank needs a whole number of samples")
    ZERO_WITHOUT_DP = ("zero-without-dp", "with dp = 1 every ZeRO stage equals plain replication (kept: zero 0)")
    SELECTIVE_EQUALS_NONE = ("selective-equals-none", "the unit has no attention core to recompute (kept: ckpt none)")
    OP_UNMODELLED = ("op-unmodelled", "op-level checkpointing is not modelled for the unit (a zoo / HF embedding "
                     "or head; kept: none, selective, full)")
    SP_NO_EFFECT = ("sp-no-effect",
                    "sequence parallel changes nothing for a unit with no sequence-shardable activations")
    EP_NOT_DIVIDING = ("ep-not-dividing", "an expert-parallel degree of an MoE unit must divide its dp and its "
                       "expert count")
    MOE_TP_WITHOUT_SP = ("moe-tp-without-sp", "an MoE unit with tp > 1 runs with sequence parallel (its experts run "
                         "per token, divided over TP by the sequence; Megatron-core's MoE layer refuses TP without it)")
    EP_WITH_TP = ("ep-with-tp", "an MoE unit with tp > 1 runs with ep = 1 (tensor and expert parallel on one unit "
                  "are not supported together)")
    ZERO_OVERLAP_DOMINATES = ("zero-overlap-dominates",
                              "ZeRO-1/2 with and without zero_overlap hold the same memory: when the backward "
                              "hides no step-level sync (overlap_sync 0) the overlapped one is never slower (kept: "
                              "zero_overlap); when nothing hides its collectives (overlap_grad_reduce and "
                              "overlap_param_gather 0) it is never faster (kept: without)")
    ASYNC_TP_NO_NVLINK = ("async-tp-no-nvlink", "async TP micro-pipelines SP collectives over NVIDIA symmetric "
                          "memory (P2P over NVLink); on other devices it would run as plain TP (kept: async_tp off)")
    DOMINATED = ("dominated", "slower and at least as large as another strategy with the same layout")
    CP_NOT_DIVIDING_STAGE = ("cp-not-dividing-stage", "TP degree x context-parallel degree must divide the "
                             "stage's device count")
    SP_WITH_CP = ("sp-with-cp", "the runtime does not combine sequence parallel with context parallel")
    # -- layer ranges a stage could run (homogeneous search; counted per range end dropped) --
    RANGE_OVER_MEMORY = ("range-over-memory",
                         "stage layer ranges that cannot fit: their least memory exceeds the device budget "
                         "(a longer range from the same first layer needs more)")
    RANGE_OVER_INCUMBENT = ("range-over-incumbent",
                            "stage layer ranges that cannot beat the best plan: a shorter range from the same "
                            "first layer already costs m x its per-micro-batch time >= the best step time")


def describe(key: str) -> str:
    """The description of the rule counted under ``key``; ValueError for a key no rule has."""
    return Rule(key).description


def rule_counts(pruned: Mapping) -> dict[str, int]:
    """``pruned`` as a plain ``{key: count}`` dict sorted by key, for plan files and results.

    Raises ValueError when a key is not a registered rule: an unregistered count would print with
    no description.
    """
    # Rule("x") accepts a member or its plain key; both hash alike, so a mapping never holds both.
    return dict(sorted((Rule(key).value, int(n)) for key, n in pruned.items()))
