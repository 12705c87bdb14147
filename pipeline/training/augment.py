"""Per-sample augmentation that moves keypoints with the pixels.

Images are uint8 torch tensors (C, H, W), C = 3 or 1; keypoints float32 (K, 2), x then y,
pixel centres at integer coordinates (docs/design.md). Outputs stay uint8: the trainer
collates them and converts to float / normalises on the device.

Coordinate conventions
----------------------
* Resizing a side S -> N maps pixel centres as x' = (x + 0.5) * N / S - 0.5
  (`crop_to_input`, `input_to_crop`), which is what bilinear interpolation with
  align_corners=False (torch `interpolate`, torchvision `resize`, OpenCV) does to the image.
* A horizontal flip maps x -> W - 1 - x and swaps left/right indices by `schema.flip_perm`
  (point i of the output is point flip_perm[i] of the input, mirrored), so point 36 of
  IBUG68 stays "the outer eye corner on the image left".
* Points pushed outside the image keep their outside coordinates (never clipped).

How it works
------------
Every geometric step of a sample (random scale incl. the cache -> input resize, flip, and
RandAugment's ShearX/ShearY/TranslateX/TranslateY/Rotate) is a 3x3 matrix in pixel-centre
coordinates. They are multiplied into one affine map, the image is warped once (OpenCV
bilinear on the uint8 planes: one interpolation, no float copy) and the keypoints are
multiplied by the very same matrix, so pixels and labels cannot drift apart. A strong
downscale (< 0.8) is preceded by torchvision's antialiased uint8 resize so the warp does
not alias. Photometric RandAugment ops (Brightness, Color, Contrast, Sharpness, Posterize,
Solarize, AutoContrast, Equalize) then run in their drawn order and leave the keypoints
alone; they give torchvision's results bit for bit (lookup tables built with torchvision's
arithmetic, OpenCV for Sharpness; `fast=False` calls torchvision's kernels instead).
The one difference from running torchvision's RandAugment op by op: a photometric op drawn
before a geometric one is applied after the warp, so its image statistics (Contrast's
mean, AutoContrast's range, Equalize's histogram) include the warp's black fill.

torchvision 0.29 (checked numerically, see tests/test_augment.py)
---------------------------------------------------------------
* `v2.RandAugment` refuses KeyPoints (TypeError). The op list, the magnitude tables
  (num_magnitude_bins=31, magnitude m in 0..30), the sign draw and each op's geometry are
  reproduced here; the tests check the tables against torchvision's and the warped images
  against `v2.functional.affine` / `rotate`.
* `v2.functional.horizontal_flip` on KeyPoints uses x -> W - 1 - x (correct) but cannot
  know the schema: the index swap is ours.
* `v2.functional.resize` on KeyPoints scales x * N / S (off by (N / S - 1) / 2 px).
* `v2.functional.affine` / `rotate` on KeyPoints pivot at (W / 2, H / 2) (or `center`),
  the image kernels at pixel centre ((W - 1) / 2, (H - 1) / 2) (or `center - 0.5`): up to
  ~0.3 px off at 30 degrees. With the pivot corrected they equal the matrices here.
* Speed on the 2-core dev box: one torchvision affine on a 3x96x96 uint8 image ~0.5-0.9 ms
  (it converts to float), the OpenCV warp of all three planes ~0.1 ms; a full
  TrainAugment sample (96 -> 96, RandAugment(2, 7)) ~0.6 ms (~1600 samples/s on one
  core), against ~650/s when every step used torchvision's kernels.

Randomness
----------
Every draw goes through `generator` when one is passed to `__call__`, otherwise through
torch's global RNG (what a DataLoader seeds per worker). Same seed -> same samples.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import cv2
import numpy as np
import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F

from pipeline.keypoints.geometry import crop_to_input
from pipeline.keypoints.schema import KeypointSchema

GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
PHOTOMETRIC_OPS = ("Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize",
                   "AutoContrast", "Equalize")
# the op list of torchvision.transforms.v2.RandAugment, in its order
RANDAUG_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
               "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
# below this linear scale the image is first resized with antialiasing, then warped
ANTIALIAS_BELOW = 0.8


# ---------------------------------------------------------------------------------------
# geometry: 3x3 forward matrices (source pixel centre -> output pixel centre)
# ---------------------------------------------------------------------------------------

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


def flip_matrix(width: int) -> np.ndarray:
    """x -> W - 1 - x."""
    return np.array([[-1.0, 0.0, width - 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


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


_EYE23 = np.eye(3)[:2]


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


# ---------------------------------------------------------------------------------------
# RandAugment ops
# ---------------------------------------------------------------------------------------

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


def _planes_lut(a: np.ndarray, luts) -> np.ndarray:
    """Per-channel 256-entry lookup on a (C, H, W) uint8 array."""
    out = np.empty_like(a)
    for i in range(a.shape[0]):
        lut = luts[i] if isinstance(luts, (list, tuple)) else luts
        cv2.LUT(a[i], lut, dst=out[i])
    return out


_LUT_CACHE: dict[tuple[str, float], np.ndarray] = {}


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
        lut = _RAMP.mul(f).add_(mean, alpha=1.0 - f).clamp_(0, 255).to(torch.uint8)
        return _planes_lut(a, lut.numpy().reshape(256))
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


def apply_op(image: torch.Tensor, keypoints, op: str, value: float, fill: float = 0.0, fast: bool = True):
    """One RandAugment op with signed magnitude `value` on (uint8 (C, H, W), (K, 2)):
    geometric ops warp the image and move the keypoints, the others leave them alone."""
    kp = _as_points(keypoints)
    h, w = image.shape[-2:]
    m = op_matrix(op, value, h, w)
    if m is None:
        return photometric(image, op, value, fast), kp
    if h != w:
        raise ValueError("augment works on square images")
    return warp(image, m, w, fill), transform_points(kp, m)


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
        return _apply(image, _as_points(keypoints), np.eye(3), w, ops, self.fill, None, self.fast)


# ---------------------------------------------------------------------------------------
# the two transforms the trainer uses
# ---------------------------------------------------------------------------------------

def _as_points(keypoints) -> torch.Tensor:
    kp = torch.as_tensor(keypoints)
    if kp.dtype != torch.float32:
        kp = kp.to(torch.float32)
    return kp.reshape(-1, 2)


def _apply(image: torch.Tensor, kp: torch.Tensor, matrix: np.ndarray, out_size: int,
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


class TrainAugment:
    """Random scale -> horizontal flip -> RandAugment, uint8 in and out.

    __call__(image (C, S, S) uint8 with S = cache_size, keypoints (K, 2) crop px,
    generator=None) -> (uint8 (C, input_size, input_size), float32 (K, 2) input px).

    * scale: the face appears f times its eval-time size, f log-uniform in [scale_min,
      scale_max], about the image centre (this also does the cache -> input resize; the
      border left by f < 1 is filled with `fill`).
    * flip with probability flip_p, indices remapped by schema.flip_perm.
    * RandAugment(num_ops=randaug_n, magnitude=randaug_m), torchvision's 31 magnitude bins
      and op list; randaug_n = 0 disables it.
    Randomness: one `torch.rand(2 + 2 * randaug_n)` per sample from `generator` if given,
    else from torch's global RNG: [scale, flip, (op, sign) per RandAugment op]."""

    def __init__(self, schema: KeypointSchema, cache_size: int, input_size: int,
                 scale_min: float = 0.75, scale_max: float = 4 / 3, flip_p: float = 0.5,
                 randaug_n: int = 2, randaug_m: int = 7, fill: float = 0.0, fast: bool = True):
        if not 0 < scale_min <= scale_max:
            raise ValueError(f"need 0 < scale_min <= scale_max, got {scale_min}, {scale_max}")
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"flip_p must be in [0, 1], got {flip_p}")
        self.schema, self.cache_size, self.input_size = schema, int(cache_size), int(input_size)
        self.scale_min, self.scale_max, self.flip_p = float(scale_min), float(scale_max), float(flip_p)
        self.flip_perm = np.asarray(schema.flip_perm, dtype=np.int64)
        self.fill, self.fast = fill, fast
        self.randaug = KeypointRandAugment(int(randaug_n), int(randaug_m), fill=fill, fast=fast)
        self._log_lo, self._log_hi = math.log(self.scale_min), math.log(self.scale_max)

    @classmethod
    def from_config(cls, schema: KeypointSchema, cache_size: int, cfg: dict[str, Any]) -> "TrainAugment":
        """From resolved params: model.input_size, train.scale_min / scale_max / flip /
        randaug_n / randaug_m."""
        t = cfg["train"]
        return cls(schema, cache_size, cfg["model"]["input_size"], scale_min=t["scale_min"],
                   scale_max=t["scale_max"], flip_p=t["flip"], randaug_n=t["randaug_n"],
                   randaug_m=t["randaug_m"])

    def draw(self, generator: torch.Generator | None = None) -> tuple[float, bool, list[tuple[str, float]]]:
        """(scale factor, flip, RandAugment ops) of one sample."""
        u = torch.rand(2 + 2 * self.randaug.num_ops, generator=generator).tolist()
        factor = math.exp(self._log_lo + (self._log_hi - self._log_lo) * u[0])
        flip = u[1] < self.flip_p
        ops = self.randaug.ops_from_uniforms(u[2:], self.input_size, self.input_size)
        return factor, flip, ops

    def matrix(self, factor: float, flip: bool) -> np.ndarray:
        """The crop -> input matrix of a sample's scale and flip."""
        m = scale_matrix(self.cache_size, self.input_size, factor)
        return flip_matrix(self.input_size) @ m if flip else m

    def __call__(self, image: torch.Tensor, keypoints, generator: torch.Generator | None = None):
        if tuple(image.shape[-2:]) != (self.cache_size, self.cache_size):
            raise ValueError(f"expected a {self.cache_size}x{self.cache_size} image, got {tuple(image.shape)}")
        factor, flip, ops = self.draw(generator)
        return _apply(image, _as_points(keypoints), self.matrix(factor, flip), self.input_size, ops,
                      self.fill, self.flip_perm if flip else None, self.fast)


class EvalTransform:
    """Deterministic cache -> input resize (torchvision antialiased bilinear on uint8, the
    filter of `preprocess.resize_batch`), keypoints by `crop_to_input`; `input_to_crop` maps
    predictions back."""

    def __init__(self, schema: KeypointSchema, cache_size: int, input_size: int):
        self.schema, self.cache_size, self.input_size = schema, int(cache_size), int(input_size)

    def __call__(self, image: torch.Tensor, keypoints, generator: torch.Generator | None = None):
        if tuple(image.shape[-2:]) != (self.cache_size, self.cache_size):
            raise ValueError(f"expected a {self.cache_size}x{self.cache_size} image, got {tuple(image.shape)}")
        kp = _as_points(keypoints)
        if self.cache_size != self.input_size:
            image = F.resize_image(image, [self.input_size, self.input_size],
                                   interpolation=InterpolationMode.BILINEAR, antialias=True)
            kp = crop_to_input(kp, self.cache_size, self.input_size)
        return image.contiguous(), kp
