"""OpenCV's Haar face detector (it ships inside opencv-python, so it is the fallback that
is always there; pipeline/detection/detectors.py picks the best installed detector) and the map from
its boxes to the competition's box convention.

The training boxes ("boxes imitate a face detector" in the competition XML) run from the
brows to the chin and are narrower than a Haar box, which also holds the forehead. A
fixed scale and centre shift (HAAR_TO_BOX) maps one onto the other; `calibrate` measures
it on a labelled XML."""

from __future__ import annotations

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


def cascade_available() -> bool:
    """Whether this OpenCV has the Haar detector and its cascade file (opencv-python 4.x;
    OpenCV 5 moved cascades to opencv_contrib and the 5.x wheels ship neither)."""
    return hasattr(cv2, "CascadeClassifier") and _cascade_path().is_file()
