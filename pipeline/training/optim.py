"""The optimizer and its learning-rate schedule: SGD or AdamW without weight decay on norms and
biases; linear warm-up, then cosine decay (a pure function of the step)."""

from __future__ import annotations

import math

import torch

from pipeline.core.config import params_source
from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import TrainParams


def get_lr(step: int, total_steps: int, warmup_steps: int, peak_lr: float) -> float:
    """Linear warm-up from 0 to peak over `warmup_steps`, then cosine decay to 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: torch.nn.Module, tcfg: TrainParams) -> torch.optim.Optimizer:
    """SGD (Nesterov-free, momentum) or AdamW; no weight decay on norms and biases.

    Fused kernels on CUDA: one launch for all parameters, and with a GradScaler the
    inf check and the skipped step stay on the device (the unfused path reads found_inf
    with .item(), a sync every step)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    params = decay + no_decay
    fused = True if params and all(p.is_cuda for p in params) else None
    if tcfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=tcfg.lr, momentum=tcfg.momentum, fused=fused)
    if tcfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.momentum, 0.999), fused=fused)
    raise PipelineError(params_source("train.optimizer"),
                        f"train.optimizer must be sgd|adamw, got '{tcfg.optimizer}'")
