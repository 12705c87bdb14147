"""Batched inference speed: faces/s of `predict_crops` at batch 1 and batch N, plain and with
flip TTA, with the default thread count and with one thread."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from pipeline.inference.tta import predict_crops
from pipeline.models import create_model
from pipeline.tools.bench.timing import num_threads, sync


def _faces_per_s(model, faces: np.ndarray, *, input_size: int, in_chans: int, flip_perm, batch_size: int,
                 device: torch.device, min_time: float) -> float:
    """faces/s of predict_crops over `faces`, repeated until `min_time` seconds have passed."""
    def once(x):
        predict_crops(model, x, input_size=input_size, in_chans=in_chans, flip_perm=flip_perm,
                      batch_size=batch_size, device=device)

    once(faces[:batch_size])  # warm-up
    sync(device)
    n, t0 = 0, time.perf_counter()
    while True:
        once(faces)
        n += len(faces)
        sync(device)
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return n / dt


def bench_infer(preset: str, num_keypoints: int, flip_perm: Sequence[int], input_size: int, in_chans: int,
                device: torch.device, batch: int, min_time: float = 1.0, options: dict | None = None,
                single_thread: bool = True) -> dict[str, float]:
    """faces/s: {bs1, bs<batch>} x {plain, flip TTA} x {default threads, 1 thread (CPU)}."""
    torch.manual_seed(0)
    model = create_model(preset, num_keypoints, in_chans=in_chans, input_size=input_size,
                         **(options or {})).to(device).eval()
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    threads = [None, 1] if (single_thread and device.type == "cpu") else [None]
    for nt in threads:
        tag = "" if nt is None else "_1thread"
        with num_threads(nt):
            for bs in (1, batch):
                faces = rng.integers(0, 256, (max(bs, 4) if bs == 1 else bs, input_size, input_size, 3),
                                     dtype=np.uint8)
                for tta, perm in (("plain", None), ("flip", list(flip_perm))):
                    out[f"bs{bs if bs == 1 else 'N'}_{tta}{tag}"] = _faces_per_s(
                        model, faces, input_size=input_size, in_chans=in_chans, flip_perm=perm,
                        batch_size=bs, device=device, min_time=min_time)
    out["batch"] = batch
    out["input_size"] = input_size
    return out
