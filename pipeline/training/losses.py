"""Coordinate losses: the point loss, plus a structure loss on the offsets between
neighbouring keypoints (a face's parts move together, so a prediction that gets each
point roughly right but the local shape wrong is penalised twice)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from pipeline.core.config import TrainParams
from pipeline.core.errors import PipelineError

LOSS_KINDS = ("l1", "l2", "mse", "euclidean")


def _check_kind(kind: str) -> None:
    if kind not in LOSS_KINDS:
        raise PipelineError(None, f"train.loss: unknown loss '{kind}' (known: {', '.join(LOSS_KINDS)})")


def keypoint_loss(pred: torch.Tensor, target: torch.Tensor, kind: str = "l1") -> torch.Tensor:
    """pred, target (B, K, ..., 2), x then y -> scalar.

    l1: mean |error| over every coordinate; mse: mean squared error over every
    coordinate; l2: mean per-point Euclidean distance; euclidean: per-point distances
    summed over the keypoints (dim 1), mean over the batch (and any extra dims)."""
    _check_kind(kind)
    diff = pred - target  # (B, K, ..., 2)
    if kind == "l1":
        return diff.abs().mean()
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
                   kind: str = "l1") -> torch.Tensor:
    """The point loss of `kind` between predicted and true neighbour offsets; a constant
    shift of every point costs nothing here (the point loss handles position)."""
    if neighbours.numel() == 0:  # too few points to have neighbours (e.g. nose1)
        return pred.new_zeros(())
    return keypoint_loss(neighbour_offsets(pred, neighbours), neighbour_offsets(target, neighbours), kind)


def gaussian_maps(target: torch.Tensor, map_hw: tuple[int, int], input_hw: tuple[int, int],
                  sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Target maps for the heatmap regulariser: a normalised Gaussian of `sigma` map pixels
    around each target, on the same grid soft_argmax uses (map pixel centres land on the
    centres of the input pixels they cover).

    target (B, K, 2) input px -> (maps (B, K, h, w), inside (B, K) bool). A target whose
    Gaussian falls (almost) entirely off the map (augmentation can push a point out) has
    no usable map and is marked outside."""
    (h, w), (H, W) = map_hw, input_hw
    x = (target[..., 0] + 0.5) * (w / W) - 0.5  # (B, K) map px
    y = (target[..., 1] + 0.5) * (h / H) - 0.5
    xs = torch.arange(w, device=target.device, dtype=target.dtype)
    ys = torch.arange(h, device=target.device, dtype=target.dtype)
    gx = torch.exp(-(xs - x[..., None]).square() / (2 * sigma ** 2))  # (B, K, w)
    gy = torch.exp(-(ys - y[..., None]).square() / (2 * sigma ** 2))  # (B, K, h)
    g = gy[..., :, None] * gx[..., None, :]  # (B, K, h, w)
    mass = g.sum((-2, -1))  # (B, K); about 2 pi sigma^2 for a target well inside
    # at least a quarter of the Gaussian on the map (a target on the border keeps half)
    inside = mass > 0.25 * (2 * math.pi * sigma ** 2)
    return g / mass.clamp_min(1e-12)[..., None, None], inside


def _dot_hw(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum over the map of a * b: (N, h, w) x (N, h, w) -> (N,), without an (N, h, w) product."""
    n, hw = a.shape[0], a.shape[-2] * a.shape[-1]
    return torch.bmm(a.reshape(n, 1, hw), b.reshape(n, hw, 1)).reshape(n)


class _JSDivergence(torch.autograd.Function):
    """JS(p, q) with q a constant target. Autograd of the plain formula keeps about ten
    map-sized tensors per step for its backward and runs as many element-wise passes; on
    (32, 68, 48, 48) maps that made the regulariser a fifth of a training step on the CPU.
    Here the forward computes the exact gradient once (the eps terms included) and saves
    only it."""

    @staticmethod
    def forward(ctx, p: torch.Tensor, q: torch.Tensor, eps: float) -> torch.Tensor:  # (N, h, w) x2 -> (N,)
        with torch.no_grad():
            m_eps = (p + q).mul_(0.5).add_(eps)  # m + eps, m = (p + q) / 2
            log_m = m_eps.log()
            p_eps = p + eps
            d_p = p_eps.log().sub_(log_m)  # log(p + eps) - log(m + eps)
            kl_pm = _dot_hw(p, d_p)
            kl_qm = _dot_hw(q, (q + eps).log_().sub_(log_m))
            # d/dp of 0.5 * (p d_p + q (log(q + eps) - log(m + eps))) is
            # 0.5 * (d_p + p / (p + eps) - m / (m + eps))
            #   = 0.5 * (d_p + eps / (m + eps) - eps / (p + eps))
            grad = d_p.add_(m_eps.reciprocal_().sub_(p_eps.reciprocal_()).mul_(eps)).mul_(0.5)
        ctx.save_for_backward(grad)
        return 0.5 * (kl_pm + kl_qm)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_out[:, None, None], None, None


def js_divergence(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Jensen-Shannon divergence (nats, in [0, ln 2]) between maps (..., h, w) -> (...),
    differentiable in p only (q is the target)."""
    lead, (h, w) = p.shape[:-2], p.shape[-2:]
    q = q.detach().expand_as(p)
    js = _JSDivergence.apply(p.reshape(-1, h, w), q.reshape(-1, h, w), eps)
    return js.reshape(lead)


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
                 heatmap_lambda: float = 0.0, heatmap_sigma: float = 1.0):
        super().__init__()
        _check_kind(kind)
        for name, v, lo in (("structure_lambda", structure_lambda, 0.0), ("heatmap_lambda", heatmap_lambda, 0.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise PipelineError(None, f"train.{name} must be a number >= 0, got {v!r}")
        for name, v in (("heatmap_sigma", heatmap_sigma), ("coord_scale", coord_scale)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PipelineError(None, f"train.{name} must be a number > 0, got {v!r}")
        nb = torch.zeros(0, 0, dtype=torch.long) if neighbours is None else torch.as_tensor(neighbours).long()
        if nb.numel() and nb.dim() != 2:
            raise PipelineError(None, f"structure-loss neighbours must be (K, n), got shape {tuple(nb.shape)}")
        self.kind, self.structure_lambda = kind, float(structure_lambda)
        self.coord_scale = float(coord_scale)
        self.heatmap_lambda, self.heatmap_sigma = float(heatmap_lambda), float(heatmap_sigma)
        self.register_buffer("neighbours", nb, persistent=False)

    @property
    def needs_maps(self) -> bool:
        return self.heatmap_lambda > 0

    def forward(self, pred: torch.Tensor, target: torch.Tensor, probs: torch.Tensor | None = None,
                input_hw: tuple[int, int] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        p, t = pred * self.coord_scale, target * self.coord_scale  # (B, K, 2)
        main = keypoint_loss(p, t, self.kind)
        total = main
        struct = heat = main.new_zeros(())
        if self.structure_lambda > 0 and self.neighbours.numel():
            if self.neighbours.shape[0] != pred.shape[1]:
                raise ValueError(f"neighbours are for {self.neighbours.shape[0]} keypoints, "
                                 f"predictions have {pred.shape[1]}")
            struct = structure_loss(p, t, self.neighbours, self.kind)
            total = total + self.structure_lambda * struct
        if self.heatmap_lambda > 0:
            if probs is None or input_hw is None:
                raise ValueError("heatmap_lambda > 0 needs the soft-argmax maps (a heatmap model)")
            maps, inside = gaussian_maps(target.float(), (probs.shape[-2], probs.shape[-1]), (input_hw[0], input_hw[1]),
                                         self.heatmap_sigma)
            js = js_divergence(probs.float(), maps)  # (B, K)
            heat = (js * inside).sum() / inside.sum().clamp_min(1)
            total = total + self.heatmap_lambda * heat
        return total, {"main": main.detach(), "structure": struct.detach(), "heatmap": heat.detach()}

    def extra_repr(self) -> str:
        return (f"kind={self.kind!r}, structure_lambda={self.structure_lambda}, "
                f"neighbours={tuple(self.neighbours.shape)}, coord_scale={self.coord_scale}, "
                f"heatmap_lambda={self.heatmap_lambda}, heatmap_sigma={self.heatmap_sigma}")


def build_loss(kind: str = "l1", structure_lambda: float = 0.2,
               neighbours: torch.Tensor | np.ndarray | None = None, *, coord_scale: float = 1.0,
               heatmap_lambda: float = 0.0, heatmap_sigma: float = 1.0) -> KeypointLoss:
    """The training loss; `neighbours` (K, n) int from `schema.neighbours(mean_shape)`."""
    return KeypointLoss(kind, structure_lambda, neighbours, coord_scale=coord_scale,
                        heatmap_lambda=heatmap_lambda, heatmap_sigma=heatmap_sigma)


def loss_from_params(tcfg: TrainParams, input_size: int, neighbours, heatmap_model: bool = True) -> KeypointLoss:
    """The loss of a `train` params section for a model of `input_size` pixels. The heatmap
    regulariser shapes soft-argmax maps: a regression model (`heatmap_model` False) has
    none, so it trains without it."""
    return build_loss(tcfg.loss, tcfg.structure_lambda, neighbours,
                      coord_scale=2.0 / input_size if tcfg.normalize_coords else 1.0,
                      heatmap_lambda=tcfg.heatmap_lambda if heatmap_model else 0.0,
                      heatmap_sigma=tcfg.heatmap_sigma)
