"""Inference backends behind one loader: `load_predictor(path, backend)` -> (model, meta),
where `model(x)` maps a normalised float batch (B, C, H, W) to coordinates (B, K, 2) and
`meta` is the checkpoint dict (torch) or the exported JSON (onnx), with the same keys the
prediction code reads (model_config, schema, crop, epoch).

* torch: the checkpoint's model in eval mode with every BatchNorm folded into the conv
  before it (one op less per layer) and in channels_last memory format (`prepare_torch`).
* onnx: an onnxruntime session (`pipeline.inference.onnx_runtime.OnnxModel`) of an exported `.onnx`
  file, or of a `.pt` checkpoint: its exported twin `<name>.onnx` beside it when that was
  exported from this very checkpoint (sha256 in the JSON), else exported in memory.

`load_models` loads several checkpoints that must share a schema (the image tools), and
`predict_xml` predicts any test XML with any checkpoints (`pipeline submit --xml`)."""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from pipeline.core.config import CropParams, DataParams, PredictParams
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.formats.annotations import crop_faces, load_xml
from pipeline.formats.checkpoint import checkpoint_crop, load_model
from pipeline.formats.onnx_export import export_meta, json_path, onnx_bytes, read_export, sha256_file
from pipeline.inference.onnx_runtime import OnnxModel, load_onnx, onnx_available
from pipeline.inference.tta import predict_original
from pipeline.keypoints.schema import get_schema, schema_from_dict

log = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx")


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
    NCHW inputs (+10-20 % faces/s at batch 1, measured in `pipeline bench`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.to(memory_format=torch.channels_last)
        self.config = getattr(model, "config", None)
        if hasattr(model, "forward_maps"):
            self.forward_maps = self._forward_maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.contiguous(memory_format=torch.channels_last))

    def _forward_maps(self, x: torch.Tensor):
        return self.model.forward_maps(x.contiguous(memory_format=torch.channels_last))


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


def load_predictor(path: str | os.PathLike, backend: str | None = "torch", device: str | torch.device = "cpu",
                   schema=None, threads: int | None = None) -> tuple[Any, dict[str, Any]]:
    """(model, meta) ready to predict with; see the module docstring."""
    backend = resolve_backend(path, backend)
    if backend == "torch":
        model, ckpt = load_model(path, device, schema=schema)
        return prepare_torch(model), ckpt

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
            if meta.get("checkpoint_sha256") == sha256_file(path):
                log.info("onnx backend: %s (exported from %s)", twin, path.name)
                return OnnxModel(twin, meta["model_config"], threads), meta
            log.info("%s was exported from another checkpoint: exporting %s again in memory", twin, path.name)
    model, ckpt = load_model(path, "cpu", schema=schema)
    model_config = ckpt["model_config"]
    data = onnx_bytes(model, int(model_config["input_size"]), int(model_config["in_chans"]))
    meta = export_meta(ckpt, data, path, hasattr(model, "forward_maps"))
    return OnnxModel(data, model_config, threads), meta


def crops_for_checkpoint(faces: list, xml_path: str | os.PathLike, ckpt: dict, path: str | os.PathLike,
                         n_jobs: int, by_geometry: dict[tuple, tuple]) -> tuple[np.ndarray, np.ndarray]:
    """(crops, crop_to_orig) of the XML's faces cropped as `ckpt` was trained (its crop
    side and expand); `by_geometry` keeps them for the next checkpoint of the same geometry."""
    key = checkpoint_crop(ckpt, path)
    if key not in by_geometry:
        by_geometry[key] = crop_faces(faces, Path(xml_path).parent, key[0], key[1], n_jobs, xml_path)
    return by_geometry[key]


def predict_xml(xml_path: str | os.PathLike, checkpoints: Sequence[str | os.PathLike],
                predict_cfg: PredictParams, data_cfg: DataParams, crop_cfg: CropParams,
                backend: str = "torch") -> np.ndarray:
    """Predict any test XML with any checkpoints: (N, K, 2) original pixels, fold-averaged."""
    if not checkpoints:
        raise PipelineError(xml_path, "no checkpoints given")
    schema = get_schema(data_cfg)
    faces = load_xml(xml_path, schema, require_parts=False)
    device = resolve_device(predict_cfg.device)
    by_geometry: dict[tuple, tuple] = {}
    preds = []
    for path in checkpoints:
        model, ckpt = load_predictor(path, backend, device, schema=schema)
        crops, crop_to_orig = crops_for_checkpoint(faces, xml_path, ckpt, path, crop_cfg.n_jobs, by_geometry)
        preds.append(predict_original(model, ckpt, crops, crop_to_orig, predict_cfg.tta,
                                      predict_cfg.batch_size, device, amp=predict_cfg.amp,
                                      jitter=predict_cfg.tta_jitter)["final"])
    return np.mean(preds, axis=0)


def load_models(checkpoints: Sequence[str | os.PathLike], device, backend: str = "torch") -> list[tuple]:
    """[(model, ckpt)] for every checkpoint (.pt, or an exported .onnx: see pipeline.inference.predictor);
    all must share the first one's schema."""
    if not checkpoints:
        raise PipelineError(None, "no --checkpoint given")
    first_model, first = load_predictor(checkpoints[0], backend, device)
    schema = schema_from_dict(first["schema"])
    return [(first_model, first)] + [load_predictor(p, backend, device, schema=schema) for p in checkpoints[1:]]
