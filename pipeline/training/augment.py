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

torchvision 0.29 (checked numerically, see tests/training/test_augment.py)
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
* Speed: a torchvision affine converts the uint8 image to float; the OpenCV warp of the
  three planes stays in uint8 and is several times cheaper, which is why the warps here
  are OpenCV's (docs/benchmarks.md).

Randomness
----------
Every draw goes through `generator` when one is passed to `__call__`, otherwise through
torch's global RNG. Training passes each sample a generator of its own, seeded by
(train.seed, epoch, sample) (pipeline/training/loader.py `FaceDataset`), so the draws do not
depend on which DataLoader worker makes the sample. Same seed -> same samples.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from pipeline.core.params_schema import Config
from pipeline.keypoints.flip import flip_matrix
from pipeline.keypoints.schema import KeypointSchema
from pipeline.training.affine import scale_matrix
from pipeline.training.randaugment import KeypointRandAugment, apply_ops, as_points


class TrainAugment:
    """Random scale -> horizontal flip -> RandAugment, uint8 in and out.

    __call__(image (C, S, S) uint8 with S = cache_size, keypoints (K, 2) crop px,
    generator=None) -> (uint8 (C, input_size, input_size), float32 (K, 2) input px).

    * scale: the face appears f times its eval-time size, f log-uniform in [scale_min,
      scale_max], about the image centre (this also does the cache -> input resize; the
      border left by f < 1 is filled with `fill`).
    * flip with probability flip_p, indices remapped by schema.flip_perm.
    * rotation by an angle uniform in [-rotate, rotate] degrees about the image centre
      (0 = off; RandAugment's own Rotate is at most 30 * m / 30 degrees and drawn 1 op in 14).
    * RandAugment(num_ops=randaug_n, magnitude=randaug_m), torchvision's 31 magnitude bins
      and op list; randaug_n = 0 disables it.
    * erase: with this probability, one rectangle of the output (area 2-33% of the image,
      aspect 0.3-3.3, log-uniform, anywhere it fits) is filled with one uniform random grey:
      an occluder. The keypoints under it keep their labels, so the model learns to place
      hidden points from the rest of the face (RandomErasing, Zhong et al. 2020).
    Randomness: one `torch.rand(2 + 2 * randaug_n)` per sample from `generator` if given,
    else from torch's global RNG: [scale, flip, (op, sign) per RandAugment op], one more
    uniform with rotate > 0, then `torch.rand(6)` with erase > 0."""

    def __init__(self, schema: KeypointSchema, cache_size: int, input_size: int,
                 scale_min: float = 0.75, scale_max: float = 4 / 3, flip_p: float = 0.5,
                 randaug_n: int = 2, randaug_m: int = 7, fill: float = 0.0, fast: bool = True,
                 rotate: float = 0.0, erase: float = 0.0):
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
        if not 0.0 <= rotate <= 180.0:
            raise ValueError(f"rotate must be in [0, 180] degrees, got {rotate}")
        self.rotate = float(rotate)
        if not 0.0 <= erase <= 1.0:
            raise ValueError(f"erase must be in [0, 1], got {erase}")
        self.erase = float(erase)

    @classmethod
    def from_config(cls, schema: KeypointSchema, cache_size: int, cfg: Config) -> "TrainAugment":
        """From resolved params: model.input_size, train.scale_min / scale_max / flip /
        randaug_n / randaug_m."""
        t = cfg.train
        return cls(schema, cache_size, cfg.model.input_size, scale_min=t.scale_min,
                   scale_max=t.scale_max, flip_p=t.flip, randaug_n=t.randaug_n,
                   randaug_m=t.randaug_m, rotate=t.rotate, erase=t.erase)

    def draw(self, generator: torch.Generator | None = None) -> tuple[float, bool, list[tuple[str, float]]]:
        """(scale factor, flip, geometric and RandAugment ops) of one sample. With `rotate`
        a ("Rotate", angle) op, angle uniform in [-rotate, rotate] degrees about the image
        centre, comes first; its uniform is drawn last, so rotate 0 draws exactly as before."""
        n = 2 + 2 * self.randaug.num_ops
        u = torch.rand(n + (self.rotate > 0), generator=generator).tolist()
        factor = math.exp(self._log_lo + (self._log_hi - self._log_lo) * u[0])
        flip = u[1] < self.flip_p
        ops = self.randaug.ops_from_uniforms(u[2:n], self.input_size, self.input_size)
        if self.rotate > 0:
            ops = [("Rotate", (2.0 * u[n] - 1.0) * self.rotate)] + ops
        return factor, flip, ops

    def matrix(self, factor: float, flip: bool) -> np.ndarray:
        """The crop -> input matrix of a sample's scale and flip."""
        m = scale_matrix(self.cache_size, self.input_size, factor)
        return flip_matrix(self.input_size) @ m if flip else m

    def __call__(self, image: torch.Tensor, keypoints, generator: torch.Generator | None = None):
        if tuple(image.shape[-2:]) != (self.cache_size, self.cache_size):
            raise ValueError(f"expected a {self.cache_size}x{self.cache_size} image, got {tuple(image.shape)}")
        factor, flip, ops = self.draw(generator)
        out, kp = apply_ops(image, as_points(keypoints), self.matrix(factor, flip), self.input_size, ops,
                            self.fill, self.flip_perm if flip else None, self.fast)
        if self.erase > 0:  # drawn after every other draw: erase 0 draws exactly as before
            out = erase_rectangle(out, torch.rand(6, generator=generator).tolist(), self.erase)
        return out, kp


ERASE_AREA = (0.02, 1 / 3)  # share of the image's area (RandomErasing's defaults)
ERASE_ASPECT = (0.3, 1 / 0.3)  # height / width, log-uniform


def erase_rectangle(image: torch.Tensor, u: Sequence[float], p: float) -> torch.Tensor:
    """`image` (C, H, W) uint8 with, if u[0] < p, one rectangle filled with one grey level:
    area and aspect from u[1], u[2] (log-uniform in ERASE_AREA, ERASE_ASPECT), position
    from u[3], u[4] (anywhere it fits), grey from u[5]."""
    if u[0] >= p:
        return image
    _, h, w = image.shape
    area = h * w * math.exp(math.log(ERASE_AREA[0]) + u[1] * math.log(ERASE_AREA[1] / ERASE_AREA[0]))
    aspect = math.exp(math.log(ERASE_ASPECT[0]) + u[2] * math.log(ERASE_ASPECT[1] / ERASE_ASPECT[0]))
    eh = min(h, max(1, round(math.sqrt(area * aspect))))
    ew = min(w, max(1, round(math.sqrt(area / aspect))))
    top, left = int(u[3] * (h - eh + 1 - 1e-9)), int(u[4] * (w - ew + 1 - 1e-9))
    out = image.clone()
    out[:, top:top + eh, left:left + ew] = int(u[5] * 255.999)
    return out
