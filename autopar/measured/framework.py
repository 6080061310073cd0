"""``framework``: what a measured file states about the software its runs used, as cost parameters.

Published runs ran on their own framework, whose memory differs from autopar's runtime (PyTorch's
cross entropy, Megatron-style fp32 main gradients): Megatron-LM's in-place vocabulary-parallel cross
entropy holds 1.5 logits copies at its backward, not PyTorch's 3-4; DeepSpeed's BF16 optimizer keeps the
bf16 gradients beside a full fp32 accumulation buffer. Such facts are read from the framework's code, or
measured on other runs of that framework (DeepSpeed's 2021 ZeRO-3 gather rate, from a DeepSpeed issue), never
fitted to the file's runs, so a file may state them with their origin::

    framework:
      name: Megatron-DeepSpeed (bigscience fork), DeepSpeed BF16_Optimizer
      source: where each value comes from (repository, path, commit)
      cost_params: {loss_copies: 1.5}          # any CostParams fields, every case
      by_precision:                            # more fields for the cases at one precision
        bf16: {grad_bytes: 6, state_bytes: 20}
      by_flag:                                 # more for the cases with a flag set (compile: true)
        compile: {loss_copies: 1}

A fact that depends on the case's model as well as on the framework's code (the memory-bound traffic of an
eager block, ``benchmarks/eager_traffic.py``, differs with the model's shape) is stated on the case itself,
``cost_params: {act_traffic: 14.25}``, over the file's (``case_params``).

Every value is checked as a plan's ``cost_params`` is (``read_cost_params``); the loader puts them on
each case's plan over the precision's defaults (``measured.plan.build_plan``), so the file's runs are
estimated, scored and calibrated with them. Without the block nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.errors import AutoparError
from autopar.fields import Fields
from autopar.plan.cost_params import read_cost_params
from autopar.plan.precision import NAMES

KEYS = ("name", "source", "cost_params", "by_precision", "by_flag")
# How the published runs' frameworks keep tied embeddings (cost_models/ties.py), under any file's own framework
# block: one tensor where the embedding and the LM head share a stage; on another stage a copy, whose gradient
# each rank all-reduces with its counterpart's. Megatron-LM core_r0.8.0
# megatron/core/models/common/language_module/language_module.py ``setup_embeddings_and_output_layer`` (so
# NeMo and Megatron-Bridge); DeepSpeed's pipeline engine, which builds one module per ``TiedLayerSpec`` key
# and stage and all-reduces it in ``allreduce_tied_weight_gradients`` (runtime/pipe/module.py as vendored
# by DachengLi1/AMP @ 72eeea45; BLOOM's Megatron-DeepSpeed). The FSDP sources train untied models.
PUBLISHED_TIES = {"tied_copy_one_stage": 0.0, "tied_sync_full": 0.0}
FLAGS = ("compile",)  # case flags whose framework behaviour a file may state (torchtitan compiles its loss)
FIX = ("give framework: {name, source, cost_params: {field: value}, by_precision: {bf16: {field: value}}, "
       "by_flag: {compile: {field: value}}}")


@dataclass(frozen=True)
class Framework:
    """The cost parameters a measured file states for its framework: ``common`` for every case,
    ``by_precision[p]`` over them for the cases at precision ``p``, ``by_flag[f]`` over those for the cases
    with flag ``f`` set."""

    name: str = ""
    common: dict = field(default_factory=dict)
    by_precision: dict = field(default_factory=dict)
    by_flag: dict = field(default_factory=dict)

    def overrides(self, precision: str, flags: set[str] | frozenset = frozenset()) -> dict:
        """The stated fields for a case at ``precision`` with ``flags`` set."""
        out = {**self.common, **self.by_precision.get(precision, {})}
        for f in FLAGS:
            if f in flags:
                out.update(self.by_flag.get(f, {}))
        return out

    def states(self, flag: str) -> bool:
        """Whether the file states what ``flag`` changes (so the flag is modelled, not just noted)."""
        return bool(self.by_flag.get(flag))

    def note(self) -> list[str]:
        """One note for the run set when the file states anything."""
        if not (self.common or self.by_precision or self.by_flag):
            return []
        parts = [", ".join(f"{k} {v}" for k, v in self.common.items())] if self.common else []
        parts += [f"{p}: " + ", ".join(f"{k} {v}" for k, v in d.items())
                  for p, d in {**self.by_precision, **self.by_flag}.items()]
        return [f"framework {self.name}: " + "; ".join(parts)]


def read_framework(top: Fields) -> Framework:
    """The file's ``framework`` block (an empty Framework when it has none); AutoparError naming the field."""
    if not top.has("framework"):
        return Framework()
    f = top.sub("framework", kind="framework", keys=KEYS)
    name = f.req_str("name", fix=FIX)
    f.req_str("source", fix="say where each stated value comes from (repository, path, commit)")
    common = read_cost_params(f.raw("cost_params", {}), f.at("cost_params"), FIX, partial=True)
    by = f.sub("by_precision", keys=NAMES) if f.has("by_precision") else None
    by_precision = {p: read_cost_params(by.raw(p), by.at(p), FIX, partial=True) for p in by.doc} if by else {}
    fl = f.sub("by_flag", keys=FLAGS) if f.has("by_flag") else None
    by_flag = {k: read_cost_params(fl.raw(k), fl.at(k), FIX, partial=True) for k in fl.doc} if fl else {}
    if not (common or any(by_precision.values()) or any(by_flag.values())):
        raise AutoparError(f.at("cost_params"), "states no cost parameter", FIX)
    return Framework(name, common, by_precision, by_flag)


def case_params(c: Fields) -> dict:
    """The cost parameters a case states for itself (``cost_params``), checked as a framework's are."""
    if not c.has("cost_params"):
        return {}
    fix = "give the case cost_params: {field: value} (a CostParams field and its number), or drop it"
    own = read_cost_params(c.raw("cost_params"), c.at("cost_params"), fix, partial=True)
    if not own:
        raise AutoparError(c.at("cost_params"), "states no cost parameter", fix)
    return own
