"""Horizontal flips, the one implementation. Pixel centres sit at integer coordinates, so a
mirror maps x -> W - 1 - x; then the left/right points swap by the schema's flip permutation
(point i of the mirrored face is the mirror of the original's point flip_perm[i]: left eye
corner 36 <-> right eye corner 45, jaw 0 <-> 16, ...). The permutation is an involution, so
the same map also takes a prediction on the mirrored image back to the original.

Works on numpy arrays and torch tensors alike (no torch import: numpy-only callers such as
the synthetic data set stay light)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def mirror_x(x, width: float):
    """x -> width - 1 - x (pixel centres at integers)."""
    return (width - 1) - x


def flip_matrix(width: int) -> np.ndarray:
    """The (3, 3) affine of `mirror_x` on homogeneous pixel coordinates."""
    return np.array([[-1.0, 0.0, width - 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def flip_coords(coords, width: float, flip_perm: Sequence[int]):
    """(..., K, 2) coordinates (numpy or torch) -> those of the horizontally mirrored image,
    points renumbered by `flip_perm`. Its own inverse."""
    if hasattr(coords, "clone"):  # a torch tensor (autograd-safe copy)
        out = coords.clone()
    else:  # float64 stays float64, anything else becomes float32
        out = np.array(coords, dtype=np.float64 if np.asarray(coords).dtype == np.float64 else np.float32)
    out[..., 0] = mirror_x(out[..., 0], width)
    return out[..., list(flip_perm), :]


def flip_images(x):
    """(B, C, H, W) torch batch -> the mirrored batch (columns reversed)."""
    return x.flip(-1)
