"""Device, AMP and memory-format choices, made once from params."""

from __future__ import annotations

import contextlib
import logging

import torch

from pipeline.core.config import params_source
from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise PipelineError(params_source("train.device", "predict.device"),
                            f"device: unknown device '{name}'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PipelineError(params_source("train.device", "predict.device"),
                            f"device '{name}' requested but CUDA is not available")
    return dev


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for fp32.

    `auto` enables AMP only on CUDA: on CPUs without native bf16 matmul (AVX2-only,
    like our CI machine) autocast makes training hundreds of times slower."""
    if amp not in ("auto", "on", "off", "bf16", "fp16"):
        raise PipelineError(params_source("train.amp"), f"amp must be auto|on|off|bf16|fp16, got '{amp}'")
    if amp == "off":
        return None
    if amp == "auto" and device.type != "cuda":
        return None
    if amp in ("auto", "on") and device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type != "cuda":
        log.warning("amp=%s on %s: autocast on CPU is usually far slower than fp32", amp, device)
    return torch.float16 if amp == "fp16" else torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def use_channels_last(setting: str, device: torch.device) -> bool:
    if setting not in ("auto", "on", "off"):
        raise PipelineError(params_source("train.channels_last"), f"channels_last must be auto|on|off, got '{setting}'")
    return setting == "on" or (setting == "auto" and device.type == "cuda")
