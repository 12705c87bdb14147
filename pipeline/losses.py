"""Coordinate losses: the point loss, plus a structure loss on the offsets between
neighbouring keypoints (a face's parts move together, so a prediction that gets each
point roughly right but the local shape wrong is penalised twice)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pipeline.errors import PipelineError

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


class KeypointLoss(nn.Module):
    """forward(pred, target) -> (total, {"main": ..., "structure": ...}), parts detached.

    total = point loss + structure_lambda * structure loss."""

    def __init__(self, kind: str = "l1", structure_lambda: float = 0.2,
                 neighbours: torch.Tensor | np.ndarray | None = None):
        super().__init__()
        _check_kind(kind)
        if isinstance(structure_lambda, bool) or not isinstance(structure_lambda, (int, float)) \
                or structure_lambda < 0:
            raise PipelineError(None, f"train.structure_lambda must be a number >= 0, got {structure_lambda!r}")
        nb = torch.zeros(0, 0, dtype=torch.long) if neighbours is None else torch.as_tensor(neighbours).long()
        if nb.numel() and nb.dim() != 2:
            raise PipelineError(None, f"structure-loss neighbours must be (K, n), got shape {tuple(nb.shape)}")
        self.kind, self.structure_lambda = kind, float(structure_lambda)
        self.register_buffer("neighbours", nb, persistent=False)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        main = keypoint_loss(pred, target, self.kind)
        if self.structure_lambda > 0 and self.neighbours.numel():
            if self.neighbours.shape[0] != pred.shape[1]:
                raise ValueError(f"neighbours are for {self.neighbours.shape[0]} keypoints, "
                                 f"predictions have {pred.shape[1]}")
            struct = structure_loss(pred, target, self.neighbours, self.kind)
            total = main + self.structure_lambda * struct
        else:
            struct, total = main.new_zeros(()), main
        return total, {"main": main.detach(), "structure": struct.detach()}

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, structure_lambda={self.structure_lambda}, neighbours={tuple(self.neighbours.shape)}"


def build_loss(kind: str = "l1", structure_lambda: float = 0.2,
               neighbours: torch.Tensor | np.ndarray | None = None) -> KeypointLoss:
    """The training loss; `neighbours` (K, n) int from `schema.neighbours(mean_shape)`."""
    return KeypointLoss(kind, structure_lambda, neighbours)
