"""Soft-argmax: a heatmap per keypoint -> its expected (x, y).

Differentiable (unlike argmax) and sub-pixel, so the heatmap models train on the same
coordinate losses as the direct-regression baselines."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.autograd.function import once_differentiable

_AUTOCAST_DEVICES = {"cpu", "cuda", "xpu", "mps"}


def _no_autocast(device: torch.device):
    # the softmax over H*W pixels overflows / loses the tails in fp16 and bf16;
    # the meta device (FLOP counting) has no autocast to turn off
    if device.type in _AUTOCAST_DEVICES:
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def soft_argmax(logits: torch.Tensor, input_hw: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, K, h, w) -> (coords (B, K, 2) x then y, probs (B, K, h, w)), float32.

    Softmax over all h*w pixels of each map; coordinates are the expected pixel position
    under it, with pixel centres at integers: a one-hot map at column c, row r gives
    exactly (c, r). When the map is smaller than the input (`input_hw`), the map grid is
    scaled to input pixels so that map pixel centres land on the centres of the input
    pixels they cover: x_in = (x_map + 0.5) * W / w - 0.5."""
    b, k, h, w = logits.shape
    with _no_autocast(logits.device):
        probs = logits.float().reshape(b, k, h * w).softmax(-1).reshape(b, k, h, w)  # (B, K, h, w)
        xs = torch.arange(w, device=logits.device, dtype=torch.float32)  # (w,)
        ys = torch.arange(h, device=logits.device, dtype=torch.float32)  # (h,)
        x = (probs.sum(2) * xs).sum(-1)  # column marginal (B, K, w) -> (B, K)
        y = (probs.sum(3) * ys).sum(-1)  # row marginal (B, K, h) -> (B, K)
        if input_hw is not None and tuple(input_hw) != (h, w):
            x = (x + 0.5) * (input_hw[1] / w) - 0.5
            y = (y + 0.5) * (input_hw[0] / h) - 0.5
        coords = torch.stack([x, y], dim=-1)  # (B, K, 2)
    return coords, probs


class _PointwiseToMaps(torch.autograd.Function):
    """A bias-free 1x1 conv from channels_last features to maps that are contiguous per
    map, as batched GEMMs in both directions.

    The softmax runs over each map's pixels, so it wants the maps (B, K, h*w) contiguous;
    a channels_last network makes them (B, h, w, K). As a convolution, the maps (68 of them,
    more channels than the features) are transposed on the way into the softmax and their
    gradient back on the way out: on a 2-core CPU those two copies of a (32, 68, 64, 64)
    tensor cost more than the 1x1 conv itself. A GEMM reads the features transposed for
    free, and its backward writes the features' gradient channels_last again."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape  # x channels_last: (B, h, w, C) in memory
        pixels = x.permute(0, 2, 3, 1).reshape(b, h * w, c)  # (B, h*w, C), a view
        ctx.save_for_backward(pixels, weight)
        ctx.hw = (h, w)
        return torch.bmm(weight.expand(b, -1, -1), pixels.transpose(1, 2))  # (B, K, h*w)

    @staticmethod
    @once_differentiable  # saves a view of x: a second derivative would be wrong, so refuse it
    def backward(ctx, grad: torch.Tensor):  # grad (B, K, h*w)
        pixels, weight = ctx.saved_tensors
        (h, w), (b, _, c) = ctx.hw, pixels.shape
        grad_x = grad_weight = None
        with _no_autocast(grad.device):  # fp32 like the forward, even if backward runs under autocast
            if ctx.needs_input_grad[0]:
                grad_x = torch.bmm(grad.transpose(1, 2), weight.expand(b, -1, -1))  # (B, h*w, C)
                grad_x = grad_x.reshape(b, h, w, c).permute(0, 3, 1, 2)  # (B, C, h, w) channels_last, as x
            if ctx.needs_input_grad[1]:
                grad_weight = torch.bmm(grad, pixels).sum(0)  # (K, C)
        return grad_x, grad_weight


class SoftArgmaxHead(nn.Module):
    """features (B, C, h, w) -> 1x1 conv, one map per keypoint -> soft-argmax."""

    def __init__(self, in_chs: int, num_keypoints: int):
        super().__init__()
        # no bias: a constant added to a whole map cancels in the softmax
        self.conv = nn.Conv2d(in_chs, num_keypoints, 1, bias=False)

    def forward(self, x: torch.Tensor, input_hw: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        # fp32 under autocast too: bf16 logits (8 mantissa bits) would quantise the softmax
        # weights by a few % and put noise of a fraction of a pixel on the coordinates
        with _no_autocast(x.device):
            x = x.float()
            b, c, h, w = x.shape
            if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
                weight = self.conv.weight.reshape(-1, c)  # (K, C)
                logits = _PointwiseToMaps.apply(x, weight).reshape(b, -1, h, w)  # (B, K, h, w)
            else:  # NCHW (an ONNX export, a plain forward): the conv is already map-contiguous
                logits = self.conv(x)  # (B, K, h, w)
        return soft_argmax(logits, input_hw)
