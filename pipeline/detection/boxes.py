"""Face boxes [left, top, width, height] in original pixels (edge coordinates, as the XML
boxes): overlap, and the conversion of a detector's boxes to the training convention."""

from __future__ import annotations

import numpy as np


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


def overlap_of_smaller(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(M, N) intersection over the smaller box's area: 1 when one box lies inside the other,
    whatever their sizes (IoU of a box and one twice its side inside it is only 0.25)."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    iw = np.clip(np.minimum(a[:, None, 0] + a[:, None, 2], b[None, :, 0] + b[None, :, 2])
                 - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, None, 1] + a[:, None, 3], b[None, :, 1] + b[None, :, 3])
                 - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    smaller = np.minimum((a[:, 2] * a[:, 3])[:, None], (b[:, 2] * b[:, 3])[None, :])
    return np.where(smaller > 0, iw * ih / np.where(smaller > 0, smaller, 1), 0.0)


def to_box(raw: np.ndarray, c: dict) -> np.ndarray:
    """(M, 4) raw detector boxes -> (M, 4) training-convention boxes [left, top, w, h] with the
    constants c: width/height scaled, centre moved by (dx, dy) detector box widths."""
    raw = np.asarray(raw, dtype=np.float64).reshape(-1, 4)
    s = raw[:, 2]
    cx = raw[:, 0] + raw[:, 2] / 2 + c["dx"] * s
    cy = raw[:, 1] + raw[:, 3] / 2 + c["dy"] * s
    w, h = c["w_scale"] * raw[:, 2], c["h_scale"] * raw[:, 3]
    return np.stack([cx - w / 2, cy - h / 2, w, h], axis=1)
