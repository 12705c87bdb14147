"""One face at a time on one core: the full per-face path through every inference backend
beside dlib's predictor on the same crops, in alternating rounds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.params_schema import Config
from pipeline.detection.detectors import dlib_rect
from pipeline.formats.annotations import crop_faces, load_xml
from pipeline.formats.checkpoint import PRESENCE_RADIUS, checkpoint_crop
from pipeline.formats.onnx_export import onnx_bytes
from pipeline.inference.onnx_runtime import OnnxModel, onnx_available
from pipeline.inference.predictor import prepare_torch
from pipeline.inference.presence import Scorer, scorer
from pipeline.inference.tta import predict_crops
from pipeline.keypoints.schema import get_schema
from pipeline.tools.bench.references import dlib_or_skip
from pipeline.tools.bench.timing import num_threads
from pipeline.tools.export import network_inputs, quantize_int8


def bench_batch1(model, meta: dict, crop_size: int, min_time: float = 1.0, faces: np.ndarray | None = None,
                 expand: float = 1.25, use_dlib: bool = True, rounds: int = 3,
                 backends: Sequence[str] = ("torch-eager", "torch", "onnx", "onnx-int8")) -> dict[str, Any]:
    """One face at a time on one core (batch 1, 1 thread), the full per-face path of
    `predict_crops` (uint8 crop -> resize, normalise -> network -> crop px), plain and flip
    TTA, and flip TTA with the face-presence score (pipeline/inference/presence.py: "scored",
    heatmap models), for: the eager model as trained (torch-eager), the torch backend (BatchNorm folded,
    channels_last), onnxruntime (in-memory export of the same weights; skipped when not
    installed) and onnxruntime int8 (`export --int8`, calibrated here on the timed crops:
    a speed figure; its accuracy comes from scoring an exported model in the accuracy
    section); beside dlib's 68-point predictor on the same crops (its box: the square the
    crop was cut around, 1/expand of the crop at its centre: the face's box, scaled into the
    crop, where that box is square). Neither side times decoding or cropping.

    Every method runs `rounds` times in alternation for min_time / rounds seconds each and
    keeps its best round, so on a shared machine all of them see the same background load
    and the ratios to dlib hold even when the absolute figures do not."""
    model_config = meta["model_config"]
    size, chans, perm = int(model_config["input_size"]), int(model_config["in_chans"]), list(meta["schema"]["flip"])
    if faces is None:
        faces = np.random.default_rng(0).integers(0, 256, (16, crop_size, crop_size, 3), dtype=np.uint8)
    out: dict[str, Any] = {"input_size": size, "crop_size": int(faces.shape[1]), "threads": 1,
                           "faces": len(faces), "rounds": rounds}
    cpu = torch.device("cpu")
    model = model.to(cpu).eval()
    methods: dict[str, Any] = {}  # name -> fn(face index)
    with num_threads(1):
        for name in backends:
            if name.startswith("onnx") and not onnx_available():
                out[name] = {"skipped": "onnxruntime not installed (pip install 'pipeline[onnx]')"}
                continue
            if name == "torch-eager":
                runner = model
            elif name == "torch":
                runner = prepare_torch(model)
            else:
                data = onnx_bytes(model, size, chans)
                if name == "onnx-int8":
                    data = quantize_int8(data, network_inputs(faces, size, chans))
                runner = OnnxModel(data, model_config, threads=1)
            views: list[tuple[str, list[int] | None, Scorer | None]] = [
                ("plain", None, None), ("flip", perm, None)]
            if hasattr(runner, "forward_maps"):  # flip TTA with the face-presence score
                views.append(("scored", perm, scorer(PRESENCE_RADIUS, perm)))
            for tta, p, score in views:
                methods[f"{name}/{tta}"] = (lambda i, r=runner, p=p, score=score: predict_crops(
                    r, faces[i:i + 1], input_size=size, in_chans=chans, flip_perm=p, batch_size=1, device=cpu,
                    presence=score))
        dlib, predictor = dlib_or_skip(out) if use_dlib else (None, None)
        if predictor is not None:
            s = faces.shape[1]
            side = s / expand  # the crop is `expand` x the box's longer side, centred on the box
            rect = dlib_rect(dlib, [(s - side) / 2, (s - side) / 2, side, side])
            crops = [np.ascontiguousarray(f) for f in faces]
            methods["dlib/plain"] = lambda i: predictor(crops[i], rect)
        best = {k: 0.0 for k in methods}
        for fn in methods.values():
            fn(0)  # warm-up (first-call allocations, lazy initialisation)
        for _ in range(rounds):
            for name, fn in methods.items():
                n, t0 = 0, time.perf_counter()
                while True:
                    fn(n % len(faces))
                    n += 1
                    dt = time.perf_counter() - t0
                    if dt >= min_time / rounds:
                        break
                best[name] = max(best[name], n / dt)
    for key, v in best.items():
        name, tta = key.split("/")
        out.setdefault(name, {})[tta] = v
    if "plain" in out.get("dlib", {}):
        out["dlib"]["boxes"] = (f"a square 1/{expand:g} of the crop at its centre: the box the crop was cut around, "
                                "scaled into the crop (exactly where that box is square, as HOG boxes are to a pixel)")
    return out


def sample_test_crops(data_dir: Path | None, cfg: Config, meta: dict, n: int = 32) -> np.ndarray | None:
    """Up to n test faces of the data set, cropped at the model's crop geometry (None: no data)."""
    if data_dir is None or not (data_dir / cfg.data.test_xml).exists():
        return None
    xml = data_dir / cfg.data.test_xml
    faces = load_xml(xml, get_schema(cfg.data), require_parts=False)[:n]
    size, expand = checkpoint_crop(meta)
    return crop_faces(faces, data_dir, size, expand, 1, xml)[0]
