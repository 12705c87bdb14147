"""Horizontal flips on torch batches, for flip TTA. Same convention as
`KeypointSchema.flip_coords`: pixel centres at integers, so x -> W - 1 - x, then the
left/right indices swap by the schema's flip permutation."""

from __future__ import annotations

from typing import Sequence

import torch


def flip_images(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> the mirrored batch (columns reversed)."""
    return x.flip(-1)


def unflip_coords(coords: torch.Tensor, width: float, flip_perm: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """A prediction on the mirrored image (B, K, 2) -> coordinates in the original image.

    Point i of the mirrored image is the mirror of the original's point flip_perm[i], so
    the original's point i is the mirror of the prediction's point flip_perm[i] (the
    permutation is an involution). Also maps original -> mirrored: applying it twice is
    the identity."""
    perm = torch.as_tensor(flip_perm, dtype=torch.long, device=coords.device)
    x = (width - 1) - coords[..., 0]  # (B, K)
    out = torch.stack([x, coords[..., 1]], dim=-1)  # (B, K, 2)
    return out.index_select(-2, perm)
