"""Direct-regression baselines (a fully connected layer outputs 2K numbers), kept to
compare against the heatmap ResUNet: the reference recipe's small VGG and the ResNet-50 + FC ablation."""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
from torch import nn
from torchvision.models import resnet50

from pipeline.core.errors import PipelineError
from pipeline.models.layers import ConvNormAct, get_act_layer
from pipeline.models.registry import build_preset, register_model


def _halve(n: int, times: int) -> int:
    """Side after `times` stride-2 layers with 'same' padding (3x3 p1, 7x7 p3, MaxPool 3 p1)."""
    for _ in range(times):
        n = (n + 1) // 2
    return n


class RegressionHead(nn.Module):
    """features (B, F) -> linear -> (B, K, 2) input-pixel coordinates.

    The layer predicts offsets from the image centre in units of the image size, so a
    freshly initialised net (small weights, zero bias) starts at the centre instead of
    hundreds of pixels away; the scale to pixels is fixed, not learned."""

    def __init__(self, in_features: int, num_keypoints: int):
        super().__init__()
        self.num_keypoints = num_keypoints
        self.fc = nn.Linear(in_features, 2 * num_keypoints)
        # outputs of ~1% of the image size for unit-scale features, whatever the width
        nn.init.normal_(self.fc.weight, std=0.01 / in_features ** 0.5)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
        h, w = input_hw
        off = self.fc(x).float().view(x.shape[0], self.num_keypoints, 2)  # (B, K, 2) in image sizes
        size = off.new_tensor([w, h])
        centre = (size - 1) / 2  # pixel centres at integers: the middle is (W - 1) / 2
        return centre + off * size  # (B, K, 2) input px


class VGGSeed(nn.Module):
    """The reference recipe's VGG11-shaped regressor: 8 convs (1-1-2-2-2 per stage, channels 8-16-32-64-128),
    BatchNorm + ReLU, the first conv of each stage strided instead of max-pooling
    (224 -> 7), then flatten (128 x 7 x 7 = 6272) -> fc 1024 (BatchNorm1d, ReLU) -> 2K."""

    def __init__(self, num_keypoints: int, in_chans: int = 3, input_size: int = 224, *,
                 widths: Sequence[int] = (8, 16, 32, 64, 128), convs: Sequence[int] = (1, 1, 2, 2, 2),
                 fc_width: int = 1024, act: str = "relu"):
        super().__init__()
        if len(widths) != len(convs) or not widths:
            raise PipelineError(None, f"widths {list(widths)} and convs {list(convs)} must have the same length")
        act_layer = get_act_layer(act)
        stages, c = [], in_chans
        for w, n in zip(widths, convs):
            # the stride-2 first conv replaces VGG's MaxPool: learned, and no extra layer
            layers = [ConvNormAct(c if i == 0 else w, w, 3, 2 if i == 0 else 1, act_layer=act_layer)
                      for i in range(n)]
            stages.append(nn.Sequential(*layers))
            c = w
        self.features = nn.Sequential(*stages)
        side = _halve(input_size, len(widths))
        self.num_features = c * side * side  # 6272 at 224
        self.fc = nn.Sequential(nn.Linear(self.num_features, fc_width, bias=False), nn.BatchNorm1d(fc_width),
                                act_layer(inplace=True))
        self.head = RegressionHead(fc_width, num_keypoints)
        for m in self.features.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).flatten(1)  # (B, 128 * H/32 * W/32)

    def forward_head(self, x: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
        return self.head(self.fc(x), input_hw)  # (B, K, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x), (x.shape[-2], x.shape[-1]))


class ResNet50FC(nn.Module):
    """torchvision ResNet-50 body without the global AvgPool: the 2048 x 7 x 7 map (at 224)
    is flattened into one linear layer -> 2K, so the regressor keeps where features are
    (the reference recipe's first ablation). The linear layer's width follows the input size."""

    def __init__(self, num_keypoints: int, in_chans: int = 3, input_size: int = 224):
        super().__init__()

        tv = resnet50(weights=None)
        if in_chans != 3:
            tv.conv1 = nn.Conv2d(in_chans, 64, 7, 2, 3, bias=False)
            nn.init.kaiming_normal_(tv.conv1.weight, mode="fan_out", nonlinearity="relu")
        names = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")
        self.body = nn.Sequential(OrderedDict((n, getattr(tv, n)) for n in names))
        side = _halve(input_size, 5)  # conv1, maxpool, layer2-4 halve
        self.num_features = 2048 * side * side  # 100352 at 224
        self.head = RegressionHead(self.num_features, num_keypoints)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).flatten(1)  # (B, 2048 * H/32 * W/32)

    def forward_head(self, x: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
        return self.head(x, input_hw)  # (B, K, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x), (x.shape[-2], x.shape[-1]))


@register_model(input_size=224)
def vgg_seed(**kwargs) -> VGGSeed:
    """The reference recipe's modified VGG11 (8 strided convs, fc 1024), direct regression"""
    return build_preset(VGGSeed, {}, kwargs)


@register_model(input_size=224)
def resnet50_fc(**kwargs) -> ResNet50FC:
    """torchvision ResNet-50 without AvgPool, flattened 2048x7x7 -> linear, direct regression"""
    return build_preset(ResNet50FC, {}, kwargs)
