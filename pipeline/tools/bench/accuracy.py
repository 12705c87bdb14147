"""Accuracy on a data set with a solution: MAE / NME / faces/s of checkpoints (exported .onnx
too), of the mean-shape baseline and of dlib's predictor."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.config import Config
from pipeline.formats.annotations import load_xml, read_image, safe_image_path
from pipeline.formats.submission import read_solution
from pipeline.inference.predictor import crops_for_checkpoint, load_predictor
from pipeline.inference.tta import predict_original
from pipeline.keypoints.metrics import mae, nme
from pipeline.keypoints.schema import get_schema
from pipeline.tools.bench.references import dlib_or_skip, mean_shape_baseline
from pipeline.tools.bench.timing import num_threads, sync


def _score(pred, truth, eyes) -> dict[str, float]:
    return {"mae": mae(pred, truth), "nme": nme(pred, truth, eyes) if eyes is not None else float("nan")}


def bench_accuracy(data_dir: Path, cfg: Config, checkpoints: Sequence[str], device: torch.device,
                   batch_size: int = 64, use_dlib: bool = True) -> dict[str, Any]:
    dcfg = cfg.data.model_copy(update={"dir": str(data_dir)})
    schema = get_schema(dcfg)
    train = load_xml(data_dir / dcfg.train_xml, schema, require_parts=True)
    test_xml = data_dir / dcfg.test_xml
    test = load_xml(test_xml, schema, require_parts=False)
    truth = read_solution(data_dir / dcfg.solution).reshape(len(test), schema.k, 2)
    test_boxes = np.array([f.box for f in test], dtype=np.float64)
    out: dict[str, Any] = {"data": str(data_dir), "n_test": len(test), "n_train": len(train)}

    t0 = time.perf_counter()
    pred = mean_shape_baseline(np.stack([f.keypoints for f in train]), np.array([f.box for f in train]), test_boxes)
    dt = time.perf_counter() - t0
    out["mean_shape"] = {**_score(pred, truth, schema.eyes), "faces_per_s": len(test) / max(dt, 1e-9)}

    crops_by: dict[tuple, tuple] = {}
    for path in checkpoints:
        model, ckpt = load_predictor(path, None, device, schema=schema)  # an exported .onnx runs on onnxruntime
        crops, a = crops_for_checkpoint(test, test_xml, ckpt, path, cfg.crop.n_jobs, crops_by)
        tta = cfg.predict.tta
        predict_original(model, ckpt, crops[:2], a[:2], tta, batch_size, device)  # warm-up
        res = {}
        for nt, tag in ((None, ""), (1, "_1thread")):
            if nt is not None and Path(path).suffix == ".onnx":  # an onnxruntime session fixes its threads
                model = load_predictor(path, None, device, schema=schema, threads=nt)[0]
                predict_original(model, ckpt, crops[:2], a[:2], tta, batch_size, device)  # warm-up
            with num_threads(nt):
                sync(device)
                t0 = time.perf_counter()
                pred = predict_original(model, ckpt, crops, a, tta, batch_size, device)["final"]
                sync(device)
                res["faces_per_s" + tag] = len(test) / (time.perf_counter() - t0)
        out[f"checkpoint:{path}"] = {**_score(pred, truth, schema.eyes), **res, "tta": tta,
                                     "preset": ckpt["model_config"]["preset"],
                                     "input_size": ckpt["model_config"]["input_size"]}

    dlib, predictor = dlib_or_skip(out) if use_dlib else (None, None)
    if predictor is not None:
        by_image: dict[str, list[int]] = {}
        for i, f in enumerate(test):
            by_image.setdefault(f.image, []).append(i)
        pred = np.zeros_like(truth)
        spent = 0.0
        for rel, idx in by_image.items():
            image = read_image(safe_image_path(data_dir, rel, test_xml))  # RGB uint8, not timed
            for i in idx:
                left, top, w, h = test[i].box
                rect = dlib.rectangle(int(round(left)), int(round(top)), int(round(left + w - 1)),
                                      int(round(top + h - 1)))
                t0 = time.perf_counter()
                shape = predictor(image, rect)
                spent += time.perf_counter() - t0
                pred[i] = [(p.x, p.y) for p in shape.parts()]
        out["dlib"] = {**_score(pred, truth, schema.eyes), "faces_per_s_1thread": len(test) / max(spent, 1e-9)}
    return out
