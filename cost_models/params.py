"""CostParams: the tunable constants of the cost model, with defaults and where they come from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

GIB = 1024**3
# The measured achievable matmul efficiency (catalogue ``mamf``) of the GPU ``CostParams.eff_max`` was set on: the
# A100 SXM's bf16 figure (catalogue A100-80G; a test keeps them equal). A GPU whose figure is known runs its
# GEMMs at eff_max x its figure / this one (``GPUType.matmul_factor``), so eff_max keeps its meaning and the GPUs
# without a figure their speed; ``cost_models.compute.layer_efficiency`` splits eff_max at this figure into the
# matmuls and the rest of a layer.
REFERENCE_MAMF = 0.869
# Fields whose value a framework states relative to the default's meaning: act_traffic is the default's fused
# kernels' traffic, and an eager framework's counted figure a multiple of it. A fitted value of such a field is a
# fit of the default's quantity, so it scales a stated value by fitted / default (``CostParams.with_fitted``).
RELATIVE_FIELDS = ("act_traffic",)


@dataclass(frozen=True)
class CostParams:
    """Constants the formulas use. A measured profile (``autopar profile``) replaces the defaults.

    eff_max: achieved fraction of peak FLOPS for large work. Large GEMMs reach 70-80% of dense
        peak, but attention, norms and elementwise kernels pull a whole layer down to about 60%:
        Megatron-LM reports 52-56% MFU for GPT-3-scale models on A100 (Korthikanti et al.,
        2205.05198) after its communication and bubbles. A profile replaces this. What the tiles and
        waves of smaller matmuls leave idle comes on top, on a GPU whose SM count is known
        (``cost_models.gemm_shapes``). It is the A100's: a GPU whose large matmuls reach a different measured
        share of their peak (catalogue ``mamf``) runs at eff_max times its share over the A100's
        (``GPUType.matmul_factor``). At a precision whose matmuls run slower than half precision's (plain FP32
        on the CUDA cores), the part of eff_max beyond the matmuls keeps its half-precision time
        (``compute.layer_efficiency``).
    layer_overhead_s: fixed time per layer call (forward; backward pays it twice): kernel launches
        and dispatch, ~10 kernels of ~5 us on a GPU. It is what makes small per-rank work slow. Fused
        blocks launch about that many; an eager Llama block launches 35-38 kernels forward and 62-70 backward
        (``benchmarks/eager_traffic.py``), which matters only where the CPU, not the GPU, sets the pace.
    param_bytes: bytes of a parameter in the compute dtype (bf16).
    grad_comm_bytes: bytes per gradient element on the wire (fp32 reduction, the Megatron/FSDP2 default).
    grad_bytes: bytes per gradient element in the gradient buffer a rank holds (fp32: Megatron-LM
        accumulates bf16 training's gradients in an fp32 main_grad buffer, DeepSpeed's BF16 optimizer
        in fp32 too; fp16 training keeps fp16 gradients and an fp32 copy with the optimizer).
    state_bytes: model-state bytes per parameter with mixed-precision Adam, unsharded
        (2 bf16 param + 4 fp32 grad + 4 master + 4 m + 4 v = 18, Megatron-LM's figure for bf16
        params with fp32 gradients; ZeRO divides the shardable parts: ``memory.model_state_bytes``).
    opt_bytes_touched: bytes read+written per owned parameter by the optimizer step (memory bound).
    overlap_sync: fraction of a layer's backward that can hide its step-level gradient sync. 0 by
        default: autopar's runtime sums each unit's gradients once, after the step's last backward
        (runtime/grad_sync.py), and so did Megatron-LM before ``--overlap-grad-reduce`` (2023) and
        DeepSpeed's BF16 optimizer (BLOOM); frameworks that reduce gradient buckets during backward
        (PyTorch DDP, Megatron-core with overlap) hide part of it: calibrate it for them.
    overlap_zero3: fraction of compute that can hide ZeRO-3 parameter gathers (prefetch).
    zero3_comm_eff: fraction of the modelled collective bandwidth (``cost_models.collectives``) that
        ZeRO-3's per-micro-batch parameter gathers and gradient reduce-scatters reach. 1 by default:
        one NCCL collective per unit, as FSDP2 issues them (torchtitan's FSDP runs on 8-512 H100 are
        predicted with it). Older runtimes gather per parameter and reach far less: DeepSpeed's
        ZeRO-3 in the PTD-P paper's Table 2 (174.6B and 529.6B on 768-2240 A100) ran at a flat step
        time however many GPUs shared the work, about 16 GB/s per GPU for its gathers, against the
        ~125 GB/s the hierarchical ring formula gives a 3.6 GB gather there. A rate bound by the framework's
        code rather than its links is ``zero3_rate_gbps``, a framework fact; ``autopar calibrate`` fits this one.
    zero3_rate_gbps: GB/s a rank's ZeRO-3 gathers and gradient reduce-scatters move at most, whatever its links
        (the bytes it receives in a gather, sends in a reduce-scatter): a framework's own bound. 0 (none) by default:
        FSDP2 issues one NCCL collective per unit, which runs at its links' rate. DeepSpeed's ZeRO-3 of 2021 gathered
        each sub-module's parameters in Python-side all-gathers that called torch.cuda.synchronize and copied the
        result out (microsoft/DeepSpeed PR #1188, 2021-06): on one 8x A100 NVLink node a 5.1B BERT's forward took
        470 ms under ZeRO-3 against 60 ms under ZeRO-2 (DeepSpeed issue #1174, 0.3.16), 8.9 GB received per GPU in
        the 410 ms more, 22 GB/s, where NCCL's ring gathers at over 200 GB/s; a measured file states it for such a
        framework (``framework``).
    overlap_grad_reduce: fraction of one micro-batch's backward that hides the gradient reduce-scatter
        of a ZeRO-1 unit with ``zero_overlap`` (Megatron's ``--overlap-grad-reduce``: buckets are
        reduce-scattered as the step's last backward completes them, behind the backward of earlier
        layers; cost_models/zero_options.py). 1 by default, as ``overlap_zero3``: Megatron-core and
        torchtitan report the bucketed collectives hidden except the last bucket; calibrate it.
    overlap_param_gather: fraction of one micro-batch's forward that hides the parameter all-gather
        of a ZeRO-1/2 unit with ``zero_overlap`` (Megatron's ``--overlap-param-gather``: started by
        the optimizer step, waited for by the unit's first forward of the next step). 1 by default.
    async_tp_overlap: fraction of an async-TP unit's matmul time under which its micro-pipelined
        sequence-parallel collectives run (``cost_models.async_tp``, which states what stays exposed).
        1 by default (the ideal decomposition, as ``overlap_zero3``: what stays exposed is
        ``cost_models.async_tp``'s structural remainder). PyTorch's async-TP write-up (Wang et al.,
        "[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch",
        dev-discuss.pytorch.org, 2024) shows transfers overlapping
        the decomposed matmuls almost fully, less the chunked matmuls' slowdown (wave quantisation, which
        its ping-pong ordering reduces; ``async_tp.chunked_wave_times`` prices the chunks' waves where the
        GPU's SM count is known) and their memory-bandwidth contention; no figure of the write-up gives the
        fraction. torchtitan's 2025-06 H100 vanilla / async pairs
        (benchmarks/data) are scored with the default, not fitted to it; ``autopar calibrate`` fits it from
        such pairs (0.4-0.6 bracket the 8B runs' measured savings).
    link_efficiency: fraction of a link's line rate (catalogue and cluster-file bandwidths are line rates,
        one direction) that the collective formulas of ``cost_models.collectives`` run at. 0.8: NCCL's ring
        collectives on a whole node reach 78-82% of the unidirectional link (stas00/ml-engineering
        network/README.md @ 744d01e1, "Real network throughput" and "SHARP": nccl-tests / all_reduce_bench
        busbw at 8-16 GiB: 8x A100 NVLink 3 234.9 of 300 GB/s, 8x H200 ring 367.6 of 450, H200 all-gather
        361.4 and reduce-scatter 362.9, 8x B200 ring 682.2 of 900; "the ~80% rule of thumb"; across nodes
        73% of a B200 node's 50 GB/s EFA per GPU). Measured links (a profile's, ``autopar calibrate
        --nccl-tests``' fitted ones through these same formulas) and ``comm_fit`` rows need no such factor:
        a profile sets it to 1. Point-to-point sends stay at the line rate.
    collective_call_s: seconds every formula-priced collective call costs besides its wire time (the formulas'
        per-step latency and per-byte time). 0 by default: NCCL's own model charges each call a base latency
        before its steps (NVIDIA/nccl src/graph/tuning.cc @ 01afd20, ``baseLat``: 8.4 us for the ring with
        the Simple protocol), but the node classes' per-step latencies already reproduce measured small
        all-reduces with it inside (benchmarks/collective_fidelity.py: 8 H200 at 32 KiB-1 MiB measured 38-46 us,
        charged 42-47 us; 8.4 us more would charge 51-56 us). What a framework adds per call comes on top and can
        be far more: AMP's Megatron 1.1.5 runs on T4 and V100 fit 1.0-1.5 ms a call (benchmarks/
        measured_fidelity.py, held out), and Sailor's per-layer profiles of Megatron-DeepSpeed read 0.11-0.55 ms a TP
        all-reduce on NVLink nodes (benchmarks/sailor_layer_profile.py); ``autopar calibrate`` fits it from runs with
        many small collectives (TP at small micro-batches) next to runs with few. A measured fit (``comm_fit``) includes it already.
    reserve_gib: framework reserve per device (CUDA context, NCCL buffers, allocator fragmentation).
    act_mem_factor: bytes the caching allocator holds per byte of activations the model counts (saved
        for backward, and a layer's transient working set): above 1 where freed activation blocks of
        mixed sizes cannot be reused (fragmentation) and the framework makes activation-sized
        temporaries the layer formulas do not name. 1 by default (the lean count); ``autopar calibrate``
        fits it, with ``reserve_gib``, from published peak memory (``calibrate.table``, target memory).
    loss_copies: logits-sized tensors the loss's backward holds per rank at its peak, in units of the fp32
        logits a unit's ``loss_bytes`` states (``memory_terms.loss_copies``); 0: PyTorch's ``F.cross_entropy``
        on fp32 logits (what autopar's runtime and torchtitan run): 3, 4 under TP loss parallel. Megatron-LM's
        in-place vocab-parallel cross entropy holds 1.5 (``memory_terms``).
    grad_accum_bytes: HBM bytes per parameter a rank holds that the framework's gradient accumulation moves
        after every micro-batch's backward, beyond what the backward writes. 0 by default: autograd (autopar's
        runtime) and Megatron's fused main_grad accumulate inside the backward's own kernels. DeepSpeed's
        BF16_Optimizer on its pipeline engine moves 18 (microsoft/DeepSpeed runtime/pipe/engine.py
        _exec_backward_pass calls optimizer.update_hp_grads after each micro-batch's backward; bf16_optimizer.py
        update_hp_grads runs hp_grad.add_(lp.grad.to(float32)) per parameter: the cast reads 2 and writes 4
        bytes, the add reads 4 + 4 and writes 4), a framework fact a measured file states (``framework``).
    grad_cast_bytes: bytes per element of the copy of one parameter's gradient that such an accumulation makes
        at a time: the same ``lp.grad.to(float32)`` is a new fp32 tensor of that parameter's size, freed after
        its add, so the largest parameter a rank holds (a TP shard of a vocabulary embedding) sets a transient
        of 4 bytes per element (``transient.cast_bytes``). 0 by default (nothing casts per parameter).
    tp_boundary_gather: all-gathers of a sequence-parallel unit's output per forward (and reduce-scatters of its
        gradient in backward) that keep unit boundaries at full sequence length: 1 in autopar's runtime; 0 where the
        residual stream stays sequence-sharded between blocks (Megatron-LM / Megatron-Core, Transformer Engine), a
        framework fact a measured file states.
    tp_async_backward: how much of the column-parallel layers' backward matmul time Megatron's asynchronous
        backward TP collectives hide behind (``cost_models.tp_backward``): 0 by default (autopar's runtime runs them
        synchronously); 1 for a Megatron-LM / Transformer Engine run, which a measured file states.
    tied_copy_one_stage: whether a unit that uses a tensor of an earlier unit on its own stage (tied
        embeddings: the LM head's weight is the token embedding's) holds its own copy of it
        (``LayerSpec.tied_params``): 1 in autopar's runtime, which places and shards every unit on its own and
        gives the later one a clone (runtime/ties.py ``untie``); 0 where one tensor serves both (Megatron-LM's
        ``setup_embeddings_and_output_layer``, DeepSpeed's pipeline engine building one module per
        ``TiedLayerSpec`` key and stage). On another stage the copy exists either way.
    tied_sync_full: how the copies' gradients are summed once per step (``cost_models.ties``): 1 (autopar's
        ``TiedGrads``) rebuilds each copy's full gradient over its shards and all-reduces it over every rank
        holding a copy; 0 (Megatron's embedding group, DeepSpeed's tie group) all-reduces each rank's TP shard
        with the rank holding the same shard on the other stage.
    linear_input_share: the share of the activations' bytes at which a linear layer keeps its input for the
        weight gradient. 1 by default: the input itself (PyTorch's nn.Linear, autopar's runtime, torchao's
        Float8Linear, which saves its high-precision input and casts again in backward). Transformer Engine's
        FP8 linear layers keep the FP8 cast instead (NVIDIA/TransformerEngine v1.8 module/linear.py and
        layernorm_linear.py: ``save_for_backward`` of the FP8 ``inputmat`` / ``ln_out`` under fp8): 0.5 of
        bf16's bytes, a framework fact a measured file states (``LayerSpec.cast_input_delta``).
    act_traffic: HBM bytes the memory-bound kernels of a layer (norms, activations, softmax, dropout,
        residual adds, their gradients) move per byte of activations the layer saves for backward,
        forward and backward together (a third in forward, two thirds in backward, like FLOPs). Each
        saved byte is written once in forward and read once in backward, and its gradient is written
        and read once: about 3. This is what makes a small model on a low-bandwidth GPU (GPT-2 medium
        on a T4: 320 GB/s) and eager attention's s x s scores slow beyond their FLOPs; GEMMs are
        ``eff_max``'s business. A measured profile times whole units, so it sets this to 0. 3 is the floor
        fused kernels reach (Megatron's, Transformer Engine's, torch.compile's); a block run op by op moves
        several times more (11.4 for torchtitan's and transformers' eager Llama blocks, 12.4-14.3 for fms's,
        counted from the ops they dispatch: ``benchmarks/eager_traffic.py``), which a measured file states
        for its framework.

    Measured refinements (empty by default; ``autopar profile`` fills them, see autopar/profile):
    slot_overhead_s: fixed cost of one micro-batch on one stage, a slot of the pipeline schedule: its
        step of the schedule, the p2p handshake and synchronisation, the framework's dispatch. The
        critical path has m + pp - 1 of them. 0 by default: it is the framework's, not the hardware's,
        and differs by orders of magnitude (DeepSpeed's pipeline engine costs tens of ms a slot in the
        public AMP and BLOOM runs); ``autopar calibrate`` fits it from measured runs.
    eff_by_kind: ((layer kind, tp, zero, eff_max, layer_overhead_s), ...): the compute curve of one
        kind of layer unit (embedding, block, head, ...) at one TP degree, run plainly (zero 0) or
        sharded by ZeRO-3 (zero 3: the framework's per-call cost besides the gathers), where it was
        measured; a missing (tp, zero) falls back to (tp, 0), then (1, 0); other kinds use the fields above.
    comm_fit: ((collective, group size, alpha_s, beta_s_per_byte), ...): measured ``alpha + beta * bytes``
        of a collective ("allreduce", "allgather", "reduce_scatter") over a group of that size inside
        one node; it replaces the formula (and its gamma term) for such groups.
    state_table: ((a, b) for ZeRO stages 0..3): model-state bytes per parameter ``a + b / d`` on a DP
        group of d > 1 (d = 1 holds stage 0's a + b), as the runtime really holds them.
    step_overhead_per_unit_s: what a runtime step costs per layer unit besides its compute and the
        terms above (loss reduction, flattening gradients for the sync, zeroing them, the runner).
    moe_imbalance: tokens the most loaded rank of an expert-parallel group computes (and exchanges), as a
        multiple of the even share, with dropless routing (``cost_models.moe``). 1.1 by default, an assumption
        at the low end of the capacity factors (1.0 to 2.0) Switch Transformer trains with (Fedus et al.
        2101.03961, sec. 2.2: the per-expert load a dropping router tolerates), for a router that has
        trained; Megatron-Core's MoE guide (megatron/core/transformer/moe/README.md @ 022bcb5a, "OOM caused by
        token distribution imbalance") reports severe imbalance only in the first 100-300 steps from scratch.
        No published dropless run states its max/mean load; measured step times can fit it.
    """

    eff_max: float = 0.60
    layer_overhead_s: float = 5e-5
    param_bytes: int = 2
    grad_comm_bytes: int = 4
    grad_bytes: int = 4
    state_bytes: int = 18
    opt_bytes_touched: int = 36
    overlap_sync: float = 0.0
    overlap_zero3: float = 1.0
    zero3_comm_eff: float = 1.0
    zero3_rate_gbps: float = 0.0
    overlap_grad_reduce: float = 1.0
    overlap_param_gather: float = 1.0
    async_tp_overlap: float = 1.0
    tp_boundary_gather: float = 1.0
    tp_async_backward: float = 0.0
    tied_copy_one_stage: float = 1.0
    tied_sync_full: float = 1.0
    link_efficiency: float = 0.8
    collective_call_s: float = 0.0
    reserve_gib: float = 1.0
    act_mem_factor: float = 1.0
    linear_input_share: float = 1.0
    loss_copies: float = 0.0
    act_traffic: float = 3.0
    slot_overhead_s: float = 0.0
    eff_by_kind: tuple = ()
    comm_fit: tuple = ()
    state_table: tuple = ()
    step_overhead_per_unit_s: float = 0.0
    grad_accum_bytes: float = 0.0
    grad_cast_bytes: float = 0.0
    moe_imbalance: float = 1.1

    def __post_init__(self) -> None:
        # Plan and profile files give lists; tuples keep the params hashable (cache keys).
        for name in ("eff_by_kind", "comm_fit", "state_table"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or any(not isinstance(v, tuple) for v in value):
                object.__setattr__(self, name, tuple(tuple(v) for v in value))

    def efficiency(self, kind: str, tp: int = 1, zero: int = 0) -> tuple[float, float]:
        """(eff_max, layer_overhead_s) for layer units of ``kind`` at TP degree ``tp`` and ZeRO stage ``zero``."""
        found = {(t, z): (e, o) for k, t, z, e, o in self.eff_by_kind if k == kind}
        z = 3 if zero == 3 else 0
        return found.get((tp, z)) or found.get((tp, 0)) or found.get((1, 0)) or (self.eff_max, self.layer_overhead_s)

    def has_curve(self, kind: str) -> bool:
        """Whether ``eff_by_kind`` holds a measured compute curve for layer units of ``kind`` (which then
        times their matmuls whole: no modelled tile or wave term is added to it)."""
        return any(k == kind for k, *_ in self.eff_by_kind)

    def measured_comm(self, collective: str, group_size: int) -> tuple[float, float] | None:
        """(alpha s, beta s/byte) measured for ``collective`` over ``group_size`` ranks of one node, or None."""
        for c, n, alpha, beta in self.comm_fit:
            if c == collective and n == group_size:
                return alpha, beta
        return None

    def with_fitted(self, fitted: dict) -> CostParams:
        """These parameters with a calibration's ``fitted`` fields: a field of ``RELATIVE_FIELDS`` scales this
        value by fitted / the default (an eager framework's stated traffic keeps its ratio to fused kernels when
        a fit moves theirs; at the default it is the fitted value), any other field is replaced."""
        default = CostParams()
        return replace(self, **{k: getattr(self, k) * v / getattr(default, k) if k in RELATIVE_FIELDS else v
                                for k, v in fitted.items()})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostParams:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def reserve_bytes(self) -> float:
        return self.reserve_gib * GIB
