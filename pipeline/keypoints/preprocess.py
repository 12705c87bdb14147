"""The network's input contract, one implementation for training, prediction, export and
the viewers: uint8 faces (N, S, S, 3) -> (N, C, S, S) uint8 -> normalised float ->
resized to the model's input side. Coordinates between crop and input pixels are in
pipeline/keypoints/geometry.py (crop_to_input / input_to_crop)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# ImageNet statistics, applied on the device to the whole batch at once.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def normalize_batch(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 (B, C, H, W) on any device -> normalised float32 (B, C, H, W)."""
    c = images.shape[1]
    mean = torch.tensor(MEAN[:c] if c == 3 else (sum(MEAN) / 3,), device=images.device).view(1, c, 1, 1)
    std = torch.tensor(STD[:c] if c == 3 else (sum(STD) / 3,), device=images.device).view(1, c, 1, 1)
    x = images.float().div_(255.0).sub_(mean).div_(std)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def faces_to_chw(faces: np.ndarray, in_chans: int) -> torch.Tensor:
    """(N, H, W, 3) uint8 numpy -> (N, C, H, W) uint8 torch; grayscale by the BT.601 luma."""
    t = torch.from_numpy(np.array(faces, copy=True)).permute(0, 3, 1, 2)  # copy: the cache is a read-only mmap
    if in_chans == 1:
        w = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
        t = (t.float() * w).sum(1, keepdim=True).round().clamp_(0, 255).to(torch.uint8)
    return t.contiguous()


_RESIZE: dict[tuple, torch.Tensor] = {}


def _resize_rows(src: int, dst: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(dst, src) matrix R of the 1-D antialiased bilinear resize src -> dst: the filter is
    separable, so resizing an image X is R @ X @ R.T. Built once per size from
    F.interpolate itself (each row of the identity resized), so it is that filter."""
    key = (src, dst, device, dtype)
    if key not in _RESIZE:
        # src one-row images, each an impulse; resized along W (a height-1 image resized
        # along H comes out wrong in torch 2.14's antialias kernel, along W it is exact)
        eye = torch.eye(src, dtype=torch.float64).view(src, 1, 1, src)
        rows = F.interpolate(eye, size=(1, dst), mode="bilinear", align_corners=False, antialias=True)
        _RESIZE[key] = rows.view(src, dst).T.contiguous().to(device=device, dtype=dtype)
    return _RESIZE[key]


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """Float (B, C, S, S) -> (B, C, size, size). Bilinear with align_corners=False maps
    pixel centres as x' = (x + 0.5) * size / S - 0.5, the convention of input_to_crop;
    antialiased as F.interpolate(antialias=True), as two small matmuls (R @ X @ R.T):
    at batch 1 that is a third of the cost of the interpolate kernel."""
    if images.shape[-1] == size:
        return images
    r = _resize_rows(images.shape[-1], size, images.device, images.dtype)  # (size, S)
    return torch.matmul(torch.matmul(r, images), r.T)  # (B, C, size, S) -> (B, C, size, size)
