"""ResUNet: a ResNet encoder with the "Bag of Tricks" tweaks (He et al. 2019), a U-Net
decoder back to input resolution, and a soft-argmax head (one heatmap per keypoint).

    input (B, C, H, W)
      stem  conv3x3 s2 -> conv3x3 ------------------------------ skip /2  --+
            conv3x3 s2 (replaces the MaxPool)                               |
      stage1 (/4) ------------------------------------------ skip /4  --+   |
      stage2 (/8) ---------------------------------- skip /8  --+       |   |
      stage3 (/16) ------------------------- skip /16 --+       |       |   |
      stage4 (/32)                                      |       |       |   |
      up x2 + cat + block (/16) <-----------------------+       |       |   |
      up x2 + cat + block (/8)  <-------------------------------+       |   |
      up x2 + cat + block (/4)  <---------------------------------------+   |
      up x2 + cat + block (/2)  <-------------------------------------------+
      up x2 + cat(input) + block (/1)
      conv1x1 -> K maps -> softmax over H*W -> expected (x, y)

`decoder_levels` < 5 stops the decoder early (coarser maps, far cheaper on a CPU);
`map_upsample` then resizes the last decoder features bilinearly before the 1x1 head, so the
soft-argmax works on a finer grid without the convolutions of the levels left out.

ResUNet-72 (`resunet72`) is the ResNet-50 body: 3 stem convs + 16 bottlenecks x 3 convs
+ 5 decoder levels x (up-conv + 3 bottleneck convs) + the 1x1 head = 3 + 48 + 20 + 1 = 72
layers on the main path (1x1 projection shortcuts not counted, as in "ResNet-50")."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import PipelineError
from pipeline.models.head import SoftArgmaxHead
from pipeline.models.layers import ConvNormAct, LayerType, create_downsample, get_act_layer, make_divisible
from pipeline.models.registry import build_preset, register_model

# ResNet-50 stage widths (bottleneck planes; outputs are 4x) and the ResNet-C stem
STAGE_PLANES = (64, 128, 256, 512)
STEM_WIDTHS = (32, 32, 64)
# decoder output widths from /16 up to /1, tuned so ResUNet-72 has ~31M parameters
DECODER_WIDTHS = (576, 320, 128, 64, 32)


class BasicBlock(nn.Module):
    """ResNet-18/34 block: 3x3 -> 3x3, plus the shortcut."""

    expansion = 1

    def __init__(self, in_chs: int, mid_chs: int, out_chs: int, stride: int = 1, *,
                 downsample: nn.Module | None = None, act_layer: LayerType = nn.ReLU,
                 norm_layer: LayerType = nn.BatchNorm2d, zero_init_last: bool = True):
        super().__init__()
        self.conv1 = ConvNormAct(in_chs, mid_chs, 3, stride, act_layer=act_layer, norm_layer=norm_layer)
        self.conv2 = ConvNormAct(mid_chs, out_chs, 3, apply_act=False, norm_layer=norm_layer)
        self.downsample = downsample
        self.act = act_layer(inplace=True)
        if zero_init_last:
            # Bag of Tricks "zero gamma": every block starts as the identity, so a deep
            # net trains like a shallow one at first
            nn.init.zeros_(self.conv2.bn.weight)  # type: ignore[arg-type]  # a norm layer's weight: a Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.conv2(self.conv1(x))
        return self.act(x + shortcut)


class Bottleneck(nn.Module):
    """ResNet-50 block: 1x1 reduce -> 3x3 -> 1x1 expand, plus the shortcut. ResNet-B:
    the stride sits on the 3x3 (a strided 1x1 would skip 3/4 of the input)."""

    expansion = 4

    def __init__(self, in_chs: int, mid_chs: int, out_chs: int, stride: int = 1, *,
                 downsample: nn.Module | None = None, act_layer: LayerType = nn.ReLU,
                 norm_layer: LayerType = nn.BatchNorm2d, zero_init_last: bool = True):
        super().__init__()
        self.conv1 = ConvNormAct(in_chs, mid_chs, 1, act_layer=act_layer, norm_layer=norm_layer)
        self.conv2 = ConvNormAct(mid_chs, mid_chs, 3, stride, act_layer=act_layer, norm_layer=norm_layer)
        self.conv3 = ConvNormAct(mid_chs, out_chs, 1, apply_act=False, norm_layer=norm_layer)
        self.downsample = downsample
        self.act = act_layer(inplace=True)
        if zero_init_last:
            nn.init.zeros_(self.conv3.bn.weight)  # type: ignore[arg-type]  # a norm layer's weight: a Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.conv3(self.conv2(self.conv1(x)))
        return self.act(x + shortcut)


BlockType = type[BasicBlock] | type[Bottleneck]
BLOCKS: dict[str, BlockType] = {"basic": BasicBlock, "bottleneck": Bottleneck}


def get_block(name: str) -> BlockType:
    try:
        return BLOCKS[name]
    except (KeyError, TypeError):
        raise PipelineError(None, f"unknown block '{name}' (known: {', '.join(BLOCKS)})") from None


def make_stages(block_fn: BlockType, depths: Sequence[int], planes: Sequence[int], in_chs: int, *,
                strides: Sequence[int] = (1, 2, 2, 2), blurpool: bool = True,
                act_layer: LayerType = nn.ReLU, norm_layer: LayerType = nn.BatchNorm2d,
                zero_init_last: bool = True) -> tuple[nn.Sequential, list[int]]:
    """The residual stages: (nn.Sequential of stages, output channels of each stage).
    The first block of a stage downsamples and changes width, with a ResNet-D shortcut."""
    stages, channels = [], []
    for depth, width, stride in zip(depths, planes, strides):
        out_chs = width * block_fn.expansion
        blocks = []
        for i in range(depth):
            s = stride if i == 0 else 1
            down = create_downsample(in_chs, out_chs, s, blurpool=blurpool, norm_layer=norm_layer)
            blocks.append(block_fn(in_chs, width, out_chs, s, downsample=down, act_layer=act_layer,
                                   norm_layer=norm_layer, zero_init_last=zero_init_last))
            in_chs = out_chs
        stages.append(nn.Sequential(*blocks))
        channels.append(out_chs)
    return nn.Sequential(*stages), channels


class DeepStem(nn.Module):
    """ResNet-C stem: three 3x3 convs instead of one 7x7 (same receptive field, cheaper,
    more non-linearity). Bag of Tricks follows it with a stride-2 MaxPool; here the third
    conv carries that stride instead (strides 2, 1, 2), which keeps the stem at 3 layers
    and the whole net at the 72 layers it is named for, and makes the downsampling learned. The output of
    conv2 (/2) is the decoder's skip at half resolution."""

    def __init__(self, in_chans: int, widths: Sequence[int], *, act_layer: LayerType = nn.ReLU,
                 norm_layer: LayerType = nn.BatchNorm2d):
        super().__init__()
        w1, w2, w3 = widths
        self.conv1 = ConvNormAct(in_chans, w1, 3, 2, act_layer=act_layer, norm_layer=norm_layer)
        self.conv2 = ConvNormAct(w1, w2, 3, 1, act_layer=act_layer, norm_layer=norm_layer)
        self.conv3 = ConvNormAct(w2, w3, 3, 2, act_layer=act_layer, norm_layer=norm_layer)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.conv2(self.conv1(x))  # (B, w2, H/2, W/2)
        return self.conv3(half), half  # (B, w3, H/4, W/4), the /2 skip


class UpConv(nn.Module):
    """x2 upsampling with one learned layer: a 2x2 stride-2 transposed conv ('deconv'),
    or bilinear upsampling followed by a 3x3 conv ('bilinear', no checkerboard)."""

    def __init__(self, in_chs: int, out_chs: int, mode: str = "deconv", *, act_layer: LayerType = nn.ReLU,
                 norm_layer: LayerType = nn.BatchNorm2d):
        super().__init__()
        if mode == "deconv":
            self.up: nn.Module = nn.Identity()
            self.conv: nn.Module = nn.ConvTranspose2d(in_chs, out_chs, 2, 2, bias=False)
        elif mode == "bilinear":
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
            self.conv = nn.Conv2d(in_chs, out_chs, 3, padding=1, bias=False)
        else:
            raise PipelineError(None, f"unknown upsample '{mode}' (known: deconv, bilinear)")
        self.bn = norm_layer(out_chs)
        self.act = act_layer(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(self.up(x))))


class DecoderBlock(nn.Module):
    """One U-Net level: up x2, concatenate the encoder feature of that resolution, then a
    residual block (its 1x1 projection shortcut matches the concatenated width)."""

    def __init__(self, in_chs: int, skip_chs: int, out_chs: int, block_fn: BlockType, *,
                 upsample: str = "deconv", act_layer: LayerType = nn.ReLU,
                 norm_layer: LayerType = nn.BatchNorm2d, zero_init_last: bool = True):
        super().__init__()
        self.up = UpConv(in_chs, out_chs, upsample, act_layer=act_layer, norm_layer=norm_layer)
        cat_chs = out_chs + skip_chs
        mid_chs = max(1, out_chs // block_fn.expansion)
        self.block = block_fn(cat_chs, mid_chs, out_chs, 1,
                              downsample=create_downsample(cat_chs, out_chs, 1, norm_layer=norm_layer),
                              act_layer=act_layer, norm_layer=norm_layer, zero_init_last=zero_init_last)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None) -> torch.Tensor:
        x = self.up(x)  # (B, out, 2h, 2w)
        if skip is not None:
            x = torch.cat([x, skip], dim=1)  # (B, out + skip, 2h, 2w)
        return self.block(x)  # (B, out, 2h, 2w)


def _ints(name: str, v, n: int) -> tuple[int, ...]:
    if isinstance(v, str) or not isinstance(v, Sequence) or len(v) != n or \
            not all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in v):
        raise PipelineError(None, f"{name} must be {n} positive integers, got {v!r}")
    return tuple(v)


class ResUNet(nn.Module):
    """ResNet-D encoder + U-Net decoder + soft-argmax head. See the module docstring."""

    def __init__(self, num_keypoints: int, in_chans: int = 3, input_size: int = 224, *,
                 block: str = "bottleneck", depths: Sequence[int] = (3, 4, 6, 3), width: float = 1.0,
                 stem_widths: Sequence[int] = STEM_WIDTHS, decoder_widths: Sequence[int] | None = None,
                 decoder_block: str | None = None, upsample: str = "deconv", blurpool: bool = True,
                 act: str = "relu", input_skip: bool = True, zero_init_last: bool = True,
                 decoder_levels: int = 5, map_upsample: int = 1):
        super().__init__()
        if input_size % 32:
            raise PipelineError(None, f"input_size must be a multiple of 32 (5 halvings), got {input_size}")
        if isinstance(width, bool) or not isinstance(width, (int, float)) or width <= 0:
            raise PipelineError(None, f"width must be a positive number, got {width!r}")
        depths = _ints("depths", depths, 4)
        stem_widths = [make_divisible(w * width) for w in _ints("stem_widths", stem_widths, 3)]
        planes = [make_divisible(p * width) for p in STAGE_PLANES]
        if decoder_widths is None:  # unset: the ResUNet-72 decoder at this width
            decoder_widths = [make_divisible(w * width) for w in DECODER_WIDTHS]
        decoder_widths = _ints("decoder_widths", decoder_widths, 5)
        if isinstance(decoder_levels, bool) or decoder_levels not in (1, 2, 3, 4, 5):
            raise PipelineError(None, f"decoder_levels must be 1..5, got {decoder_levels!r}")
        # fewer levels stop the decoder at 1/2^(5-levels) of the input: the soft-argmax then
        # runs on a coarser, wider map (sub-pixel positions come from the expectation), which
        # is far cheaper on CPUs than 68 full-resolution maps
        self.decoder_levels = decoder_levels
        if type(map_upsample) is not int or map_upsample not in (1, 2, 4):
            raise PipelineError(None, f"map_upsample must be 1, 2 or 4, got {map_upsample!r}")
        if 2 ** decoder_levels * map_upsample > 32:
            raise PipelineError(None, f"map_upsample {map_upsample} with decoder_levels {decoder_levels} would make "
                                      "maps larger than the input (decoder_levels + log2(map_upsample) must be <= 5)")
        # bilinear x2 (x4) of the last decoder features before the 1x1 head: the soft-argmax
        # and its regulariser then work on a finer grid without a decoder level's convs there
        # (bilinear and the 1x1 head commute, so this is the upsampled maps' logits)
        self.map_upsample = map_upsample
        block_fn = get_block(block)
        dec_block_fn = get_block(decoder_block or block)
        act_layer, norm_layer = get_act_layer(act), nn.BatchNorm2d
        self.num_keypoints, self.in_chans, self.input_size = num_keypoints, in_chans, input_size
        self.input_skip = bool(input_skip)

        self.stem = DeepStem(in_chans, stem_widths, act_layer=act_layer, norm_layer=norm_layer)
        self.stages, stage_chs = make_stages(block_fn, depths, planes, stem_widths[2], blurpool=blurpool,
                                             act_layer=act_layer, norm_layer=norm_layer,
                                             zero_init_last=zero_init_last)
        # skips for the decoder levels /16, /8, /4, /2, /1
        skip_chs = [stage_chs[2], stage_chs[1], stage_chs[0], stem_widths[1], in_chans if input_skip else 0]
        levels, in_chs = [], stage_chs[3]
        for out_chs, s in list(zip(decoder_widths, skip_chs))[:decoder_levels]:
            levels.append(DecoderBlock(in_chs, s, out_chs, dec_block_fn, upsample=upsample, act_layer=act_layer,
                                       norm_layer=norm_layer, zero_init_last=zero_init_last))
            in_chs = out_chs
        self.decoder = nn.ModuleList(levels)
        self.head = SoftArgmaxHead(in_chs, num_keypoints)
        self._init_weights()

    def _init_weights(self) -> None:
        # He init for every conv (fan_out, as torchvision / timm). BatchNorm keeps PyTorch's
        # weight 1 / bias 0, and the blocks' zero-gamma last norms stay zero.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Encoder pyramid [input, /2, /4, /8, /16, /32] (the first five are the skips)."""
        h, w = x.shape[-2:]
        if h % 32 or w % 32:
            raise ValueError(f"ResUNet input height and width must be multiples of 32, got {h}x{w}")
        feats = [x]  # (B, C, H, W)
        x, half = self.stem(x)  # (B, 64w, H/4, W/4), (B, 32w, H/2, W/2)
        feats.append(half)
        for stage in self.stages:
            x = stage(x)  # /4, /8, /16, /32; (B, 2048w, H/32, W/32) for a bottleneck body at the end
            feats.append(x)
        return feats

    def forward_decoder(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """Encoder pyramid -> decoder features at input resolution (B, D, H, W)."""
        x = feats[5]  # (B, C4, H/32, W/32)
        skips = [feats[4], feats[3], feats[2], feats[1], feats[0] if self.input_skip else None]  # /16 ... /1
        for level, skip in zip(self.decoder, skips):
            x = level(x, skip)  # resolution x2 per level
        return x  # (B, D, H, W) with all 5 levels, coarser with fewer

    def forward_head(self, x: torch.Tensor, input_hw: tuple[int, int] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder features -> (coords (B, K, 2) input px, probs (B, K, h, w)), float32."""
        if self.map_upsample > 1:  # (B, D, h/u, w/u) -> (B, D, h, w)
            x = F.interpolate(x, scale_factor=self.map_upsample, mode="bilinear", align_corners=False)
        return self.head(x, input_hw)

    def forward_maps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_head(self.forward_decoder(self.forward_features(x)), (x.shape[-2], x.shape[-1]))

    def forward(self, x: torch.Tensor, return_maps: bool = False):
        """(B, K, 2) input px; with return_maps also the soft-argmax maps (B, K, h, w)
        (through forward, so DistributedDataParallel sees the call)."""
        coords, probs = self.forward_maps(x)
        return (coords, probs) if return_maps else coords


def _create_resunet(model_args: dict, kwargs: dict) -> ResUNet:
    return build_preset(ResUNet, model_args, kwargs)


@register_model(input_size=224)
def resunet72(**kwargs) -> ResUNet:
    """ResNet-50-D body (BlurPool shortcuts) + 5-level U-Net decoder, 72 layers"""
    return _create_resunet(dict(block="bottleneck", depths=(3, 4, 6, 3), width=1.0,
                                decoder_widths=DECODER_WIDTHS), kwargs)


@register_model(input_size=96)
def resunet_tiny(**kwargs) -> ResUNet:
    """CPU model: ResNet-10-style basic-block body at half width, decoder to 1/4 resolution"""
    # on a CPU the full-resolution end dominates (68 maps of 96x96 through the 1x1 head and
    # the softmax cost more than the whole encoder), and an 8-channel full-resolution map
    # learns slowly; three decoder levels end at 1/4 (24x24 maps at 96 px, 32 channels).
    # No zero-gamma: on short CPU schedules it slows the first epochs down a lot.
    return _create_resunet(dict(block="basic", depths=(1, 1, 1, 1), width=0.5,
                                decoder_widths=(128, 64, 32, 16, 8), decoder_levels=3,
                                zero_init_last=False), kwargs)


@register_model(input_size=128)
def resunet18_cpu(**kwargs) -> ResUNet:
    """Larger CPU model: ResNet-18-D basic-block body (2-2-2-2) at 3/4 width, resunet-tiny's decoder"""
    # basic blocks keep the 3x3 convs wide enough for the CPU's matmul kernels, where the
    # half-width bottlenecks of resunet26-half spend their FLOPs in narrow 1x1 convs
    # (docs/benchmarks.md); the decoder and its 1/4-resolution maps are resunet-tiny's
    return _create_resunet(dict(block="basic", depths=(2, 2, 2, 2), width=0.75,
                                decoder_widths=(128, 64, 32, 16, 8), decoder_levels=3,
                                zero_init_last=False), kwargs)


@register_model(input_size=128)
def resunet26_half(**kwargs) -> ResUNet:
    """ResNet-26-D bottleneck body (2-2-2-2) at half width + U-Net decoder"""
    return _create_resunet(dict(block="bottleneck", depths=(2, 2, 2, 2), width=0.5,
                                decoder_widths=(256, 160, 64, 32, 16)), kwargs)


@register_model(input_size=64)
def resunet_fast(**kwargs) -> ResUNet:
    """One face at a time on a CPU core: resunet-tiny's body at quarter width, narrow decoder to 1/4"""
    # chosen by batch-1 speed (docs/benchmarks.md): at 64 px from a 64 px crop (no resize)
    # the decoder, not the encoder, held most of resunet-tiny's FLOPs once the body was at
    # quarter width; halving its widths to match the body (64, 32, 16) takes the network
    # from 52 to 23 MFLOP, and 16x16 maps keep the soft-argmax sub-pixel.
    return _create_resunet(dict(block="basic", depths=(1, 1, 1, 1), width=0.25,
                                decoder_widths=(64, 32, 16, 8, 8), decoder_levels=3,
                                zero_init_last=False), kwargs)
