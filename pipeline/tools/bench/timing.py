"""Timing helpers shared by the bench sections: device sync, a temporary torch thread count,
and the matmul peaks (MKL's and, on the CPU, oneDNN's) that compute efficiency is measured
against."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Iterator

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """torch.set_num_threads(n) inside the block (None: unchanged)."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of an n x n x n torch.matmul (2 n^3 FLOPs) over `reps` timed runs.

    On CUDA each run is 20 matmuls queued back to back and timed by CUDA events: one
    2048^2 matmul takes tens of microseconds there, about what a host timer and a sync
    cost, so a single timed call reports launch latency rather than the peak."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up (allocations, BLAS thread pool)
    sync(device)
    if device.type == "cuda":
        best, inner = math.inf, 20
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                torch.matmul(a, b)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / inner)
        return 2.0 * n ** 3 / best
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def conv1x1_peak(n: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of the same n x n x n product as a 1x1 convolution on the CPU (oneDNN's
    GEMM, channels_last: (1, n, 1, n) input, n x n weight; 2 n^3 FLOPs)."""
    x = torch.randn(1, n, 1, n).contiguous(memory_format=torch.channels_last)
    w = torch.randn(n, n, 1, 1)
    torch.nn.functional.conv2d(x, w)  # warm-up (primitive creation, thread pool)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.nn.functional.conv2d(x, w)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best
