"""Coordinate losses: the point loss, plus a structure loss on the offsets between
neighbouring keypoints (a face's parts move together, so a prediction that gets each
point roughly right but the local shape wrong is penalised twice)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import TrainParams

LOSS_KINDS = ("l1", "l2", "mse", "euclidean", "wing")
WING_WIDTH, WING_CURVATURE = 10.0, 2.0  # the Wing paper's, in pixels (train.wing_width / wing_curvature)


def _check_kind(kind: str) -> None:
    if kind not in LOSS_KINDS:
        raise PipelineError(None, f"train.loss: unknown loss '{kind}' (known: {', '.join(LOSS_KINDS)})")


def wing(err: torch.Tensor, width: float, curvature: float) -> torch.Tensor:
    """Wing loss of |errors| (Feng et al., CVPR 2018): width * ln(1 + err / curvature) below
    `width`, then linear with slope 1 (continuous at `width`). Its slope near 0 is
    width / curvature, so small and medium errors, which L1 weighs no more than large
    ones, pull harder than the few large ones of hard faces."""
    offset = width - width * math.log1p(width / curvature)
    return torch.where(err < width, width * torch.log1p(err / curvature), err - offset)


def keypoint_loss(pred: torch.Tensor, target: torch.Tensor, kind: str = "l1",
                  wing_shape: tuple[float, float] = (WING_WIDTH, WING_CURVATURE)) -> torch.Tensor:
    """pred, target (B, K, ..., 2), x then y -> scalar.

    l1: mean |error| over every coordinate; mse: mean squared error over every
    coordinate; l2: mean per-point Euclidean distance; euclidean: per-point distances
    summed over the keypoints (dim 1), mean over the batch (and any extra dims);
    wing: mean `wing` of |error| over every coordinate, `wing_shape` = (width,
    curvature) in the coordinates' own units."""
    _check_kind(kind)
    diff = pred - target  # (B, K, ..., 2)
    if kind == "l1":
        return diff.abs().mean()
    if kind == "wing":
        return wing(diff.abs(), *wing_shape).mean()
    if kind == "mse":
        return diff.square().mean()
    # vector_norm's gradient at a zero vector is 0 (not NaN), so a perfect point is fine
    dist = torch.linalg.vector_norm(diff, dim=-1)  # (B, K, ...)
    if kind == "l2":
        return dist.mean()
    return dist.sum(1).mean()


def neighbour_offsets(coords: torch.Tensor, neighbours: torch.Tensor) -> torch.Tensor:
    """coords (B, K, 2), neighbours (K, n) -> p_i - p_j for each neighbour j of i: (B, K, n, 2)."""
    return coords[:, :, None, :] - coords[:, neighbours, :]


def structure_loss(pred: torch.Tensor, target: torch.Tensor, neighbours: torch.Tensor,
                   kind: str = "l1", wing_shape: tuple[float, float] = (WING_WIDTH, WING_CURVATURE)
                   ) -> torch.Tensor:
    """The point loss of `kind` between predicted and true neighbour offsets; a constant
    shift of every point costs nothing here (the point loss handles position)."""
    if neighbours.numel() == 0:  # too few points to have neighbours (e.g. nose1)
        return pred.new_zeros(())
    return keypoint_loss(neighbour_offsets(pred, neighbours), neighbour_offsets(target, neighbours), kind, wing_shape)


def gaussian_js(probs: torch.Tensor, target: torch.Tensor, input_hw: tuple[int, int], sigma: float,
                eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """DSNT's regulariser: the Jensen-Shannon divergence (nats, in [0, ln 2]) between each
    soft-argmax map and a normalised Gaussian of `sigma` map pixels around its target, on
    the grid soft_argmax uses (map pixel centres land on the centres of the input pixels
    they cover).

    probs (B, K, h, w), each map summing to 1 (a softmax); target (B, K, 2) input px ->
    (js (B, K), inside (B, K) bool). A target whose Gaussian falls (almost) entirely off
    the map (augmentation can push a point out) has no usable map and is marked outside.

    Only a window of +-ceil(5 sigma) pixels around the target is read: the Gaussian is
    below 4e-6 of its peak beyond it, and wherever the target map is 0 the divergence is
    p ln 2 / 2, so everything outside the window adds ln 2 / 2 times the mass outside,
    1 - (mass inside) for a map that sums to 1. Exact up to that truncation, and the loss
    and its gradient cost a window per map instead of a dozen passes over every pixel of
    (B, K, h, w) (their cost: docs/benchmarks.md)."""
    (h, w), (H, W) = probs.shape[-2:], input_hw
    b, k = probs.shape[:2]
    r = max(1, math.ceil(5 * sigma))
    dtype = torch.promote_types(probs.dtype, torch.float32)  # fp32 under autocast, fp64 kept
    probs, target = probs.to(dtype), target.to(dtype)
    x = (target[..., 0] + 0.5) * (w / W) - 0.5  # (B, K) map px
    y = (target[..., 1] + 0.5) * (h / H) - 0.5
    steps = torch.arange(-r, r + 1, device=probs.device)  # (n,), n = 2r + 1
    # window columns / rows around the nearest pixel (clamped so a far target stays an int)
    cols = x.round().clamp(-r - 1, w + r).long()[..., None] + steps  # (B, K, n)
    rows = y.round().clamp(-r - 1, h + r).long()[..., None] + steps
    col_ok, row_ok = (cols >= 0) & (cols < w), (rows >= 0) & (rows < h)
    gx = torch.exp(-(cols - x[..., None]).square() / (2 * sigma ** 2)) * col_ok  # (B, K, n)
    gy = torch.exp(-(rows - y[..., None]).square() / (2 * sigma ** 2)) * row_ok
    g = gy[..., :, None] * gx[..., None, :]  # (B, K, n, n)
    mass = g.sum((-2, -1))  # (B, K); about 2 pi sigma^2 for a target well inside
    # at least a quarter of the Gaussian on the map (a target on the border keeps half)
    inside = mass > 0.25 * (2 * math.pi * sigma ** 2)
    q = g / mass.clamp_min(1e-12)[..., None, None]
    index = rows.clamp(0, h - 1)[..., :, None] * w + cols.clamp(0, w - 1)[..., None, :]  # (B, K, n, n)
    ok = row_ok[..., :, None] & col_ok[..., None, :]
    p = probs.reshape(b, k, h * w).gather(-1, index.reshape(b, k, -1)).reshape(index.shape) * ok
    log_m = (0.5 * (p + q) + eps).log()
    window = (p * ((p + eps).log() - log_m) + q * ((q + eps).log() - log_m)).sum((-2, -1))  # (B, K)
    js = 0.5 * window + (0.5 * math.log(2)) * (1 - p.sum((-2, -1)))
    return js, inside


class KeypointLoss(nn.Module):
    """forward(pred, target, probs=None, input_hw=None) -> (total, {"main", "structure",
    "heatmap"}), parts detached.

    total = point loss + structure_lambda * structure loss + heatmap_lambda * heatmap loss.

    `coord_scale` multiplies every coordinate before the point and structure losses:
    2 / input_size puts them on the [-1, 1] scale of the integral-regression papers
    (DSNT), so a loss value and a learning rate mean the same at any input size. The
    heatmap loss (DSNT's regulariser) is the Jensen-Shannon divergence between each
    soft-argmax map `probs` (B, K, h, w) and a Gaussian of `heatmap_sigma` map pixels
    around the target: it keeps the maps compact and unimodal, which the expectation
    alone does not ask for."""

    neighbours: torch.Tensor  # (K, n) long buffer

    def __init__(self, kind: str = "l1", structure_lambda: float = 0.2,
                 neighbours: torch.Tensor | np.ndarray | None = None, *, coord_scale: float = 1.0,
                 heatmap_lambda: float = 0.0, heatmap_sigma: float = 1.0,
                 wing_width: float = WING_WIDTH, wing_curvature: float = WING_CURVATURE):
        super().__init__()
        _check_kind(kind)
        for name, v, lo in (("structure_lambda", structure_lambda, 0.0), ("heatmap_lambda", heatmap_lambda, 0.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise PipelineError(None, f"train.{name} must be a number >= 0, got {v!r}")
        for name, v in (("heatmap_sigma", heatmap_sigma), ("coord_scale", coord_scale),
                        ("wing_width", wing_width), ("wing_curvature", wing_curvature)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PipelineError(None, f"train.{name} must be a number > 0, got {v!r}")
        nb = torch.zeros(0, 0, dtype=torch.long) if neighbours is None else torch.as_tensor(neighbours).long()
        if nb.numel() and nb.dim() != 2:
            raise PipelineError(None, f"structure-loss neighbours must be (K, n), got shape {tuple(nb.shape)}")
        self.kind, self.structure_lambda = kind, float(structure_lambda)
        self.coord_scale = float(coord_scale)
        self.heatmap_lambda, self.heatmap_sigma = float(heatmap_lambda), float(heatmap_sigma)
        # the wing's shape is given in input px, like the errors it shapes
        self.wing_width, self.wing_curvature = float(wing_width), float(wing_curvature)
        self.wing_shape = (self.wing_width * self.coord_scale, self.wing_curvature * self.coord_scale)
        self.register_buffer("neighbours", nb, persistent=False)

    @property
    def needs_maps(self) -> bool:
        return self.heatmap_lambda > 0

    def forward(self, pred: torch.Tensor, target: torch.Tensor, probs: torch.Tensor | None = None,
                input_hw: tuple[int, int] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        p, t = pred * self.coord_scale, target * self.coord_scale  # (B, K, 2)
        main = keypoint_loss(p, t, self.kind, self.wing_shape)
        total = main
        struct = heat = main.new_zeros(())
        if self.structure_lambda > 0 and self.neighbours.numel():
            if self.neighbours.shape[0] != pred.shape[1]:
                raise ValueError(f"neighbours are for {self.neighbours.shape[0]} keypoints, "
                                 f"predictions have {pred.shape[1]}")
            struct = structure_loss(p, t, self.neighbours, self.kind, self.wing_shape)
            total = total + self.structure_lambda * struct
        if self.heatmap_lambda > 0:
            if probs is None or input_hw is None:
                raise ValueError("heatmap_lambda > 0 needs the soft-argmax maps (a heatmap model)")
            js, inside = gaussian_js(probs, target, (input_hw[0], input_hw[1]), self.heatmap_sigma)  # (B, K)
            heat = (js * inside).sum() / inside.sum().clamp_min(1)
            total = total + self.heatmap_lambda * heat
        return total, {"main": main.detach(), "structure": struct.detach(), "heatmap": heat.detach()}

    def extra_repr(self) -> str:
        return (f"kind={self.kind!r}, structure_lambda={self.structure_lambda}, "
                f"neighbours={tuple(self.neighbours.shape)}, coord_scale={self.coord_scale}, "
                f"heatmap_lambda={self.heatmap_lambda}, heatmap_sigma={self.heatmap_sigma}"
                + (f", wing_width={self.wing_width}, wing_curvature={self.wing_curvature}" if self.kind == "wing" else ""))


def build_loss(kind: str = "l1", structure_lambda: float = 0.2,
               neighbours: torch.Tensor | np.ndarray | None = None, *, coord_scale: float = 1.0,
               heatmap_lambda: float = 0.0, heatmap_sigma: float = 1.0,
               wing_width: float = WING_WIDTH, wing_curvature: float = WING_CURVATURE) -> KeypointLoss:
    """The training loss; `neighbours` (K, n) int from `schema.neighbours(mean_shape)`."""
    return KeypointLoss(kind, structure_lambda, neighbours, coord_scale=coord_scale,
                        heatmap_lambda=heatmap_lambda, heatmap_sigma=heatmap_sigma,
                        wing_width=wing_width, wing_curvature=wing_curvature)


def loss_from_params(tcfg: TrainParams, input_size: int, neighbours, heatmap_model: bool = True) -> KeypointLoss:
    """The loss of a `train` params section for a model of `input_size` pixels. The heatmap
    regulariser shapes soft-argmax maps: a regression model (`heatmap_model` False) has
    none, so it trains without it."""
    return build_loss(tcfg.loss, tcfg.structure_lambda, neighbours,
                      coord_scale=2.0 / input_size if tcfg.normalize_coords else 1.0,
                      heatmap_lambda=tcfg.heatmap_lambda if heatmap_model else 0.0,
                      heatmap_sigma=tcfg.heatmap_sigma, wing_width=tcfg.wing_width,
                      wing_curvature=tcfg.wing_curvature)
