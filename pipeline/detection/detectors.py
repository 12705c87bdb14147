"""Face detectors for photos without boxes (predict-image, morph, heatmaps), each with the
fixed scale and shift that turns its boxes into the box convention the models were
trained with, and the measurements behind the choice (`calibrate`, `evaluate`).

Only detectors whose model ships inside a registry package, so nothing downloads at run
time. `auto` takes the first available of:

* mtcnn: MTCNN (Zhang et al. 2016; P-, R-, O-Net weights inside the `facenet-pytorch`
  wheel, run with our torch). Best on the shared test photos: every labelled face found.
* dlib: dlib's HOG + linear SVM frontal detector (inside `dlib-bin`; the `dlib` extra).
* haar: OpenCV's Haar cascade (inside opencv-python 4.x), the fallback that is always there.

All detectors see the photo at most HAAR_MAX_SIDE px on its longer side (boxes mapped
back), keep faces of at least HAAR_MIN_FRACTION of its shorter side, and return raw boxes
[x, y, w, h] in photo pixels (edge coordinates, as the XML boxes), largest first."""

from __future__ import annotations

import importlib.util
import logging
from typing import Callable

import cv2
import numpy as np
import torch

from pipeline.core.errors import PipelineError
from pipeline.detection.boxes import to_box
from pipeline.detection.haar import (
    HAAR_MAX_SIDE,
    HAAR_MIN_FRACTION,
    HAAR_MIN_PX,
    HAAR_TO_BOX,
    cascade_available,
    detect_faces,
    require_cascade,
)

log = logging.getLogger(__name__)

DETECTORS = ("mtcnn", "dlib", "haar")  # the preference order of `auto`

# MTCNN: a face is kept when the O-Net's face probability is at least this. On the shared
# test photos every unmatched detection >= 0.95 was a real (unlabelled) face; the non-face
# ones (a hand, skin, a lace pattern) scored 0.72-0.87.
MTCNN_MIN_PROB = 0.95

# detector box (x, y, w, h) -> training box: width = w_scale * w, height = h_scale * h, centre
# = detector centre + (dx, dy) * w. Medians over the first 400 photos of
# ../shared/data/ibug300w-mini's train XML (`calibrate`: every XML box matched one-to-one
# to a detection at IoU >= 0.3), rounded, x shift 0 by symmetry (measured +0.011 / +0.002).
# mtcnn: 399 of 400 boxes matched; width 1.022, height 0.857, dy +0.102 (its box is
# narrower and ends lower at the chin's top, the training box runs from the brows down).
# dlib: 384 of 400 matched; width 0.955, height 1.050, dy +0.025: the competition's boxes
# came from a dlib detector, so its boxes need the smallest correction.
# Haar: see pipeline.detection.haar.HAAR_TO_BOX.
TO_BOX = {
    "haar": HAAR_TO_BOX,
    "mtcnn": {"w_scale": 1.02, "h_scale": 0.86, "dx": 0.0, "dy": 0.10},
    "dlib": {"w_scale": 0.955, "h_scale": 1.05, "dx": 0.0, "dy": 0.025},
}
DESCRIPTION = {"mtcnn": "MTCNN (facenet-pytorch)", "dlib": "dlib HOG frontal detector",
               "haar": "opencv haarcascade_frontalface_default.xml"}
INSTALL = {"mtcnn": "pip install --no-deps facenet-pytorch (see README: its pins are stale)",
           "dlib": "pip install 'pipeline[dlib]'",
           "haar": "install opencv-python-headless<5"}


def available(name: str) -> bool:
    if name == "haar":
        return cascade_available()
    module = {"mtcnn": "facenet_pytorch", "dlib": "dlib"}[name]
    return importlib.util.find_spec(module) is not None


def resolve(name: str | None = "auto") -> str:
    """'auto' -> the first available detector; a named one must be available."""
    name = name or "auto"
    if name == "auto":
        for d in DETECTORS:
            if available(d):
                return d
        return "haar"  # not available either: get_detector says how to fix that
    if name not in DETECTORS:
        raise PipelineError(None, f"--detector must be auto or one of {', '.join(DETECTORS)}, got '{name}'")
    return name


def _scaled(image: np.ndarray) -> tuple[np.ndarray, float]:
    """The photo at most HAAR_MAX_SIDE px on its longer side, and that scale (<= 1)."""
    h, w = image.shape[:2]
    scale = min(1.0, HAAR_MAX_SIDE / max(h, w))
    if scale < 1.0:
        image = cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    return image, scale


def _min_side(image: np.ndarray) -> int:
    return max(HAAR_MIN_PX, int(HAAR_MIN_FRACTION * min(image.shape[:2])))


def _largest_first(boxes: np.ndarray, min_side: float) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    boxes = boxes[np.minimum(boxes[:, 2], boxes[:, 3]) >= min_side]
    return boxes[np.argsort(-boxes[:, 2] * boxes[:, 3], kind="stable")]


def _mtcnn() -> Callable[[np.ndarray], np.ndarray]:
    from facenet_pytorch import MTCNN  # weights: facenet_pytorch/data/{p,r,o}net.pt, in the wheel

    net = MTCNN(keep_all=True, device="cpu", post_process=False)

    def detect(image: np.ndarray) -> np.ndarray:
        small, scale = _scaled(image)
        net.min_face_size = _min_side(small)
        with torch.inference_mode():
            boxes, probs = net.detect(np.ascontiguousarray(small))  # (M, 4) x0, y0, x1, y1; (M,)
        if boxes is None:
            return np.zeros((0, 4))
        boxes = boxes[np.asarray(probs) >= MTCNN_MIN_PROB]
        xywh = np.column_stack([boxes[:, 0], boxes[:, 1], boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]])
        return _largest_first(xywh / scale, _min_side(image))

    return detect


def _dlib() -> Callable[[np.ndarray], np.ndarray]:
    import dlib

    hog = dlib.get_frontal_face_detector()

    def detect(image: np.ndarray) -> np.ndarray:
        small, scale = _scaled(image)
        # no upsampling: its 80 px window already covers the smallest face we keep on most
        # photos, and one upsampling step costs 4x for no recall on the shared test
        rects = hog(np.ascontiguousarray(small), 0)
        xywh = np.array([[r.left(), r.top(), r.width(), r.height()] for r in rects], dtype=np.float64)
        return _largest_first(xywh.reshape(-1, 4) / scale, _min_side(image))

    return detect


class Detector:
    """`detector(image)` -> (boxes in the training convention (M, 4), raw boxes (M, 4))."""

    raw: Callable[[np.ndarray], np.ndarray]

    def __init__(self, name: str):
        self.name = name
        self.description = DESCRIPTION[name]
        if name == "haar":
            require_cascade()
            self.raw, self.to_box = detect_faces, TO_BOX[name]
            return
        if not available(name):
            raise PipelineError(None, f"face detector '{name}' is not installed: {INSTALL[name]}")
        self.raw = _mtcnn() if name == "mtcnn" else _dlib()
        self.to_box = TO_BOX[name]

    def __call__(self, image: np.ndarray, max_faces: int = 0) -> tuple[np.ndarray, np.ndarray]:
        raw = self.raw(image)
        if max_faces > 0:
            raw = raw[:max_faces]
        return to_box(raw, self.to_box), raw


_LOADED: dict[str, Detector] = {}


def get_detector(name: str | None = "auto") -> Detector:
    """The named (or best available) detector, built once per process."""
    name = resolve(name)
    if name not in _LOADED:
        _LOADED[name] = Detector(name)
        log.info("face detector: %s", _LOADED[name].description)
    return _LOADED[name]


def locate_faces(image: np.ndarray, max_faces: int = 0, detector: str | None = "auto") -> tuple[np.ndarray, np.ndarray]:
    """(boxes in the training convention (M, 4), raw detector boxes (M, 4)), largest first."""
    return get_detector(detector)(image, max_faces)
