"""Accuracy on a data set with a solution: MAE / NME / faces/s of checkpoints (exported .onnx
too), of the mean-shape baseline and of dlib's predictor, every one on the test XML's boxes
as given (each row says so under "boxes"): on the shared data those are dlib HOG
detections, the boxes dlib's predictor was trained on, where HOG found the face."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.params_schema import Config
from pipeline.detection.detectors import dlib_rect
from pipeline.formats.annotations import crop_faces, load_xml, read_image, safe_image_path, xml_comment
from pipeline.formats.submission import read_solution
from pipeline.inference.landmarker import Landmarker
from pipeline.keypoints.metrics import mae, nme
from pipeline.keypoints.schema import get_schema
from pipeline.tools.bench.references import dlib_or_skip, mean_shape_baseline
from pipeline.tools.bench.timing import num_threads, sync


def _score(pred, truth, eyes) -> dict[str, float | None]:
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
    out: dict[str, Any] = {"data": str(data_dir), "n_test": len(test), "n_train": len(train),
                           "test_xml_comment": xml_comment(test_xml)}

    t0 = time.perf_counter()
    train_kp = np.stack([f.keypoints for f in train])  # type: ignore[misc]  # require_parts=True: all have keypoints
    pred = mean_shape_baseline(train_kp, np.array([f.box for f in train]), test_boxes)
    dt = time.perf_counter() - t0
    out["mean_shape"] = {**_score(pred, truth, schema.eyes), "faces_per_s": len(test) / max(dt, 1e-9),
                         "boxes": "test XML as given; the mean training shape (box-normalised) placed in each"}

    crops_by: dict[tuple, tuple] = {}

    def crop(size: int, expand: float, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The test faces at a geometry, cropped once (not timed); the first n of them."""
        if (size, expand) not in crops_by:
            crops_by[size, expand] = crop_faces(test, test_xml.parent, size, expand, cfg.crop.n_jobs, test_xml)
        crops, a = crops_by[size, expand]
        return crops[:n], a[:n]

    tta = cfg.predict.tta
    for path in checkpoints:
        res = {}
        for nt, tag in ((None, ""), (1, "_1thread")):
            if nt is None or Path(path).suffix == ".onnx":  # an onnxruntime session fixes its threads
                # an exported .onnx runs on onnxruntime
                landmarker = Landmarker.from_checkpoints([path], backend=None, device=device, tta=tta,
                                                         batch_size=batch_size, schema=schema, threads=nt)
                landmarker.predict_faces(lambda size, expand: crop(size, expand, 2))  # warm-up
            with num_threads(nt):
                sync(device)
                t0 = time.perf_counter()
                pred = landmarker.predict_faces(crop)
                sync(device)
                res["faces_per_s" + tag] = len(test) / (time.perf_counter() - t0)
        ckpt = landmarker.metas[0]
        size, expand = landmarker.geometries[0]
        out[f"checkpoint:{path}"] = {**_score(pred, truth, schema.eyes), **res, "tta": tta,
                                     "preset": ckpt["model_config"]["preset"],
                                     "input_size": ckpt["model_config"]["input_size"],
                                     "boxes": f"test XML as given; a square {expand:g}x the box's longer side "
                                              f"cropped around each at {size} px, as the checkpoint was trained"}

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
                rect = dlib_rect(dlib, test[i].box)  # the XML box itself: a HOG box comes back whole
                t0 = time.perf_counter()
                shape = predictor(image, rect)
                spent += time.perf_counter() - t0
                pred[i] = [(p.x, p.y) for p in shape.parts()]
        out["dlib"] = {**_score(pred, truth, schema.eyes), "faces_per_s_1thread": len(test) / max(spent, 1e-9),
                       "boxes": "test XML as given, as dlib rectangles (right = left + width, bottom = top + "
                                "height: a HOG box is the detector's own rectangle again) on the whole photo"}
    return out
