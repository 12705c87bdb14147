"""Building blocks shared by the ResUNet and the baselines (timm-style: layer types are
passed in as `act_layer` / `norm_layer`, so one block serves every preset)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import PipelineError

LayerType = Callable[..., nn.Module]

_ACT_LAYERS: dict[str, LayerType] = {"relu": nn.ReLU, "hardswish": nn.Hardswish}


def get_act_layer(name: str | LayerType) -> LayerType:
    """'relu' | 'hardswish' -> the nn.Module class (a class passes through)."""
    if not isinstance(name, str):
        return name
    try:
        return _ACT_LAYERS[name]
    except KeyError:
        raise PipelineError(None, f"unknown activation '{name}' (known: {', '.join(_ACT_LAYERS)})") from None


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round a scaled channel count to a multiple of `divisor` (never more than 10% down),
    so width-multiplied models keep SIMD-friendly channel counts."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvNormAct(nn.Module):
    """conv (no bias: the norm has one) -> norm -> act. `apply_act=False` for the last
    conv of a residual branch, whose activation comes after the addition."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 3, stride: int = 1, *,
                 apply_act: bool = True, act_layer: LayerType = nn.ReLU,
                 norm_layer: LayerType = nn.BatchNorm2d):
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride, padding=kernel_size // 2, bias=False)
        self.bn = norm_layer(out_chs)
        self.act = act_layer(inplace=True) if apply_act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class BlurPool2d(nn.Module):
    """Anti-aliased stride-2 downsampling (Zhang 2019, "Making Convolutional Networks
    Shift-Invariant Again"): low-pass with the fixed binomial [1, 2, 1] x [1, 2, 1] / 16
    filter, depthwise, then subsample. Reflect padding keeps the border from darkening.

    The filter is built from two 2x2 average pools, a stride-1 one and then one with the
    stride: in 1-D, averaging neighbours twice gives (x[i] + 2 x[i+1] + x[i+2]) / 4, the
    binomial filter, and the second pool's stride subsamples it. The same filter as a
    depthwise 3x3 conv (equal up to rounding), at a fraction of its cost on the CPU: in bf16
    oneDNN's depthwise conv backward took about a tenth of a training step. Nothing is
    learned; the module holds no weights."""

    def __init__(self, channels: int, stride: int = 2):
        super().__init__()
        self.channels, self.stride = channels, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
            x = reflect_pad1(x)
        else:
            x = F.pad(x, (1, 1, 1, 1), mode="reflect")
        return F.avg_pool2d(F.avg_pool2d(x, 2, stride=1), 2, stride=self.stride)  # (B, C, H/2, W/2)

    def extra_repr(self) -> str:
        return f"{self.channels}, stride={self.stride}"


def reflect_pad1(x: torch.Tensor) -> torch.Tensor:
    """F.pad(x, (1, 1, 1, 1), mode="reflect") of (B, C, H, W) x, H and W >= 2, built from
    slices and cat, which keep channels_last. CUDA's reflection pad makes its input NCHW
    (a layout copy there and back in a channels_last network) and its backward adds with
    atomics (gradients not reproducible); this has neither."""
    x = torch.cat([x[:, :, 1:2], x, x[:, :, -2:-1]], dim=2)
    return torch.cat([x[:, :, :, 1:2], x, x[:, :, :, -2:-1]], dim=3)


def create_downsample(in_chs: int, out_chs: int, stride: int, *, blurpool: bool = True,
                      norm_layer: LayerType = nn.BatchNorm2d) -> nn.Module | None:
    """The projection shortcut of a residual block, ResNet-D style: pool first, then a
    stride-1 1x1 conv, so the shortcut sees every input pixel instead of one in four
    (a strided 1x1 conv throws 3/4 of the activations away). The pool is BlurPool
    (anti-aliased) or, with blurpool off, the paper's 2x2 AvgPool. None when the shapes
    already match (identity shortcut)."""
    if stride == 1 and in_chs == out_chs:
        return None
    pool: nn.Module = nn.Identity()
    if stride != 1:
        pool = BlurPool2d(in_chs, stride) if blurpool else nn.AvgPool2d(2, stride, ceil_mode=True,
                                                                        count_include_pad=False)
    return nn.Sequential(pool, nn.Conv2d(in_chs, out_chs, 1, bias=False), norm_layer(out_chs))
