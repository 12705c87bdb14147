"""The exported-model format: a checkpoint's whole network, soft-argmax included, as ONNX
with a dynamic batch, plus `<name>.json` beside it with everything inference needs (input
size and layout, normalisation, crop geometry, keypoint schema and flip permutation).
Its writer (`onnx_bytes`, `export_meta`; `pipeline export` in pipeline/tools/export.py saves
them) and its one reader (`read_export`); pipeline/inference/onnx_runtime.py runs it.

Contract of the exported graph (same as `model(x)` in docs/design.md):
  input  "image":  float32 (B, C, H, W), RGB (or BT.601 gray for C = 1), normalised as
                   (u8 / 255 - mean) / std, H = W = input_size
  output "coords": float32 (B, K, 2) x then y in input pixels, pixel centres at integers
  output "probs":  float32 (B, K, h, w) soft-argmax probabilities (heatmap models only)
A face is cropped from the photo with the checkpoint's crop geometry (`crop_transform(box,
expand, size)`), resized size -> input_size with antialiased bilinear (align_corners=False),
and the coordinates map back to the crop as x_crop = (x + 0.5) * size / input_size - 0.5."""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from pipeline.core.digest import file_sha256
from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file
from pipeline.formats.checkpoint import checkpoint_crop, checkpoint_label_origin, crop_stamp
from pipeline.keypoints.preprocess import MEAN, STD
from pipeline.keypoints.schema import check_schema

FORMAT = 1  # bump when the JSON or the graph contract changes
INPUT, COORDS, PROBS = "image", "coords", "probs"
OPSET = 17
REQUIRED = ("format", "onnx_sha256", "model_config", "schema", "crop", "normalisation", "input", "outputs")


def json_path(onnx_path: str | os.PathLike) -> Path:
    """The JSON that describes an exported model: model.onnx -> model.json."""
    return Path(onnx_path).with_suffix(".json")


class _Exportable(torch.nn.Module):
    """The model with both outputs of a heatmap model (coords, probs), or coords only."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.maps = hasattr(model, "forward_maps")

    def forward(self, x):
        # nn.Module attributes are typed Tensor | Module; forward_maps is a method (checked in __init__)
        return self.model.forward_maps(x) if self.maps else self.model(x)  # type: ignore[operator]


def onnx_bytes(model: torch.nn.Module, input_size: int, in_chans: int, opset: int = OPSET) -> bytes:
    """The eval-mode model as an ONNX graph (bytes) with a dynamic batch dimension.

    The TorchScript exporter (dynamo=False): it needs no onnxscript, folds the eval-mode
    BatchNorms into constants, and the only Python control flow in the models (the input
    size check, the map -> input scale in soft-argmax) depends on H and W, fixed here."""
    wrapped = _Exportable(model.eval())
    outputs = [COORDS, PROBS] if wrapped.maps else [COORDS]
    dummy = torch.zeros(2, in_chans, input_size, input_size)  # (B, C, H, W); B=2 so nothing folds B=1
    axes = {INPUT: {0: "batch"}, **{o: {0: "batch"} for o in outputs}}
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer / legacy-exporter warnings are about the above
        # the TorchScript exporter writes to a file object too; torch types `f` as a path only
        torch.onnx.export(wrapped, (dummy,), buf,  # type: ignore[arg-type]
                          dynamo=False, input_names=[INPUT], output_names=outputs,
                          dynamic_axes=axes, opset_version=opset, do_constant_folding=True)
    return buf.getvalue()


def export_meta(ckpt: dict[str, Any], onnx_data: bytes, source: str | os.PathLike | None,
                has_maps: bool) -> dict[str, Any]:
    """The JSON beside the ONNX file (also the ckpt-like dict the pipeline predicts with)."""
    model_config = ckpt["model_config"]
    c, size = int(model_config["in_chans"]), int(model_config["input_size"])
    mean = list(MEAN) if c == 3 else [sum(MEAN) / 3]
    std = list(STD) if c == 3 else [sum(STD) / 3]
    crop_size, expand = checkpoint_crop(ckpt, source)
    schema = ckpt["schema"]
    k = len(schema["names"])
    outputs = {COORDS: {"shape": ["batch", k, 2], "units": "input px, x then y, pixel centres at integers"}}
    if has_maps:
        outputs[PROBS] = {"shape": ["batch", k, "h", "w"], "units": "soft-argmax probabilities (sum 1 per map)"}
    src = Path(source) if source else None
    # the face-presence calibration travels with the model (`checkpoint_presence` reads either)
    presence = {"presence": ckpt["presence"]} if ckpt.get("presence") is not None else {}
    return {
        "format": FORMAT,
        "onnx_sha256": hashlib.sha256(onnx_data).hexdigest(),
        "opset": OPSET,
        "input": {"name": INPUT, "dtype": "float32", "layout": "NCHW", "channels": c, "size": [size, size],
                  "color": "RGB" if c == 3 else "gray (BT.601 luma of RGB)"},
        "normalisation": {"formula": "(u8 / 255 - mean) / std", "mean": mean, "std": std},
        "outputs": outputs,
        "crop": {**crop_stamp(crop_size, expand, checkpoint_label_origin(ckpt)),
                 "how": "square crop of side expand * max(box w, h) about the box centre, resampled to "
                        "size x size (pipeline.keypoints.geometry.crop_transform / crop_one), then resized size -> "
                        "input size with antialiased bilinear (align_corners=False); back to crop px: "
                        "x_crop = (x + 0.5) * size / input_size - 0.5; through the crop transform to "
                        "photo px, then + label_origin (the labels' pixel-centre origin)"},
        "flip": {"perm": list(schema["flip"]),
                 "how": "flip TTA: predict the mirrored input (columns reversed), x -> W - 1 - x, then "
                        "point i of the result is point perm[i] of that prediction; average with plain"},
        "schema": schema,
        "model_config": model_config,
        "epoch": int(ckpt.get("epoch", 0)),
        "checkpoint": str(src) if src else None,
        "checkpoint_sha256": file_sha256(src) if src and src.is_file() else None,
        "torch": torch.__version__,
        **presence,
    }


def read_export(onnx_path: str | os.PathLike, schema=None) -> dict[str, Any]:
    """The one reader of an exported model's JSON: checked, and that it belongs to this
    ONNX file (sha256). Returns it as the ckpt-like dict predict uses (model_config,
    schema, crop, epoch, ...). `schema` (a KeypointSchema) must match if given."""
    onnx_path = input_file(onnx_path, "exported model not found", "an exported ONNX file")
    jp = input_file(json_path(onnx_path), f"missing: the JSON written beside {onnx_path.name} by `pipeline export`",
                    "the export JSON file")
    try:
        meta = json.loads(jp.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineError(jp, f"not valid JSON ({e})") from None
    if not isinstance(meta, dict) or any(k not in meta for k in REQUIRED):
        raise PipelineError(jp, f"not an export JSON (needs keys {', '.join(REQUIRED)})")
    if meta["format"] != FORMAT:
        raise PipelineError(jp, f"export format {meta['format']}, this pipeline reads {FORMAT}: re-export")
    if file_sha256(onnx_path) != meta["onnx_sha256"]:
        raise PipelineError(onnx_path, f"does not match {jp.name} (sha256 differs): re-export both files")
    if schema is not None:
        check_schema(meta["schema"], schema, onnx_path, "exported model")
    return meta


