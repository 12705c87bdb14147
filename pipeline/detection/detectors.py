"""Face detectors for photos without boxes (predict-image, predict-video, morph, heatmaps),
and the one table (TO_BOX) of the fixed scale and shift that turns each one's boxes into
the box convention the models were trained with (dlib HOG boxes).

Only detectors whose model ships inside a registry package, so nothing downloads at run
time. `auto` takes the first available of:

* dlib: dlib's HOG + linear SVM frontal detector (inside `dlib-bin`, a dependency): the
  detector the training boxes came from, so its boxes need no conversion and it finds the
  faces the models were trained to see (docs/experiments.md, "Detector boxes on HOG
  training boxes").
* mtcnn: MTCNN (Zhang et al. 2016; P-, R-, O-Net weights inside the `facenet-pytorch`
  wheel, run with our torch). Every labelled face of the shared test photos found, but its
  box conversion is fit to older training boxes (TO_BOX).
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
    cascade_available,
    detect_faces,
    require_cascade,
)

log = logging.getLogger(__name__)

DETECTORS = ("dlib", "mtcnn", "haar")  # the preference order of `auto`

# MTCNN: a face is kept when the O-Net's face probability is at least this. On the shared
# test photos every unmatched detection >= 0.95 was a real (unlabelled) face; the non-face
# ones (a hand, skin, a lace pattern) scored 0.72-0.87.
MTCNN_MIN_PROB = 0.95

# The one conversion of a detector's raw box (x, y, w, h) to the training box convention,
# applied once to every detection by `Detector.__call__` (predict-image, predict-video,
# morph, heatmaps and `Landmarker.predict` without boxes all get their boxes there):
# width = w_scale * w, height = h_scale * h, centre = detector centre + (dx, dy) * w.
# The training boxes are dlib HOG detections (upsample 1) of the shared data's photos, so
# each row was measured on the training photos of ../shared/data/ibug300w-mini and
# ../shared/data/lfpw-train: the detector run as here, each detection matched one-to-one to
# the XML box it overlaps most (IoU >= 0.3, best first), faces whose XML box is a landmark
# box (no HOG detection at upsample 1 with IoU >= 0.95 to it) left out, then the medians of
# the width and height ratios and of the centre offsets (x shift 0 by symmetry).
# The figures: docs/experiments.md, "Detector boxes on HOG training boxes".
# dlib: identity. Its raw boxes are of the training boxes' kind (`dlib_box`); on the same
# photo its boxes without upsampling sit on another grid of pyramid scales than the
# training's, which makes the median ratio of pairs a grid artefact; the log-mean ratio
# and the boxes' size and place on the landmarks say identity.
# mtcnn: not re-measured (facenet-pytorch was not installed); the row maps MTCNN boxes
# onto the earlier, answer-derived training boxes (brows to chin), not onto HOG boxes.
TO_BOX = {
    "haar": {"w_scale": 0.89, "h_scale": 0.89, "dx": 0.0, "dy": 0.07},
    "dlib": {"w_scale": 1.0, "h_scale": 1.0, "dx": 0.0, "dy": 0.0},
    "mtcnn": {"w_scale": 1.02, "h_scale": 0.86, "dx": 0.0, "dy": 0.10},
}
DESCRIPTION = {"mtcnn": "MTCNN (facenet-pytorch)", "dlib": "dlib HOG frontal detector",
               "haar": "opencv haarcascade_frontalface_default.xml"}
INSTALL = {"mtcnn": "pip install --no-deps facenet-pytorch (see README: its pins are stale)",
           "dlib": "pip install dlib-bin",
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


def dlib_box(rect) -> list[float]:
    """A dlib rectangle -> [x, y, w, h] as the shared data's HOG boxes were written (width =
    right - left), so a detection the training set holds comes out as that very box."""
    return [float(rect.left()), float(rect.top()), float(rect.right() - rect.left()),
            float(rect.bottom() - rect.top())]


def dlib_rect(dlib, box):
    """The inverse of `dlib_box`: a box [x, y, w, h] -> the dlib rectangle it came from
    (rounded to whole pixels), for dlib's shape predictor."""
    left, top, w, h = (float(v) for v in box)
    return dlib.rectangle(int(round(left)), int(round(top)), int(round(left + w)), int(round(top + h)))


def _dlib() -> Callable[[np.ndarray], np.ndarray]:
    import dlib

    hog = dlib.get_frontal_face_detector()

    def detect(image: np.ndarray) -> np.ndarray:
        small, scale = _scaled(image)
        # no upsampling: its 80 px window already covers the smallest face we keep on most
        # photos, and one upsampling step quadruples the pixels to search; the training
        # boxes were found with one step, but on a new photo the boxes of either sit on
        # the face alike (TO_BOX)
        rects = hog(np.ascontiguousarray(small), 0)
        xywh = np.array([dlib_box(r) for r in rects], dtype=np.float64)
        return _largest_first(xywh.reshape(-1, 4) / scale, _min_side(image))

    return detect


class Detector:
    """`detector(image)` -> (boxes in the training convention (M, 4), raw boxes (M, 4)): the
    raw boxes go through TO_BOX[name] here, once."""

    raw: Callable[[np.ndarray], np.ndarray]

    def __init__(self, name: str):
        self.name = name
        self.description = DESCRIPTION[name]
        if name == "haar":
            require_cascade()
            self.raw = detect_faces
            return
        if not available(name):
            raise PipelineError(None, f"face detector '{name}' is not installed: {INSTALL[name]}")
        self.raw = _mtcnn() if name == "mtcnn" else _dlib()

    def __call__(self, image: np.ndarray, max_faces: int = 0) -> tuple[np.ndarray, np.ndarray]:
        raw = self.raw(image)
        if max_faces > 0:
            raw = raw[:max_faces]
        return to_box(raw, TO_BOX[self.name]), raw


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
