"""OpenCV's Haar face detector (it ships inside opencv-python, so it is the fallback that
is always there; pipeline/detection/detectors.py picks the best installed detector and
holds the conversion of its boxes to the training box convention, TO_BOX)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from pipeline.core.errors import PipelineError

HAAR_FILE = "haarcascade_frontalface_default.xml"


# detectMultiScale settings (TO_BOX['haar'] was measured with them, so change them together)
HAAR_SCALE_FACTOR = 1.1


HAAR_MIN_NEIGHBORS = 5


HAAR_MIN_FRACTION = 0.08  # smallest face side as a fraction of the photo's shorter side


HAAR_MIN_PX = 24


HAAR_MAX_SIDE = 1024  # larger photos are searched at this size (boxes mapped back)


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
