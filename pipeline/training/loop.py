"""The training loop: `train_one_epoch` (AMP, gradient clipping, the lr schedule per step, a stop
on the first non-finite loss), `train_steps` of a built setup, and `evaluate` (validation in
original-image pixels, as predict scores out of fold)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from pipeline.core.device import autocast
from pipeline.core.errors import PipelineError
from pipeline.core.faults import maybe_kill
from pipeline.inference.tta import predict_original
from pipeline.keypoints.metrics import mae, nme
from pipeline.training.optim import get_lr


@dataclass
class StepState:
    step: int  # optimizer steps taken so far
    total_steps: int
    warmup_steps: int
    peak_lr: float


class NonFiniteLoss(PipelineError):
    pass


def train_one_epoch(model, loader, loss_fn, optimizer, scaler, state: StepState, device, amp,
                    grad_clip: float = 0.0, desc: str = "train", progress: bool = True,
                    read_every: int | None = None, ema=None) -> dict[str, float]:
    """One pass over `loader` (a DeviceLoader, or anything iterable with len() and
    `wait_s`). `progress` False hides the bar (DDP ranks other than 0).

    The step losses stay on the device and are read every `read_every` steps and at the
    end of the epoch: by default every 10 steps on CUDA (each read waits for the device; a
    read per step would stall the CUDA queue every step) and every step elsewhere, where a
    read costs nothing, so no step runs after a non-finite loss. A non-finite loss stops
    training at the next read, naming the step where it appeared; the caller has not yet
    checkpointed this epoch, so the last good checkpoint is kept. `ema` (a ModelEma) is
    updated after every optimizer step."""
    if read_every is None:
        read_every = 10 if torch.device(device).type == "cuda" else 1


    model.train()
    running = _RunningLoss(state.step)
    seen, t0, lr = 0, time.perf_counter(), 0.0
    batches = iter(loader)
    try:
        # None: no bar where stderr is not a terminal (a log file would fill with its redraws)
        bar = tqdm(batches, total=len(loader), desc=desc, unit="batch", leave=False, dynamic_ncols=True,
                   disable=None if progress else True)
        for images, target, _ in bar:  # (B, C, H, W) float, (B, K, 2) input px
            lr = get_lr(state.step, state.total_steps, state.warmup_steps, state.peak_lr)
            for g in optimizer.param_groups:
                g["lr"] = lr
            with autocast(device, amp):
                if loss_fn.needs_maps:  # the heatmap regulariser also needs the soft-argmax maps
                    pred, probs = model(images, return_maps=True)  # (B, K, 2), (B, K, h, w)
                else:
                    pred, probs = model(images), None  # (B, K, 2) input px
            loss, _ = loss_fn(pred.float(), target, probs, tuple(images.shape[-2:]))
            seen += images.shape[0]
            running.add(loss, images.shape[0])
            if running.pending() >= read_every:  # before backward: read each step, no step runs on a NaN
                running.read()
                bar.set_postfix(loss=f"{running.mean():.3f}", ips=f"{seen / (time.perf_counter() - t0):.1f}")
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                if grad_clip > 0:  # clip true gradients; otherwise step() unscales (fused: in its kernel)
                    scaler.unscale_(optimizer)
            else:
                loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            if ema is not None:
                ema.update()
            state.step += 1
            maybe_kill(state.step)  # tests only: PIPELINE_KILL_AT_STEP (pipeline/core/faults.py)
        running.read()
    finally:
        close = getattr(batches, "close", None)
        if close is not None:  # stops a DeviceLoader's producer thread on every way out
            close()
    elapsed = time.perf_counter() - t0
    return {"loss": running.mean(), "images_per_s": seen / elapsed,
            "data_wait_frac": loader.wait_s / elapsed if elapsed > 0 else 0.0, "lr": lr}


class _RunningLoss:
    """The epoch's mean loss, with the step losses kept on the device until read()."""

    def __init__(self, first_step: int):
        self.step = first_step  # the optimizer step of the first unread loss
        self.unread: list[tuple[torch.Tensor, int]] = []  # (0-d loss on the device, batch size)
        self.total, self.count = 0.0, 0

    def add(self, loss: torch.Tensor, batch: int) -> None:
        self.unread.append((loss.detach(), batch))

    def pending(self) -> int:
        return len(self.unread)

    def read(self) -> None:
        """Bring the unread losses to the host (one device sync); raise NonFiniteLoss at
        the first one that is not finite."""
        if not self.unread:
            return
        values = torch.stack([loss.float() for loss, _ in self.unread]).tolist()
        for value, (_, batch) in zip(values, self.unread):
            if not math.isfinite(value):
                raise NonFiniteLoss(None, f"loss became {value} at step {self.step}; training stopped, "
                                          "the last good checkpoint is kept (lower train.lr?)")
            self.total += value * batch
            self.count += batch
            self.step += 1
        self.unread.clear()

    def mean(self) -> float:
        return self.total / max(1, self.count)


def evaluate(model, cache, val_idx: np.ndarray, ckpt_like: dict, batch_size: int, device) -> dict[str, float]:
    """Validation MAE and NME in original-image pixels, scored as `pipeline predict` scores
    the fold out of fold without TTA: the same crops, resize and decode, under `predict.amp:
    auto`'s precision (fp32 on a CPU) whatever precision trained the weights, so that best.pt
    is chosen by, and metrics.json holds, the figures its OOF predictions give (up to the
    rounding of predict's BatchNorm folded into the convolutions)."""
    if len(val_idx) == 0:
        return {"mae": float("nan"), "nme": float("nan")}
    pred = predict_original(model, ckpt_like, cache.faces[val_idx], cache.crop_to_orig[val_idx], "none",
                            batch_size, device, amp="auto", amp_key="predict.amp")["final"]
    truth = cache.keypoints_orig[val_idx]
    eyes = cache.schema.eyes
    # None without eyes (or eyes out of range); a PipelineError naming the cache when no
    # face's eye corners are apart
    err = nme(pred, truth, eyes, where=cache.path)
    return {"mae": float(mae(pred, truth)), "nme": float("nan") if err is None else float(err)}


def train_steps(setup, loader, desc: str = "train", progress: bool = True) -> dict[str, float]:
    """`train_one_epoch` of a `TrainSetup`'s network over `loader`."""
    return train_one_epoch(setup.net, loader, setup.loss_fn, setup.optimizer, setup.scaler, setup.state,
                           setup.device, setup.amp, setup.cfg.train.grad_clip, desc=desc, progress=progress,
                           ema=setup.ema)
