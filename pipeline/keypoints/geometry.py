"""Crop geometry, the one implementation: face box -> square crop transform, the crop
itself (`crop_face` does both), and the maps between original, crop and network-input pixels.

Pixel centres sit at integer coordinates everywhere (docs/design.md, "Conventions").
Transforms are (2, 3) affines crop pixel -> original pixel: orig = A @ [u, v, 1]."""

from __future__ import annotations

import math
from typing import Sequence

import cv2
import numpy as np


def crop_transform(box: Sequence[float] | np.ndarray, expand: float, size: int) -> np.ndarray:
    """(2, 3) affine crop pixel -> original pixel for a square crop of side max(w, h) * expand
    centred on the box. Pixel centres at integers: crop pixel u covers the original interval
    [E + u*s, E + (u+1)*s) in edge coordinates, so x = E + (u + 0.5) * s - 0.5."""
    left, top, w, h = (float(v) for v in box)
    side = max(w, h) * expand
    s = side / size
    cx, cy = left + w / 2, top + h / 2  # box centre in edge coordinates
    ex, ey = cx - side / 2, cy - side / 2
    return np.array([[s, 0.0, ex + 0.5 * s - 0.5], [0.0, s, ey + 0.5 * s - 0.5]])


def to_original(points: np.ndarray, crop_to_orig: np.ndarray) -> np.ndarray:
    """(N, K, 2) crop pixels -> original pixels through each face's (2, 3) affine."""
    pts = np.asarray(points, dtype=np.float64)
    a = np.asarray(crop_to_orig, dtype=np.float64)
    return np.einsum("nij,nkj->nki", a[:, :, :2], pts) + a[:, None, :, 2]


def to_crop(points: np.ndarray, crop_to_orig: np.ndarray) -> np.ndarray:
    """Inverse of to_original: (N, K, 2) original pixels -> crop pixels."""
    a = np.asarray(crop_to_orig, dtype=np.float64)
    inv = np.linalg.inv(a[:, :, :2])
    return np.einsum("nij,nkj->nki", inv, np.asarray(points, dtype=np.float64) - a[:, None, :, 2])


def crop_one(image: np.ndarray, a: np.ndarray, size: int) -> np.ndarray:
    """Warp the square region of `image` that the crop->original affine `a` covers into
    (size, size), black where it leaves the image. Large reductions are low-pass filtered
    first (sigma ~ 0.45 x the reduction, INTER_AREA-like), else bilinear sampling aliases
    hair and background texture."""
    s = float(a[0, 0])
    if s > 1.5:
        # blur only the window the crop reads (plus a margin), not the whole photo
        x0, y0 = a[0, 2], a[1, 2]
        m = int(3 * s) + 2
        xa, ya = max(0, int(np.floor(x0)) - m), max(0, int(np.floor(y0)) - m)
        xb = min(image.shape[1], int(np.ceil(x0 + s * size)) + m)
        yb = min(image.shape[0], int(np.ceil(y0 + s * size)) + m)
        if xb > xa and yb > ya:
            image = cv2.GaussianBlur(image[ya:yb, xa:xb], (0, 0), sigmaX=0.45 * s)
            a = a.copy()
            a[0, 2] -= xa
            a[1, 2] -= ya
    return cv2.warpAffine(image, np.ascontiguousarray(a, dtype=np.float64), (size, size),
                          flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0))


def crop_face(image: np.ndarray, box: Sequence[float] | np.ndarray, expand: float,
              side: int) -> tuple[np.ndarray, np.ndarray]:
    """The square crop of one face as `pipeline crop` cuts it: (crop (side, side, C), its
    (2, 3) crop -> original affine) for the box [left, top, w, h] scaled by `expand`."""
    a = crop_transform(box, expand, side)
    return crop_one(image, a, side), a


MAX_BOX_SCALE = 3.0  # a face box may be at most this many times the image's larger side


def check_box(box, width: int, height: int) -> str | None:
    """Why a face box cannot be cropped from a width x height image (None if it can): it
    must be finite, of positive size, overlap the image and be at most MAX_BOX_SCALE x the
    image's larger side (a box far outside the image would cache an all-black face; a huge
    one stalls the crop)."""
    left, top, w, h = (float(v) for v in box)

    def n(v: float) -> str:
        return str(int(v)) if math.isfinite(v) and v == int(v) else f"{v:.6g}"

    if not all(math.isfinite(v) for v in (left, top, w, h)):
        return f"box (left {n(left)}, top {n(top)}, {n(w)}x{n(h)}) is not finite"
    if w <= 0 or h <= 0:
        return f"box has non-positive size {n(w)}x{n(h)}"
    if max(w, h) > MAX_BOX_SCALE * max(width, height):
        return (f"box {n(w)}x{n(h)} is more than {MAX_BOX_SCALE:g}x the image ({width}x{height} px): "
                "not a face of this image")
    if left >= width or top >= height or left + w <= 0 or top + h <= 0:
        return f"box (left {n(left)}, top {n(top)}, {n(w)}x{n(h)}) lies outside the image ({width}x{height} px)"
    return None


def _rescale(points, src: int, dst: int):
    """x' = (x + 0.5) * dst / src - 0.5 for numpy arrays or torch tensors (float dtype
    kept, integers promoted to float64 / float32)."""
    if hasattr(points, "is_floating_point"):  # a torch tensor (not imported here: crop runs without torch)
        p = points if points.is_floating_point() else points.float()
        return p.clone() if src == dst else (p + 0.5) * (dst / src) - 0.5
    p = np.asarray(points)
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(np.float64)
    if src == dst:
        return p.copy()
    return ((p + 0.5) * (dst / src) - 0.5).astype(p.dtype, copy=False)


def crop_to_input(points, cache_size: int, input_size: int):
    """Crop pixels (cache side `cache_size`) -> network-input pixels (side `input_size`):
    x' = (x + 0.5) * s - 0.5 with s = input_size / cache_size. numpy or torch, (..., 2)."""
    return _rescale(points, cache_size, input_size)


def input_to_crop(points, cache_size: int, input_size: int):
    """Inverse of `crop_to_input`: x = (x' + 0.5) / s - 0.5."""
    return _rescale(points, input_size, cache_size)


def box_corners(box: Sequence[float]) -> np.ndarray:
    """[left, top, w, h] in edge coordinates -> pixel-centre corners [[x0, y0], [x1, y1]]."""
    left, top, w, h = (float(v) for v in box)
    return np.array([[left - 0.5, top - 0.5], [left + w - 0.5, top + h - 0.5]])
