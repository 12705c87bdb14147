"""Geometric augmentation as 3x3 matrices in pixel-centre coordinates (pipeline/training/augment.py
explains the conventions): resize, random scale, RandAugment's shear/translate/rotate, the one
warp of the uint8 planes, and the same matrix applied to the keypoints."""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F

# below this linear scale the image is first resized with antialiasing, then warped
ANTIALIAS_BELOW = 0.8


_EYE23 = np.eye(3)[:2]


def resize_matrix(src: int, dst: int) -> np.ndarray:
    """The `crop_to_input` map as a matrix."""
    s = dst / src
    return np.array([[s, 0.0, 0.5 * s - 0.5], [0.0, s, 0.5 * s - 0.5], [0.0, 0.0, 1.0]])


def scale_matrix(cache_size: int, input_size: int, factor: float) -> np.ndarray:
    """crop -> input (`crop_to_input`), then scaled by `factor` about the input centre
    (N - 1) / 2: the face appears `factor` times its eval-time size."""
    c = (input_size - 1) * 0.5
    about = np.array([[factor, 0.0, c * (1 - factor)], [0.0, factor, c * (1 - factor)], [0.0, 0.0, 1.0]])
    return about @ resize_matrix(cache_size, input_size)


def op_matrix(op: str, value: float, height: int, width: int) -> np.ndarray | None:
    """Forward matrix of a geometric RandAugment op with signed magnitude `value`, exactly as
    torchvision's RandAugment moves the image's pixels (None for non-geometric ops):
    ShearX/Y: x' = x - value * (y + 0.5) (resp. y' = y - value * (x + 0.5)), i.e.
    torchvision's shear of atan(value) about the top-left corner (pixel centre (-0.5, -0.5));
    TranslateX/Y: int(value) px; Rotate: `value` degrees counter-clockwise about the
    image centre ((W - 1) / 2, (H - 1) / 2)."""
    if op == "ShearX":  # x' = x - value * (y + 0.5)
        return np.array([[1.0, -value, -0.5 * value], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    if op == "ShearY":  # y' = y - value * (x + 0.5)
        return np.array([[1.0, 0.0, 0.0], [-value, 1.0, -0.5 * value], [0.0, 0.0, 1.0]])
    if op == "TranslateX":
        return np.array([[1.0, 0.0, float(int(value))], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    if op == "TranslateY":
        return np.array([[1.0, 0.0, 0.0], [0.0, 1.0, float(int(value))], [0.0, 0.0, 1.0]])
    if op == "Rotate":
        a = math.radians(value)
        ca, sa = math.cos(a), math.sin(a)
        cx, cy = (width - 1) * 0.5, (height - 1) * 0.5
        # y points down, so counter-clockwise on screen is x' = c x + s y, y' = -s x + c y
        return np.array([[ca, sa, cx - ca * cx - sa * cy], [-sa, ca, cy + sa * cx - ca * cy], [0.0, 0.0, 1.0]])
    return None


def transform_points(keypoints: torch.Tensor, matrix: np.ndarray, perm: np.ndarray | None = None) -> torch.Tensor:
    """Apply a 3x3 (or 2x3) affine matrix to (K, 2) points in float64 (then reorder them by
    `perm`, e.g. a flip permutation); float32 out."""
    kp = keypoints.detach().cpu().numpy().reshape(-1, 2).astype(np.float64)
    out = kp @ matrix[:2, :2].T + matrix[:2, 2]
    if perm is not None and len(out):
        out = out[perm]
    return torch.from_numpy(out.astype(np.float32))


def _is_identity(matrix: np.ndarray) -> bool:
    return bool(np.array_equal(matrix[:2], _EYE23))


def warp(image: torch.Tensor, matrix: np.ndarray, out_size: int, fill: float = 0.0) -> torch.Tensor:
    """Warp a uint8 (C, H, W) image by a forward 3x3 matrix into (C, out_size, out_size):
    bilinear, constant `fill` outside. A strong downscale first goes through torchvision's
    antialiased resize (the remaining warp then scales by about 1)."""
    if image.dtype != torch.uint8:
        raise TypeError(f"expected a uint8 image, got {image.dtype}")
    h, w = image.shape[-2:]
    if (h, w) == (out_size, out_size) and _is_identity(matrix):
        return image.clone()
    k = math.sqrt(abs(float(matrix[0, 0] * matrix[1, 1] - matrix[0, 1] * matrix[1, 0])))
    if k < ANTIALIAS_BELOW and h == w:
        side = max(1, int(round(h * k)))
        image = F.resize_image(image, [side, side], interpolation=InterpolationMode.BILINEAR, antialias=True)
        matrix = matrix @ np.linalg.inv(resize_matrix(h, side))
    src = image.contiguous().cpu().numpy()
    c = src.shape[0]
    out = torch.empty((c, out_size, out_size), dtype=torch.uint8)
    dst = out.numpy()
    m = np.ascontiguousarray(matrix[:2], dtype=np.float64)
    for i in range(c):
        cv2.warpAffine(src[i], m, (out_size, out_size), dst=dst[i], flags=cv2.INTER_LINEAR,
                       borderMode=cv2.BORDER_CONSTANT, borderValue=float(fill))
    return out
