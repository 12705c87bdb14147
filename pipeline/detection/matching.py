"""Detectors measured against annotated boxes: IoU, one-to-one matching, recall, and the
calibration of a detector's boxes to the training box convention (the constants in
pipeline/detection/detectors.py's TO_BOX)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.detection.boxes import iou, to_box
from pipeline.detection.detectors import TO_BOX, get_detector
from pipeline.formats.annotations import load_xml, read_image, safe_image_path
from pipeline.keypoints.schema import IBUG68


def _photos(xml_path: Path, limit: int | None) -> list[tuple[str, np.ndarray]]:
    """[(image file, its XML boxes (G, 4))], one entry per image file of the XML."""
    by_image: dict[str, list] = {}
    for f in load_xml(xml_path, IBUG68, require_parts=False):
        by_image.setdefault(f.image, []).append(f.box)
    return [(k, np.asarray(v, dtype=np.float64)) for k, v in list(by_image.items())[:limit or None]]


def match(gt: np.ndarray, det: np.ndarray, min_iou: float) -> list[tuple[int, int, float]]:
    """Greedy one-to-one matching, best IoU first: [(gt index, det index, IoU >= min_iou)]."""
    if not len(gt) or not len(det):
        return []
    return greedy_pairs(iou(gt, det), min_iou)


def greedy_pairs(scores: np.ndarray, minimum: float) -> list[tuple[int, int, float]]:
    """Greedy one-to-one pairs of a (rows, columns) score matrix, best score first (ties in
    row-major order): [(row, column, score >= minimum)]."""
    pairs: list[tuple[int, int, float]] = []
    used_r, used_c = set(), set()
    for flat in np.argsort(-scores, axis=None, kind="stable"):
        r, c = (int(v) for v in np.unravel_index(flat, scores.shape))
        if scores[r, c] < minimum:
            break
        if r in used_r or c in used_c:
            continue
        used_r.add(r)
        used_c.add(c)
        pairs.append((r, c, float(scores[r, c])))
    return pairs


def calibrate(xml_path: str | os.PathLike, detector: str = "haar", min_iou: float = 0.3,
              limit: int | None = None) -> dict:
    """Measure a detector's raw box -> training box constants on a labelled XML: every XML
    box matched one-to-one to a raw detection (IoU >= min_iou), medians of the width and
    height ratios and of the centre offsets in detector box widths. Returns the constants
    and the figures to judge them by: detection rate, unmatched detections, and the median
    IoU of the raw boxes, of the boxes converted with the measured constants and with the
    constants in use (TO_BOX)."""
    xml_path = Path(xml_path)
    det_fn = get_detector(detector)
    gts, dets, raw_iou = [], [], []
    photos = _photos(xml_path, limit)
    n_boxes = n_det = 0
    for rel, gt in photos:
        det = det_fn.raw(read_image(safe_image_path(xml_path.parent, rel, xml_path)))
        n_boxes += len(gt)
        n_det += len(det)
        for g, d, overlap in match(gt, det, min_iou):
            gts.append(gt[g])
            dets.append(det[d])
            raw_iou.append(overlap)
    if not gts:
        raise PipelineError(xml_path, f"no {detector} detection matched any box")
    gt, det = np.array(gts), np.array(dets)
    s = det[:, 2]
    c = {"w_scale": float(np.median(gt[:, 2] / s)), "h_scale": float(np.median(gt[:, 3] / det[:, 3])),
         "dx": float(np.median(((gt[:, 0] + gt[:, 2] / 2) - (det[:, 0] + det[:, 2] / 2)) / s)),
         "dy": float(np.median(((gt[:, 1] + gt[:, 3] / 2) - (det[:, 1] + det[:, 3] / 2)) / s))}
    measured = np.array([iou(g, b)[0, 0] for g, b in zip(gt, to_box(det, c))])
    in_use = np.array([iou(g, b)[0, 0] for g, b in zip(gt, to_box(det, TO_BOX[detector]))])
    return {"detector": detector, "photos": len(photos), "boxes": n_boxes, "detections": n_det, "matched": len(gt),
            "detection_rate": len(gt) / n_boxes, "unmatched_detections": n_det - len(gt),
            "median_iou_raw": float(np.median(raw_iou)), "median_iou_measured": float(np.median(measured)),
            "median_iou_in_use": float(np.median(in_use)), "constants": c}


def evaluate(xml_path: str | os.PathLike, detector: str, min_iou: float = 0.5, limit: int | None = None) -> dict:
    """Recall of the XML boxes by converted detections at IoU >= min_iou (one-to-one),
    unmatched detections per photo, photos/s (detection only, decoding not timed)."""
    xml_path = Path(xml_path)
    det = get_detector(detector)
    photos = _photos(xml_path, limit)
    images = [(read_image(safe_image_path(xml_path.parent, rel, xml_path)), gt) for rel, gt in photos]
    det(images[0][0])  # warm-up (lazy initialisation, first-call allocations)
    n_gt = n_hit = n_unmatched = 0
    ious, spent = [], 0.0
    for image, gt in images:
        t0 = time.perf_counter()
        boxes, _ = det(image)
        spent += time.perf_counter() - t0
        pairs = match(gt, boxes, min_iou)
        n_gt += len(gt)
        n_hit += len(pairs)
        n_unmatched += len(boxes) - len(pairs)
        ious += [p[2] for p in pairs]
    return {"detector": det.description, "photos": len(images), "boxes": n_gt, "recall": n_hit / max(n_gt, 1),
            "unmatched_per_photo": n_unmatched / max(len(images), 1),
            "median_iou": float(np.median(ious)) if ious else 0.0, "photos_per_s": len(images) / max(spent, 1e-9)}
