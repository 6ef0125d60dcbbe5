"""Timing on a GPU (or, for a CPU check of a script, on the CPU): synchronized wall times,
CUDA-event times per call, and the kernels of one call by device time (torch.profiler)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common.token2wav_options import use_precision


def sync() -> None:
    """Wait for the GPU (nothing on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn: Callable[[], Any]) -> float:
    """Wall ms of one call of `fn`, synchronized on a GPU."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return 1000 * (time.perf_counter() - t0)


def best_ms(fn: Callable[[], Any], n: int = 5) -> float:
    """The least of `n` synchronized wall times of `fn` (ms)."""
    return min(wall_ms(fn) for _ in range(n))


def timed(fn: Callable[[], Any], steps: int) -> float:
    """ms per call of `fn` (CUDA events; wall on a CPU), after 2 warm-up calls."""
    for _ in range(2):
        fn()
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        return (time.perf_counter() - t0) * 1000 / steps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def kernels(fn: Callable[[], Any], top: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    """One call of `fn` under torch.profiler: how many CUDA kernels it launched, their device
    time, and the `top` kernels by total device time (on a CPU: the aten ops by CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        sync()
    rows = []
    want = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    for e in prof.key_averages():
        dev = e.self_device_time_total if cuda else e.self_cpu_time_total
        if dev > 0 and e.device_type == want and (cuda or e.key.startswith("aten::")):
            rows.append({"name": e.key[:110], "count": e.count, "ms": dev / 1000})
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows)
    say(f"  kernels: {sum(r['count'] for r in rows)} launches, {total:.1f} ms of device time")
    for r in rows[:top]:
        say(f"    {r['ms']:8.2f} ms  x{r['count']:<5d} {r['name']}")
    return {"launches": sum(r["count"] for r in rows), "device_ms": total, "top": rows[:top]}


def open_device(cpu: bool, matmul: str) -> torch.device | None:
    """cuda:0, or the CPU for a smoke run, with what a diffusion stage of that `float32_matmul`
    runs with (matmuls and cuDNN convolutions); None when there is no CUDA device."""
    if not cpu and not torch.cuda.is_available():
        print("no CUDA device (use --cpu for the smoke run)")
        return None
    use_precision(matmul)
    return torch.device("cpu" if cpu else "cuda:0")
