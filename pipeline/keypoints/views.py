"""Scale/shift test-time views on torch batches (`predict.tta_jitter`), the companion of
pipeline/keypoints/flip.py and on the same pixel-centre convention: pixel centres at integers, so the
image centre is c = (W - 1) / 2 (the flip x -> W - 1 - x is the mirror about c).

A view moves every point u of the input to u' = s * (u - c) + c + t (zoom by s about the
centre, then shift by t pixels); the model's answer on the view goes back through the exact
inverse u = (u' - c - t) / s + c. Sampling is bilinear with align_corners=True, whose grid
puts -1 and 1 on the centres of the first and last pixels: the same convention, so a
keypoint-equivariant model gives the same answer on every view. Outside the image a view
shows `fill` (the normalised black that training's augmentation warps fill with)."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

View = tuple[float, float, float]  # (scale, shift_x, shift_y), shifts as fractions of the side


def jitter_views(amount: float) -> list[View]:
    """The extra views of `predict.tta_jitter` = a (0 = none): zoom in by 1 + a, zoom out by
    1 / (1 + a), and diagonal shifts of +-a/2 of the side."""
    if amount <= 0:
        return []
    s, d = 1.0 + amount, amount / 2
    return [(s, 0.0, 0.0), (1.0 / s, 0.0, 0.0), (1.0, d, d), (1.0, -d, -d)]


def _centre_shift(view: View, h: int, w: int) -> tuple[float, float, float, float, float]:
    s, fx, fy = view
    return s, (w - 1) / 2, (h - 1) / 2, fx * w, fy * h


def warp_view(x: torch.Tensor, view: View, fill: torch.Tensor | Sequence[float] | float = 0.0) -> torch.Tensor:
    """(B, C, H, W) float -> the view: output pixel p shows the input at (p - c - t) / s + c."""
    b, c, h, w = x.shape
    s, _, _, tx, ty = _centre_shift(view, h, w)
    # align_corners=True normalises pixel centre u as u_n = (u - c) / ((W - 1) / 2)
    theta = torch.tensor([[1 / s, 0.0, -tx / (s * (w - 1) / 2)],
                          [0.0, 1 / s, -ty / (s * (h - 1) / 2)]], dtype=x.dtype, device=x.device)
    grid = F.affine_grid(theta.expand(b, 2, 3), [b, c, h, w], align_corners=True)
    fill_t = torch.as_tensor(fill, dtype=x.dtype, device=x.device).reshape(1, -1, 1, 1)
    # sampling x - fill with zero padding and adding fill back pads with `fill` exactly
    return F.grid_sample(x - fill_t, grid, mode="bilinear", padding_mode="zeros", align_corners=True) + fill_t


def unwarp_coords(coords: torch.Tensor, view: View, height: int, width: int) -> torch.Tensor:
    """Coordinates predicted on the view (..., K, 2) -> the input's: u = (u' - c - t) / s + c."""
    s, cx, cy, tx, ty = _centre_shift(view, height, width)
    x = (coords[..., 0] - cx - tx) / s + cx
    y = (coords[..., 1] - cy - ty) / s + cy
    return torch.stack([x, y], dim=-1)
