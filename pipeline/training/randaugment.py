"""RandAugment for keypoints: torchvision's op list and magnitude tables, its photometric ops
on uint8 images (bit-exact lookup tables; OpenCV for Sharpness), and `KeypointRandAugment`,
whose geometric ops move the keypoints with the pixels (pipeline/training/affine.py)."""

from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from pipeline.training.affine import op_matrix, transform_points, warp

GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
PHOTOMETRIC_OPS = ("Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize",
                   "AutoContrast", "Equalize")
# the op list of torchvision.transforms.v2.RandAugment, in its order
RANDAUG_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
               "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")


def randaug_magnitudes(op: str, num_bins: int, height: int, width: int) -> tuple[torch.Tensor | None, bool]:
    """(magnitude table, signed) of an op, as torchvision.transforms.v2.RandAugment defines it."""
    if op in ("Identity", "AutoContrast", "Equalize"):
        return None, False
    if op in ("ShearX", "ShearY"):
        return torch.linspace(0.0, 0.3, num_bins), True
    if op == "TranslateX":
        return torch.linspace(0.0, 150.0 / 331.0 * width, num_bins), True
    if op == "TranslateY":
        return torch.linspace(0.0, 150.0 / 331.0 * height, num_bins), True
    if op == "Rotate":
        return torch.linspace(0.0, 30.0, num_bins), True
    if op in ("Brightness", "Color", "Contrast", "Sharpness"):
        return torch.linspace(0.0, 0.9, num_bins), True
    if op == "Posterize":
        return (8 - (torch.arange(num_bins) / ((num_bins - 1) / 4))).round().int(), False
    if op == "Solarize":
        return torch.linspace(1.0, 0.0, num_bins), False
    raise ValueError(f"unknown RandAugment op {op!r}")


_RAMP = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)


_SHARPEN = np.full((3, 3), 1.0 / 13.0, dtype=np.float32)
_SHARPEN[1, 1] = 5.0 / 13.0
_LUT_CACHE: dict[tuple[str, float], np.ndarray] = {}


def _planes_lut(a: np.ndarray, luts) -> np.ndarray:
    """Per-channel 256-entry lookup on a (C, H, W) uint8 array."""
    out = np.empty_like(a)
    for i in range(a.shape[0]):
        lut = luts[i] if isinstance(luts, (list, tuple)) else luts
        cv2.LUT(a[i], lut, dst=out[i])
    return out


def _fast_photometric(a: np.ndarray, op: str, value: float) -> np.ndarray | None:
    """uint8 (C, H, W) numpy versions of torchvision's kernels: pointwise ops as lookup
    tables computed by torchvision's own arithmetic on the 0..255 ramp (bit-identical),
    the image statistics (min / max, histogram, mean) computed as torchvision does.
    None: no faster version here (Color, Posterize), use torchvision's."""
    if op in ("Brightness", "Solarize"):
        lut = _LUT_CACHE.get((op, value))
        if lut is None:
            if op == "Brightness":
                lut = F.adjust_brightness_image(_RAMP, 1.0 + value)
            else:
                lut = F.solarize_image(_RAMP, 255.0 * value)
            lut = _LUT_CACHE.setdefault((op, value), lut.numpy().reshape(256).copy())
        return _planes_lut(a, lut)
    if op == "AutoContrast":
        # torchvision: (x - min) / ((max - min) * (1 / 255)), float32, clamped, truncated
        lo = a.min(axis=(1, 2)).astype(np.float32)
        hi = a.max(axis=(1, 2)).astype(np.float32)
        same = lo == hi
        inv_scale = (hi - lo) * np.float32(1.0 / 255.0)
        lo[same], inv_scale[same] = 0.0, 1.0
        luts = (np.arange(256, dtype=np.float32)[None] - lo[:, None]) / inv_scale[:, None]
        return _planes_lut(a, list(np.clip(luts, 0, 255).astype(np.uint8)))
    if op == "Equalize":
        luts = []
        n = a.shape[1] * a.shape[2]
        for i in range(a.shape[0]):
            hist = np.bincount(a[i].reshape(-1), minlength=256).astype(np.int64)
            cum = np.cumsum(hist)
            step = (n - hist[int(np.argmax(cum))]) // 255
            if step == 0:
                luts.append(np.arange(256, dtype=np.uint8))
                continue
            lut = np.zeros(256, dtype=np.uint8)
            lut[1:] = np.clip((cum[:-1] + step // 2) // step, 0, 255)
            luts.append(lut)
        return _planes_lut(a, luts)
    if op == "Contrast":
        t = torch.from_numpy(a)
        if a.shape[0] == 3:  # torchvision's luma, floored for uint8
            r, g, b = t.unbind(dim=-3)
            gray = r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).floor_().unsqueeze(0)
        else:
            gray = t.to(torch.float32)
        mean = torch.mean(gray, dim=(-3, -2, -1), keepdim=True)
        f = 1.0 + value
        ramp = _RAMP.mul(f).add_(mean, alpha=1.0 - f).clamp_(0, 255).to(torch.uint8)
        return _planes_lut(a, ramp.numpy().reshape(256))
    if op == "Sharpness":
        h, w = a.shape[-2:]
        if h <= 2 or w <= 2:
            return a
        f = 1.0 + value
        out = np.empty_like(a)
        for i in range(a.shape[0]):
            x = a[i].astype(np.float32)
            blur = np.rint(cv2.filter2D(x, -1, _SHARPEN, borderType=cv2.BORDER_CONSTANT)[1:-1, 1:-1])
            view = x[1:-1, 1:-1]
            view += np.float32(1.0 - f) * (blur - view)
            np.clip(x, 0, 255, out=x)
            out[i] = x.astype(np.uint8)
        return out
    return None


def photometric(image: torch.Tensor, op: str, value: float, fast: bool = True) -> torch.Tensor:
    """A non-geometric RandAugment op on a uint8 (C, H, W) image, as torchvision's
    RandAugment applies it (fast=False: with torchvision's kernels; fast=True: with the
    equivalent lookup-table / OpenCV kernels above, same results). Identity and geometric
    ops return the image unchanged."""
    if op == "Identity" or op in GEOMETRIC_OPS:
        return image
    if op not in PHOTOMETRIC_OPS:
        raise ValueError(f"unknown RandAugment op {op!r}")
    if fast and image.dtype == torch.uint8:
        out = _fast_photometric(image.contiguous().numpy(), op, value)
        if out is not None:
            return torch.from_numpy(out)
    if op == "Brightness":
        return F.adjust_brightness_image(image, brightness_factor=1.0 + value)
    if op == "Color":
        return F.adjust_saturation_image(image, saturation_factor=1.0 + value)
    if op == "Contrast":
        return F.adjust_contrast_image(image, contrast_factor=1.0 + value)
    if op == "Sharpness":
        return F.adjust_sharpness_image(image, sharpness_factor=1.0 + value)
    if op == "Posterize":
        return F.posterize_image(image, bits=int(value))
    if op == "Solarize":
        return F.solarize_image(image, threshold=(255.0 if image.dtype == torch.uint8 else 1.0) * value)
    if op == "AutoContrast":
        return F.autocontrast_image(image)
    return F.equalize_image(image)


class KeypointRandAugment:
    """torchvision's RandAugment(num_ops, magnitude, num_magnitude_bins=31) for an image
    plus keypoints: `num_ops` ops drawn uniformly (with replacement) from RANDAUG_OPS, each
    at magnitude bin `magnitude`, signed ops negated with probability 1/2.

    `draw` returns the ops of one sample; `__call__` applies them (geometric ones fused into
    one warp, then the photometric ones in order). Each op consumes two uniforms (op, sign)
    from `generator` or torch's global RNG."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31,
                 fill: float = 0.0, ops: Sequence[str] = RANDAUG_OPS, fast: bool = True):
        if not isinstance(num_ops, int) or num_ops < 0:
            raise ValueError(f"num_ops must be a non-negative integer, got {num_ops!r}")
        if not 0 <= magnitude < num_magnitude_bins:
            raise ValueError(f"magnitude must be in 0..{num_magnitude_bins - 1}, got {magnitude!r}")
        unknown = set(ops) - set(RANDAUG_OPS)
        if unknown or not ops:
            raise ValueError(f"unknown RandAugment ops {sorted(unknown)}")
        self.num_ops, self.magnitude, self.num_magnitude_bins = num_ops, int(magnitude), num_magnitude_bins
        self.fill, self.fast = fill, fast
        self.ops = tuple(ops)
        self._table: dict[tuple[str, int, int], tuple[float | None, bool]] = {}

    def value(self, op: str, height: int, width: int) -> tuple[float | None, bool]:
        """(unsigned magnitude value or None, signed) of `op` at this magnitude bin."""
        key = (op, height, width)
        if key not in self._table:
            mags, signed = randaug_magnitudes(op, self.num_magnitude_bins, height, width)
            self._table[key] = (None if mags is None else float(mags[self.magnitude]), signed)
        return self._table[key]

    def ops_from_uniforms(self, u: Sequence[float], height: int, width: int) -> list[tuple[str, float]]:
        """(op, signed magnitude) list from 2 * num_ops uniforms in [0, 1)."""
        chosen = []
        for j in range(self.num_ops):
            op = self.ops[min(int(u[2 * j] * len(self.ops)), len(self.ops) - 1)]
            value, signed = self.value(op, height, width)
            if value is None:
                value = 0.0
            elif signed and u[2 * j + 1] <= 0.5:
                value = -value
            chosen.append((op, value))
        return chosen

    def draw(self, height: int, width: int, generator: torch.Generator | None = None) -> list[tuple[str, float]]:
        """The (op, signed magnitude) list of one sample."""
        if self.num_ops == 0:
            return []
        return self.ops_from_uniforms(torch.rand(2 * self.num_ops, generator=generator).tolist(), height, width)

    def __call__(self, image: torch.Tensor, keypoints, generator: torch.Generator | None = None):
        h, w = image.shape[-2:]
        ops = self.draw(h, w, generator)
        return apply_ops(image, as_points(keypoints), np.eye(3), w, ops, self.fill, None, self.fast)


def as_points(keypoints) -> torch.Tensor:
    kp = torch.as_tensor(keypoints)
    if kp.dtype != torch.float32:
        kp = kp.to(torch.float32)
    return kp.reshape(-1, 2)


def apply_ops(image: torch.Tensor, kp: torch.Tensor, matrix: np.ndarray, out_size: int,
           ops: Sequence[tuple[str, float]], fill: float, perm: np.ndarray | None,
           fast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`matrix` (the sample's scale / flip) composed with the geometric `ops` -> one warp
    to out_size, keypoints by the same matrix (then reordered by `perm`); then the
    photometric `ops` in order."""
    if image.ndim != 3 or image.shape[-1] != image.shape[-2]:
        raise ValueError(f"expected a square (C, S, S) image, got {tuple(image.shape)}")
    for op, value in ops:
        m = op_matrix(op, value, out_size, out_size)
        if m is not None:
            matrix = m @ matrix
    image = warp(image, matrix, out_size, fill)
    kp = transform_points(kp, matrix, perm)
    for op, value in ops:
        image = photometric(image, op, value, fast)
    return image, kp
