"""Inference backends behind one loader: `load_predictor(path, backend)` -> (model, meta),
where `model(x)` maps a normalised float batch (B, C, H, W) to coordinates (B, K, 2) and
`meta` is the checkpoint dict (torch) or the exported JSON (onnx), with the same keys the
prediction code reads (model_config, schema, crop, epoch, presence: for a checkpoint, that of
the presence stage's file beside it when made for it, `checkpoint.with_presence_file`).

* torch: the checkpoint's model in eval mode with every BatchNorm folded into the conv
  before it (one op less per layer) and in channels_last memory format (`prepare_torch`).
* onnx: an onnxruntime session (`pipeline.inference.onnx_runtime.OnnxModel`) of an exported `.onnx`
  file, or of a `.pt` checkpoint: its exported twin `<name>.onnx` beside it when that was
  exported from this very checkpoint (sha256 in the JSON), else exported in memory.

Several checkpoints together (crops, TTA, the fold ensemble, calibration) are a
`pipeline.inference.landmarker.Landmarker`."""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from pipeline.core.device import amp_dtype
from pipeline.core.digest import file_sha256
from pipeline.core.errors import PipelineError
from pipeline.formats.checkpoint import load_model, with_presence_file
from pipeline.formats.onnx_export import export_meta, json_path, onnx_bytes, read_export
from pipeline.inference.onnx_runtime import OnnxModel, load_onnx, onnx_available

log = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx")
PRECISIONS = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}  # autocast dtype -> name


def fuse_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of an eval-mode model with each BatchNorm2d that directly follows a Conv2d /
    ConvTranspose2d among a module's children folded into that conv (the BN becomes
    Identity). Valid for the layers here, whose forward applies their children in
    registration order (ConvNormAct: conv -> bn -> act; UpConv: up -> conv -> bn -> act;
    the shortcut Sequential: pool -> conv -> bn); tests check the outputs match."""
    model = copy.deepcopy(model).eval()
    for parent in model.modules():
        names = list(parent._modules)
        for a, b in zip(names, names[1:]):
            conv, bn = parent._modules[a], parent._modules[b]
            if (isinstance(conv, (nn.Conv2d, nn.ConvTranspose2d)) and isinstance(bn, nn.BatchNorm2d)
                    and bn.track_running_stats and conv.out_channels == bn.num_features):
                parent._modules[a] = fuse_conv_bn_eval(conv, bn, transpose=isinstance(conv, nn.ConvTranspose2d))
                parent._modules[b] = nn.Identity()
    return model


class ChannelsLast(nn.Module):
    """A model run in channels_last (NHWC) memory format. On the CPU this sends batch-1
    convolutions to oneDNN instead of the im2col fallback PyTorch picks for small
    NCHW inputs, the faster path at batch 1 (`pipeline bench`, docs/benchmarks.md)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.to(memory_format=torch.channels_last)
        self.config = getattr(model, "config", None)
        if hasattr(model, "forward_maps"):
            self.forward_maps = self._forward_maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.contiguous(memory_format=torch.channels_last))

    def _forward_maps(self, x: torch.Tensor):
        # nn.Module attributes are typed Tensor | Module; bound only when the model has forward_maps
        return self.model.forward_maps(x.contiguous(memory_format=torch.channels_last))  # type: ignore[operator]


def prepare_torch(model: nn.Module) -> nn.Module:
    """The torch backend's inference model: BatchNorm folded, channels_last."""
    return ChannelsLast(fuse_batchnorm(model)).eval()


def resolve_backend(path: str | os.PathLike, backend: str | None) -> str:
    """An .onnx file is always run by onnxruntime; otherwise `backend` (default torch)."""
    if backend not in (None, *BACKENDS):
        raise PipelineError(None, f"--backend must be one of {', '.join(BACKENDS)}, got '{backend}'")
    if Path(path).suffix == ".onnx":
        return "onnx"
    return backend or "torch"


def model_runtime(meta: dict[str, Any], amp: str, device: torch.device) -> str:
    """How a loaded model predicts, as test.npz records it beside its checkpoint's identity:
    'torch <precision>' (the autocast of `amp`, predict.amp, on `device`: fp32, bf16 or fp16),
    or 'onnx <precision> <sha256>' for an onnxruntime session: the export's precision (fp32,
    or int8 after `export --int8`) and the sha256 of the ONNX model that ran (an exported
    file, or the checkpoint exported in memory)."""
    if "onnx_sha256" in meta:
        return f"onnx {meta.get('precision', 'fp32')} {meta['onnx_sha256']}"
    return f"torch {PRECISIONS[amp_dtype(amp, device, 'predict.amp')]}"


def load_predictor(path: str | os.PathLike, backend: str | None = "torch", device: str | torch.device = "cpu",
                   schema=None, threads: int | None = None) -> tuple[Any, dict[str, Any]]:
    """(model, meta) ready to predict with; see the module docstring."""
    backend = resolve_backend(path, backend)
    if backend == "torch":
        model, ckpt = load_model(path, device, schema=schema)
        return prepare_torch(model), with_presence_file(path, ckpt)

    if not onnx_available():
        raise PipelineError(path, "--backend onnx needs onnxruntime: pip install 'pipeline[onnx]'")
    if torch.device(device).type != "cpu":
        log.info("onnx backend runs on the CPU (onnxruntime CPU provider), not %s", device)
    path = Path(path)
    if path.suffix == ".onnx":
        return load_onnx(path, schema, threads)
    twin = path.with_suffix(".onnx")
    if twin.is_file() and json_path(twin).is_file():
        try:
            meta = read_export(twin, schema)
        except PipelineError as e:
            log.warning("ignoring %s (%s)", twin, e.problem)
        else:
            if meta.get("checkpoint_sha256") == file_sha256(path, "checkpoint not found", "checkpoint"):
                log.info("onnx backend: %s (exported from %s)", twin, path.name)
                return OnnxModel(twin, meta["model_config"], threads), with_presence_file(path, meta)
            log.info("%s was exported from another checkpoint: exporting %s again in memory", twin, path.name)
    model, ckpt = load_model(path, "cpu", schema=schema)
    model_config = ckpt["model_config"]
    data = onnx_bytes(model, int(model_config["input_size"]), int(model_config["in_chans"]))
    meta = export_meta(with_presence_file(path, ckpt), data, path, hasattr(model, "forward_maps"))
    return OnnxModel(data, model_config, threads), meta
