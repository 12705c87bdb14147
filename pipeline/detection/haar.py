"""OpenCV's Haar face detector (it ships inside opencv-python, so it is the fallback that
is always there; pipeline/detection/detectors.py picks the best installed detector) and the map from
its boxes to the competition's box convention.

The training boxes ("boxes imitate a face detector" in the competition XML) run from the
brows to the chin and are narrower than a Haar box, which also holds the forehead. A
fixed scale and centre shift (HAAR_TO_BOX) maps one onto the other; `calibrate` measures
it on a labelled XML."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from pipeline.core.errors import PipelineError


HAAR_FILE = "haarcascade_frontalface_default.xml"


# detectMultiScale settings (used for the calibration too, so change them together)
HAAR_SCALE_FACTOR = 1.1


HAAR_MIN_NEIGHBORS = 5


HAAR_MIN_FRACTION = 0.08  # smallest face side as a fraction of the photo's shorter side


HAAR_MIN_PX = 24


HAAR_MAX_SIDE = 1024  # larger photos are searched at this size (boxes mapped back)


# Haar box (x, y, s, s) -> training box: width = W_SCALE * s, height = H_SCALE * s, centre =
# Haar centre + (DX, DY) * s. Measured with `calibrate` (opencv-python-headless 4.14, the
# settings above) on ../shared/data/ibug300w-mini's train XML: 1107 boxes in 1107 image
# entries; each XML box matched to its highest-IoU detection (IoU >= 0.3): 959 matched
# (86.6 %), 220 detections unmatched; medians over the matched pairs: width 0.859 s
# (IQR 0.80-0.92), height 0.929 s, centre shift x +0.007 s (rounded to 0: the faces are
# symmetric), y +0.091 s (IQR 0.066-0.121: the training box sits lower, brows to chin).
# Median IoU with the XML box: raw Haar 0.667, converted 0.778 (99 % of pairs >= 0.5); on
# the held-out test XML (100 boxes): 82 % detected, IoU raw 0.677, converted 0.786.
HAAR_TO_BOX = {"w_scale": 0.86, "h_scale": 0.93, "dx": 0.0, "dy": 0.09}


def _cascade_path() -> Path:
    return Path(getattr(getattr(cv2, "data", None), "haarcascades", "") or ".") / HAAR_FILE


def require_cascade() -> None:
    if not cascade_available():
        raise PipelineError(_cascade_path(), f"OpenCV {cv2.__version__} has no Haar face cascade (OpenCV 5 "
                                             "moved it to opencv_contrib; the 5.x wheels ship neither the "
                                             "detector nor the file): install opencv-python-headless<5")


def _cascade() -> "cv2.CascadeClassifier":
    require_cascade()
    path = _cascade_path()
    clf = cv2.CascadeClassifier(str(path))
    if clf.empty():
        raise PipelineError(path, "cannot load OpenCV's Haar face cascade (broken opencv install?)")
    return clf


_CASCADE: cv2.CascadeClassifier | None = None


def detect_faces(image: np.ndarray) -> np.ndarray:
    """Raw Haar detections in an RGB uint8 photo: float (M, 4) [x, y, w, h] original
    pixels (edge coordinates, as the XML boxes), largest first."""
    global _CASCADE
    if _CASCADE is None:
        _CASCADE = _cascade()
    gray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    h, w = gray.shape
    scale = min(1.0, HAAR_MAX_SIDE / max(h, w))
    if scale < 1.0:
        gray = cv2.resize(gray, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    gray = cv2.equalizeHist(gray)
    min_side = max(HAAR_MIN_PX, int(HAAR_MIN_FRACTION * min(gray.shape)))
    if min(gray.shape) < min_side:
        return np.zeros((0, 4))
    found = _CASCADE.detectMultiScale(gray, scaleFactor=HAAR_SCALE_FACTOR, minNeighbors=HAAR_MIN_NEIGHBORS,
                                      minSize=(min_side, min_side))
    boxes = np.asarray(found, dtype=np.float64).reshape(-1, 4) / scale
    return boxes[np.argsort(-boxes[:, 2] * boxes[:, 3], kind="stable")]


def haar_to_box(haar: np.ndarray, c: dict | None = None) -> np.ndarray:
    """(M, 4) Haar boxes -> (M, 4) boxes in the training convention [left, top, w, h]."""
    c = c or HAAR_TO_BOX
    haar = np.asarray(haar, dtype=np.float64).reshape(-1, 4)
    s = haar[:, 2]
    cx = haar[:, 0] + haar[:, 2] / 2 + c["dx"] * s
    cy = haar[:, 1] + haar[:, 3] / 2 + c["dy"] * s
    w, h = c["w_scale"] * haar[:, 2], c["h_scale"] * haar[:, 3]
    return np.stack([cx - w / 2, cy - h / 2, w, h], axis=1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix (M, N) of [x, y, w, h] boxes a (M, 4) and b (N, 4)."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    x0 = np.maximum(a[:, None, 0], b[None, :, 0])
    y0 = np.maximum(a[:, None, 1], b[None, :, 1])
    x1 = np.minimum(a[:, None, 0] + a[:, None, 2], b[None, :, 0] + b[None, :, 2])
    y1 = np.minimum(a[:, None, 1] + a[:, None, 3], b[None, :, 1] + b[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    union = (a[:, 2] * a[:, 3])[:, None] + (b[:, 2] * b[:, 3])[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def calibrate(xml_path: str | os.PathLike, min_iou: float = 0.3, limit: int | None = None) -> dict:
    """Measure HAAR_TO_BOX on a labelled XML: Haar on each photo, every XML box matched to
    its highest-IoU detection (>= min_iou), medians of width/height ratios and of the
    centre offsets (in Haar box sides). Returns the constants and the comparison numbers
    (detection rate, median IoU of raw and of converted boxes)."""
    from pipeline.formats.annotations import load_xml, read_image, safe_image_path
    from pipeline.keypoints.schema import IBUG68

    xml_path = Path(xml_path)
    faces = load_xml(xml_path, IBUG68, require_parts=False)
    by_image: dict[str, list] = {}
    for f in faces:
        by_image.setdefault(f.image, []).append(f.box)
    items = list(by_image.items())[:limit or None]
    pairs, raw_iou, n_boxes, n_det, n_false = [], [], 0, 0, 0
    for rel, boxes in items:
        img = read_image(safe_image_path(xml_path.parent, rel, xml_path))
        det = detect_faces(img)
        gt = np.asarray(boxes, dtype=np.float64)
        n_boxes += len(gt)
        n_det += len(det)
        if not len(det):
            continue
        m = iou(gt, det)  # (G, D)
        used = set()
        for g in np.argsort(-m.max(1)):
            d = int(np.argmax(m[g]))
            if m[g, d] >= min_iou and d not in used:
                used.add(d)
                pairs.append((gt[g], det[d]))
                raw_iou.append(m[g, d])
        n_false += len(det) - len(used)
    if not pairs:
        raise PipelineError(xml_path, "no Haar detection matched any box")
    gt = np.array([p[0] for p in pairs])
    det = np.array([p[1] for p in pairs])
    s = det[:, 2]
    c = {"w_scale": float(np.median(gt[:, 2] / s)), "h_scale": float(np.median(gt[:, 3] / det[:, 3])),
         "dx": float(np.median(((gt[:, 0] + gt[:, 2] / 2) - (det[:, 0] + det[:, 2] / 2)) / s)),
         "dy": float(np.median(((gt[:, 1] + gt[:, 3] / 2) - (det[:, 1] + det[:, 3] / 2)) / s))}
    conv = haar_to_box(det, c)
    conv_iou = np.array([iou(g, b)[0, 0] for g, b in zip(gt, conv)])
    fixed = haar_to_box(det)
    fixed_iou = np.array([iou(g, b)[0, 0] for g, b in zip(gt, fixed)])
    return {"photos": len(items), "boxes": n_boxes, "detections": n_det, "matched": len(pairs),
            "detection_rate": len(pairs) / n_boxes, "unmatched_detections": n_false,
            "median_iou_raw": float(np.median(raw_iou)), "median_iou_converted": float(np.median(conv_iou)),
            "median_iou_hardcoded": float(np.median(fixed_iou)),
            "iou_converted_ge_0.5": float(np.mean(conv_iou >= 0.5)),
            "iou_hardcoded_ge_0.5": float(np.mean(fixed_iou >= 0.5)), "constants": c,
            "iqr": {"w_scale": np.percentile(gt[:, 2] / s, [25, 75]).round(3).tolist(),
                    "dy": np.percentile(((gt[:, 1] + gt[:, 3] / 2) - (det[:, 1] + det[:, 3] / 2)) / s,
                                        [25, 75]).round(3).tolist()}}


def cascade_available() -> bool:
    """Whether this OpenCV has the Haar detector and its cascade file (opencv-python 4.x;
    OpenCV 5 moved cascades to opencv_contrib and the 5.x wheels ship neither)."""
    return hasattr(cv2, "CascadeClassifier") and _cascade_path().is_file()
