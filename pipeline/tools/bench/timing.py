"""Timing helpers shared by the bench sections: device sync, a temporary torch thread count,
and the matmul peak that compute efficiency is measured against."""

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
    """Best FLOP/s of an n x n x n torch.matmul (2 n^3 FLOPs) over `reps` timed runs."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up (allocations, BLAS thread pool)
    sync(device)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best
