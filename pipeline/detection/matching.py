"""Detectors measured against annotated boxes: one-to-one matching and the recall of the
converted boxes (`pipeline bench`'s detector section; the tracker's matching too)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from pipeline.detection.boxes import iou
from pipeline.detection.detectors import get_detector
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
