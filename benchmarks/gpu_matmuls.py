"""Matmul microbenchmarks for benchmarks/gpu_single_device.py: the device's ceilings, a Llama 3 8B block's
matmuls per TP degree, and the cost of a shallow reduction, each next to the wave model
(cost_models/gemm_shapes.py). On a GPU a product is timed back to back between CUDA events."""

from __future__ import annotations

import statistics
import time

import torch

from cost_models.gemm_shapes import wave_utilisation


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, dev: torch.device, warmup: int, reps: int) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn`` after ``warmup`` calls (synchronised around each)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        sync(dev)
        t = time.perf_counter()
        fn()
        sync(dev)
        out.append(time.perf_counter() - t)
    return out


def matmul_time(a: torch.Tensor, b: torch.Tensor, reps: int = 30) -> float:
    """Seconds per ``a @ b``: on a GPU ``reps`` products back to back between two device events (no host
    round trip per product, which adds tens of microseconds to a small one); on the CPU the median call."""
    if a.device.type != "cuda":
        return statistics.median(timed(lambda: a @ b, a.device, 3, 10))
    out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(a.device)
    start.record()
    for _ in range(reps):
        torch.matmul(a, b, out=out)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def ceilings(dev: torch.device, quick: bool) -> dict:
    n = 1024 if quick else 8192
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
    t = statistics.median(timed(lambda: a @ b, dev, 3, 10))
    src = torch.randn(2**26 if quick else 2**30, device=dev, dtype=torch.bfloat16)  # 2 GiB on a GPU
    dst = torch.empty_like(src)
    tc = statistics.median(timed(lambda: dst.copy_(src), dev, 3, 10))
    return {"matmul_n": n, "matmul_tflops": 2 * n**3 / t / 1e12,
            "copy_gbps": 2 * src.numel() * src.element_size() / tc / 1e9}


def gemms(dev: torch.device, quick: bool) -> list[dict]:
    """The 8B block's matmuls per TP degree: forward, input-gradient and weight-gradient shapes."""
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
    mats = {"qkv": (4096, 6144, False), "o": (4096, 4096, True), "gate": (4096, 14336, False),
            "up": (4096, 14336, False), "down": (14336, 4096, True)}
    rows = []
    for tokens in ([256] if quick else [8192, 16384]):
        for tp in ([1] if quick else [1, 2, 4, 8]):
            for name, (k, n, row_par) in mats.items():
                k_, n_ = (k // tp, n) if row_par else (k, n // tp)
                if quick:
                    k_, n_ = k_ // 16, n_ // 16
                for kind, (r, c_, d) in {"fwd": (tokens, n_, k_), "dgrad": (tokens, k_, n_),
                                         "wgrad": (k_, n_, tokens)}.items():
                    a = torch.randn(r, d, device=dev, dtype=dt)
                    b = torch.randn(d, c_, device=dev, dtype=dt)
                    t = matmul_time(a, b)
                    rows.append({"tokens": tokens, "tp": tp, "matmul": name, "pass": kind, "rows": r, "cols": c_,
                                 "depth": d, "tflops": 2 * r * c_ * d / t / 1e12,
                                 "wave_utilisation": wave_utilisation(r, c_, d, sms)})
    return rows


def depth_sweep(dev: torch.device, quick: bool) -> list[dict]:
    """Matmuls whose output fills the SMs many times over, at reduction depths 128 .. 16384, and at few rows:
    what a shallow reduction (a narrow row-parallel shard, a weight gradient over few tokens) costs per FLOP."""
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
    n = 512 if quick else 8192
    shapes = [(n, n, d) for d in (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192, 16384)]
    shapes += [(r, 4096, 4096) for r in (256, 512, 1024, 2048, 4096)]
    rows = []
    for r, c_, d in shapes:
        a = torch.randn(r, d, device=dev, dtype=dt)
        b = torch.randn(d, c_, device=dev, dtype=dt)
        t = matmul_time(a, b)
        rows.append({"rows": r, "cols": c_, "depth": d, "tflops": 2 * r * c_ * d / t / 1e12,
                     "wave_utilisation": wave_utilisation(r, c_, d, sms)})
        print(f"depth {r:5d} x {c_:5d} x {d:5d}: {rows[-1]['tflops']:6.0f} TFLOP/s")
    return rows
