"""Trace any ``nn.Module`` into a ModelSpec on the meta device: no real memory, no real compute.

The module itself is not copied: ``torch.func.functional_call`` runs it with meta stand-ins for its
parameters and buffers (cast to the training dtype), so a model far larger than host memory traces in
milliseconds. One forward + backward runs under ``FlopCounterMode`` and ``saved_tensors_hooks``.

Units: the module's top-level children in execution order, containers (``nn.Sequential``,
``nn.ModuleList``, ``nn.ModuleDict``) expanded recursively into their children, each named by its FQN
(``embed``, ``layers.3``, ``head``; ``0``, ``1``, ... for an ``nn.Sequential``). A module without
children is one unit named ``model``. Per unit, per sample (divided by the example's batch size):

* ``flops``: forward FLOPs. Work done in the root's own ``forward`` between units (glue such as a
  tied ``x @ embed.weight.T``) is charged to the unit that ran last (before the first unit: the first).
* ``params``: each parameter once (tied weights go to the first unit that runs with them); the root's
  own parameters (e.g. a CLS token) go to the first unit; units that never run hand theirs to the
  preceding unit in registration order.
* Saved activations: every tensor autograd saves, each storage counted once (by the unit that saved
  it first), parameters and buffers excluded, split by a stated rule: attention scores (seq x seq tensors
  that come from Q K^T, ``OpTrace.scores``) -> ``act_attn_bytes``; norm inputs and outputs, ``nn.Dropout``
  masks and integer tensors (ids) -> ``act_seq_bytes``; the rest -> ``act_tp_bytes``. For a unit without a TP
  plan the split has no effect (it runs at tp = 1). Bytes are what the eager meta kernels save (unfused
  norms: beyond the zoo's fused formulas) but for a dropout mask (drawn in the input's dtype off CUDA; counted
  as CUDA's bool, 1 byte an element) and SDPA, whose meta math fallback keeps s x s scores where every device
  calls a fused kernel (CUDA flash / memory-efficient / cuDNN in 16 and 32 bits, CPU flash in any dtype;
  CUDA's fp64 is the math path, traced for tests only): counted as the kernel's query, key, value, output,
  mask and fp32 log-sum-exp (``_Recorder.sdpa_saves``).
* ``attn_core_flops``: FLOPs of batched matmuls and SDPA kernels (``bmm``, ``baddbmm``,
  ``*attention*``): what selective checkpointing recomputes.
* ``op`` (what ckpt ``op`` keeps and recomputes): from the unit's matmuls and SDPA calls in execution
  order (``trace_ops``): its input, the 1st, 3rd, ... matmul outputs and SDPA outputs are kept;
  row-parallel matmuls are the ``rowwise`` modules of its TP plan.
* ``gemms`` / ``gemm_rows``: the same matmul records, those over every token of the sample, as
  ``[seq, k] @ [k, n]`` shapes (``trace_ops.gemm_facts``), for the cost model's tile and wave quantisation.
* ``boundary_bytes``: bytes of the unit's output (of the last unit: its input, since its output goes to the loss
  on the same stage, which reads it as fp32 logits, ``loss_bytes``, and keeps one copy: in ``act_tp_bytes``).

TP plans come from ``autopar.units.unit_tp_info`` (the model's own tables): a unit it gives a
plan is named ``<family>.<embed|block|head>`` (a key of ``autopar.models.TP_PLANS``), gets its TP
divisors, ``tp_params``, ``tp_local_params`` and the Megatron collectives of its kind (``trace_tp``). Any
other unit runs with tp = 1 only, since the runtime has no plan for it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode

from autopar.errors import AutoparError
from autopar.modelspec.spec import STATS_BYTES, LayerSpec, ModelSpec
from autopar.modelspec.trace_moe import ExpertFlops, unit_moe
from autopar.modelspec.trace_ops import OpTrace, SdpaTrace, gemm_facts, op_facts, storage_id
from autopar.modelspec.trace_tp import tp_facts
from autopar.modelspec.unit_params import unit_params, unit_ties
from autopar.units import discover
from cost_models.gemm_shapes import flops_per_token

NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
DTYPES = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}
def unit_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The candidate units of ``module`` in registration order: (FQN, module) (``autopar.units.discover``).

    A module object registered at two positions of a Sequential is a unit at both (as ``wrap``
    runs it); elsewhere containers are expanded and each module counted once.
    """
    return discover(module, repeats=isinstance(module, nn.Sequential))


def _is_norm(mod: nn.Module) -> bool:
    return isinstance(mod, NORMS) or type(mod).__name__.endswith("Norm")


def _nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))


class _Recorder:
    """Per-unit forward FLOPs, saved bytes and boundaries while the traced model runs."""

    def __init__(self, units: dict[nn.Module, list[str]], counter: FlopCounterMode, seq: int, skip: set[int]):
        self.units, self.counter, self.skip = units, counter, skip
        self.order: list[str] = []  # units by first execution
        self.stack: list[str] = []  # units running now (a unit may call another)
        self.last: str | None = None  # the unit that ran last: glue is charged to it
        self.pending = self._new(0, 0)  # glue before the first unit
        self.stats: dict[str, dict] = {}
        self.mods: list[nn.Module] = []  # innermost module stack (all modules)
        self.norm_out: set[int] = set()
        self.ops = OpTrace(lambda: (self.stack[-1] if self.stack else None, self.mods[-1] if self.mods else None), seq)
        self.mark = self._read()

    @staticmethod
    def _new(in_bytes: int, out_bytes: int | None) -> dict:
        return {"flops": 0.0, "attn": 0.0, "tp": 0, "seq": 0, "attn_b": 0, "in": in_bytes, "out": out_bytes}

    def _read(self) -> tuple[float, float]:
        counts = self.counter.flop_counts.get("Global", {})
        attn = sum(v for k, v in counts.items() if "bmm" in str(k) or "attention" in str(k))
        return float(sum(counts.values())), float(attn)

    def target(self) -> str | None:
        return self.stack[-1] if self.stack else self.last

    def _charge(self) -> None:
        total, attn = self._read()
        df, da = total - self.mark[0], attn - self.mark[1]
        self.mark = (total, attn)
        t = self.target()
        st = self.stats[t] if t else self.pending
        st["flops"] += df
        st["attn"] += da

    def pre(self, mod, args, kwargs) -> None:
        self._charge()
        names = self.units[mod]  # a module at two positions: its first call is the first position, and so on
        name = next((n for n in names if n not in self.stats and n not in self.stack), names[-1])
        if name not in self.stats:
            self.order.append(name)
            self.stats[name] = self._new(_nbytes((args, kwargs)), None)
            if len(self.order) == 1:
                for k in ("flops", "attn", "tp", "seq", "attn_b"):
                    self.stats[name][k] += self.pending[k]
        self.stack.append(name)

    def post(self, mod, args, kwargs, out) -> None:
        self._charge()
        name = self.stack.pop()
        if self.stats[name]["out"] is None:
            self.stats[name]["out"] = _nbytes(out)
            self.stats[name]["out_floats"] = sum(t.numel() for t in tree_flatten(out)[0]
                                                 if isinstance(t, torch.Tensor) and t.is_floating_point())
        self.last = name

    def any_pre(self, mod, args) -> None:
        self.mods.append(mod)

    def any_post(self, mod, args, out) -> None:
        if self.mods and self.mods[-1] is mod:
            self.mods.pop()
        if _is_norm(mod):
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            self.norm_out.update(storage_id(t) for t in outs)
            self.ops.keep += outs

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not self.ops.in_sdpa:  # inside SDPA: the meta math fallback's tensors
            self._record(t)
        return t

    def sdpa_saves(self, tensors: tuple, stats_bytes: float) -> None:
        """What the fused SDPA kernel a device runs keeps (flash, memory-efficient, cuDNN, CPU flash): its
        query, key, value and output (TP-sharded heads), its mask, and fp32 statistics (the attention core,
        as the zoo's flash formula counts them)."""
        q, k, v, out, mask = tensors
        for t in (q, k, v, out):
            self._record(t, "tp")
        if isinstance(mask, torch.Tensor):
            self._record(mask, "seq")  # whole on every TP rank
        t_name = self.target()
        (self.stats[t_name] if t_name else self.pending)["attn_b"] += stats_bytes

    def _record(self, t: torch.Tensor, bucket: str | None = None) -> None:
        """Charge ``t``'s storage once, to the unit running now, in ``bucket`` (None: by the module rule)."""
        sid = storage_id(t)
        if sid in self.skip:
            return
        self.skip.add(sid)
        self.ops.keep.append(t)
        t_name = self.target()
        st = self.stats[t_name] if t_name else self.pending
        mask = sid in self.ops.masks  # a dropout mask: CUDA keeps it as bool
        st[bucket or self._bucket(t, sid)] += t.numel() if mask else t.untyped_storage().nbytes()

    def _bucket(self, t: torch.Tensor, sid: int) -> str:
        """The module docstring's rule: attention scores, sequence-sharded tensors, or the TP-sharded rest."""
        inner = self.mods[-1] if self.mods else None
        if sid in self.ops.scores:
            return "attn_b"
        if (inner is not None and (_is_norm(inner) or isinstance(inner, nn.Dropout))) or sid in self.norm_out \
                or sid in self.ops.masks or not (t.is_floating_point() or t.is_complex()):
            return "seq"  # a dropout mask off the scores: a hidden dropout's (Korthikanti's act_seq)
        return "tp"


def _first_tensor(x) -> torch.Tensor | None:
    return next((t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)), None)


def infer_seq_len(example_input) -> int:
    """Tokens per sample of an example: dim 1 of token ids [b, s] or of activations [b, s, h]; else 1."""
    x = _first_tensor(example_input)
    if x is None or x.dim() < 2:
        return 1
    if x.dim() == 2 and x.is_floating_point():
        return 1  # [batch, features]
    return int(x.shape[1]) if x.dim() <= 3 else 1  # images [b, c, h, w]: no token axis


def _to_meta(dtype: torch.dtype | None):
    def conv(t):
        if not isinstance(t, torch.Tensor):
            return t
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
        return torch.empty(t.shape, dtype=cast, device="meta")
    return conv


def _trace_error(name: str, err: BaseException) -> AutoparError:
    msg = f"{type(err).__name__}: {err}".splitlines()[0][:240] if str(err) else type(err).__name__
    if "Expected inputs of BF16 type" in msg:  # torch's meta grouped_mm (MoE experts, e.g. HF Mixtral): bf16 only
        return AutoparError("model", f"tracing {name} on the meta device failed ({msg}): torch's meta kernel of "
                            "grouped_mm takes bf16 only", "trace in bf16 (dtype_bytes=2, the CLI's --precision bf16)")
    return AutoparError("model", f"tracing {name} on the meta device failed ({msg})",
                        "make forward() run on meta tensors (create tensors with device=x.device, register cached "
                        "tensors as buffers) and give an example_input() that matches forward()'s arguments")


def spec_from_module(module: nn.Module, example_input, name: str | None = None, seq_len: int | None = None,
                     dtype_bytes: int | None = None, source: str = "") -> ModelSpec:
    """Trace ``module`` on ``example_input`` (tensor, tuple of args or dict of kwargs) into a ModelSpec.

    Nothing is allocated: parameters, buffers and inputs are replaced by meta tensors (floating ones
    cast to ``dtype_bytes``: 2 -> bf16, 4 -> fp32, 8 -> fp64; default: the module's own dtype). The
    module is left as it was (training mode restored, hooks removed). Any failure inside the model is
    an AutoparError naming ``model``.
    """
    if not isinstance(module, nn.Module):
        raise AutoparError("model", f"expected a torch.nn.Module, got {type(module).__name__}",
                           "return an nn.Module from the factory")
    name = name or type(module).__name__
    if type(module).__module__.startswith("transformers."):  # checked without importing transformers
        raise AutoparError("model", f"{type(module).__name__} is a transformers model: its own children are not the "
                           "units wrap runs (wrap converts it to embed / layers / head)",
                           "trace autopar.models.from_transformers(model), or give its config.json")
    if dtype_bytes is not None and dtype_bytes not in DTYPES:
        raise AutoparError("dtype_bytes", f"must be 2, 4 or 8 to trace, got {dtype_bytes!r}", "use 2 for bf16 training")
    own = next((p for p in module.parameters() if p.is_floating_point()), None)
    dtype = DTYPES[dtype_bytes] if dtype_bytes is not None else None
    dbytes = dtype_bytes or (own.element_size() if own is not None else 4)
    first = _first_tensor(example_input)
    batch = int(first.shape[0]) if first is not None and first.dim() >= 1 and first.shape[0] > 0 else 1
    seq = seq_len if seq_len is not None else infer_seq_len(example_input)

    params = dict(module.named_parameters())
    meta_state = {k: _to_meta(dtype)(p).requires_grad_(p.requires_grad) for k, p in params.items()}
    meta_state.update({k: _to_meta(dtype)(b) for k, b in module.named_buffers()})
    skip = {storage_id(t) for t in meta_state.values()}
    units = unit_modules(module)
    unit_of: dict[nn.Module, list[str]] = {}
    for n, m in units:
        unit_of.setdefault(m, []).append(n)
    inputs = tree_map(_to_meta(dtype), example_input)
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else \
        ((tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((inputs,), {}))

    was_training = module.training
    handles = []
    counter = FlopCounterMode(display=False)
    expert_flops = ExpertFlops(module, counter)  # MoE experts: meta routing counts nothing meaningful
    try:
        module.train()
        with counter:
            rec = _Recorder(unit_of, counter, seq, skip)
            for m in unit_of:
                handles.append(m.register_forward_pre_hook(rec.pre, with_kwargs=True))
                handles.append(m.register_forward_hook(rec.post, with_kwargs=True))
            handles.append(nn.modules.module.register_module_forward_pre_hook(rec.any_pre))
            handles.append(nn.modules.module.register_module_forward_hook(rec.any_post))
            ops = rec.ops
            with saved_tensors_hooks(rec.pack, lambda t: t), SdpaTrace(ops, rec.sdpa_saves), ops:
                out = torch.func.functional_call(module, meta_state, args, kwargs)
                rec._charge()
            fwd_total = float(counter.get_total_flops())
            grads = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            if grads:
                sum(g.float().sum() for g in grads).backward()
            bwd_total = float(counter.get_total_flops()) - fwd_total
    except AutoparError:
        raise
    except Exception as err:  # anything the user's model raises on meta tensors
        raise _trace_error(name, err) from err
    finally:
        for h in handles:
            h.remove()
        expert_flops.remove()
        module.train(was_training)
    if not rec.order:
        raise AutoparError("model", f"{name} ran none of its units ({', '.join(n for n, _ in units[:4])})",
                           "call the child modules from forward()")
    return _build(module, name, units, rec, ops, seq, batch, dbytes, source,
                  {"forward_flops": fwd_total / batch, "backward_flops": bwd_total / batch, "batch": batch},
                  expert_flops)


def _build(module, name, units, rec: _Recorder, ops: OpTrace, seq, batch, dbytes, source, trace_meta,
           expert_flops: ExpertFlops) -> ModelSpec:
    mods = dict(units)
    per_unit = unit_params(module, units, rec.order)
    tied, shared = unit_ties(units, rec.order)
    layers = []
    for i, n in enumerate(rec.order):
        st, mod = rec.stats[n], mods[n]
        is_last = i == len(rec.order) - 1
        boundary = (st["in"] if is_last else (st["out"] or 0)) / batch
        # the loss's fp32 logits, one copy kept (as the zoo's heads; memory_terms prices the rest of its backward)
        loss = st.get("out_floats", 0) * STATS_BYTES / batch if is_last else 0.0
        ps = per_unit[n]
        count = sum(p.numel() for p in ps)
        tp = tp_facts(module, n, mod, ps, (st["out"] or 0) / batch, st["in"] / batch)
        moe = unit_moe(mod, seq, boundary, dbytes)
        flops = st["flops"] / batch
        if moe is not None:  # the experts' FLOPs as dropless top-k routing runs them (trace_moe)
            flops += moe.expert_flops - expert_flops.counted(mod) / batch
        layers.append(LayerSpec(
            n, tp.kind, params=count, tp_params=tp.tp_params, tp_local_params=tp.local_params, flops=flops, moe=moe,
            attn_core_flops=st["attn"] / batch, act_tp_bytes=st["tp"] / batch + loss, act_seq_bytes=st["seq"] / batch,
            act_attn_bytes=st["attn_b"] / batch, boundary_bytes=boundary, loss_bytes=loss, tp_divisors=tp.divisors,
            tp_comm_bytes=tp.comm_bytes, tp_collectives=tp.collectives, tp_plan=tp.plan, tied_params=tied[n],
            shared_params=shared[n], op=op_facts(ops.events.get(n, []), st["in"] / batch, st["flops"] / batch, tp.rows,
                                                 batch),
            **_gemms(ops.events.get(n, []), tp.rows, batch, seq, flops)))
    ran = set(rec.order)
    meta = {"traced": trace_meta, "unused_units": [n for n, _ in units if n not in ran]}
    return ModelSpec(name=name, seq_len=seq, layers=layers, dtype_bytes=dbytes, source=source, meta=meta,
                     **_shape_facts(module))


def _gemms(events: list, rows: set[nn.Module], batch: int, seq: int, flops: float) -> dict:
    """``gemms`` and ``gemm_rows`` of a unit, or nothing where its FLOPs (MoE: as routed) hold fewer."""
    gemms, gemm_rows = gemm_facts(events, rows, batch, seq)
    return {"gemms": gemms, "gemm_rows": gemm_rows} if gemm_rows * flops_per_token(gemms) <= flops else {}


# ModelSpec shape fields <- config attribute names (autopar.models, HF, nanoGPT spellings)
CONFIG_FIELDS = {"hidden": ("dim", "hidden_size", "n_embd"), "num_heads": ("n_heads", "num_attention_heads", "n_head"),
                 "num_kv_heads": ("n_kv_heads", "num_key_value_heads"), "ffn": ("ffn_hidden", "intermediate_size"),
                 "vocab": ("vocab_size",)}


def _shape_facts(module: nn.Module) -> dict[str, int]:
    """Shape facts for the CLI from ``module.config`` if it has one, else from its first nn.Embedding."""
    cfg = getattr(module, "config", None)
    facts = {f: next((v for a in attrs if isinstance(v := getattr(cfg, a, None), int)), 0)
             for f, attrs in CONFIG_FIELDS.items()}
    emb = next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)
    if emb is not None:
        facts["vocab"] = facts["vocab"] or emb.num_embeddings
        facts["hidden"] = facts["hidden"] or emb.embedding_dim
    return facts
