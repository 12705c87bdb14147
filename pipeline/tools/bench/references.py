"""The two reference methods every model is compared with: the mean training shape placed in
each box, and dlib's 68-point ERT shape predictor (PyPI dlib-bin + face-recognition-models)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np


def box_normalised(keypoints: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """(N, K, 2) original px -> box coordinates: ((x - left) / width, (y - top) / height)."""
    b = np.asarray(boxes, dtype=np.float64)
    return (np.asarray(keypoints, dtype=np.float64) - b[:, None, :2]) / b[:, None, 2:4]


def place_in_boxes(shape: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """A (K, 2) box-normalised shape -> (N, K, 2) original px in each (left, top, w, h) box."""
    b = np.asarray(boxes, dtype=np.float64)
    return b[:, None, :2] + np.asarray(shape, dtype=np.float64)[None] * b[:, None, 2:4]


def mean_shape_baseline(train_kp: np.ndarray, train_boxes: np.ndarray, test_boxes: np.ndarray) -> np.ndarray:
    """The mean training shape in box-normalised coordinates, placed into every test box."""
    return place_in_boxes(box_normalised(train_kp, train_boxes).mean(0), test_boxes)


def dlib_or_skip(out: dict) -> tuple:
    """(dlib, predictor), or (None, None) with the reason under out["dlib"]."""
    try:
        return dlib_predictor()
    except ImportError as e:
        out["dlib"] = {"skipped": f"dlib not installed ({e}); pip install 'pipeline[dlib]'"}
        return None, None


def dlib_predictor():
    """(dlib module, 68-point shape predictor) or raise ImportError."""
    import dlib

    try:
        import face_recognition_models

        path = face_recognition_models.pose_predictor_model_location()
    except ModuleNotFoundError as e:  # it imports pkg_resources, gone from new setuptools
        if e.name != "pkg_resources":
            raise
        spec = importlib.util.find_spec("face_recognition_models")
        if spec is None or spec.origin is None:
            raise
        path = str(Path(spec.origin).parent / "models" / "shape_predictor_68_face_landmarks.dat")
    return dlib, dlib.shape_predictor(path)
