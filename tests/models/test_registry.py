"""Models: the return contract of every preset, the ResUNet-72 architecture, the
soft-argmax head, the registry and config round trips. Small inputs only (CPU)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from pipeline.core.errors import PipelineError
from pipeline.models import (
    BlurPool2d,
    ResUNet,
    build_model,
    count_params,
    create_model,
    default_input_size,
    list_presets,
    model_flops,
    soft_argmax,
)
from pipeline.models import head as head_module
from pipeline.models.head import SoftArgmaxHead
from pipeline.models.resunet import BasicBlock, Bottleneck

K = 5
PRESETS = list_presets()
HEATMAP = ["resunet72", "resunet-tiny", "resunet18-cpu", "resunet26-half"]
# the smallest input each preset takes (five halvings); 64 px for the heatmap models
SMALL = {"resunet72": 64, "resunet-tiny": 64, "resunet18-cpu": 64, "resunet26-half": 64, "resunet-fast": 64, "vgg-seed": 32,
         "resnet50-fc": 32}

_CACHE: dict = {}


def small_model(preset: str, **options) -> nn.Module:
    key = (preset, tuple(sorted(options.items())))
    if key not in _CACHE:
        torch.manual_seed(0)
        _CACHE[key] = create_model(preset, K, input_size=SMALL[preset], **options)
    return _CACHE[key]


def batch(preset: str, in_chans: int = 3, b: int = 2) -> torch.Tensor:
    return torch.randn(b, in_chans, SMALL[preset], SMALL[preset], generator=torch.Generator().manual_seed(1))


def main_path_layers(model: nn.Module) -> list[str]:
    """Conv / transposed-conv / linear layers outside the projection shortcuts."""
    return [n for n, m in model.named_modules()
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)) and "downsample" not in n]


def test_presets_registered():
    assert set(PRESETS) == {"resunet72", "resunet-tiny", "resunet18-cpu", "resunet26-half", "resunet-fast", "vgg-seed",
                            "resnet50-fc"}
    assert default_input_size("resunet-tiny") == 96 and default_input_size("resunet-fast") == 64
    assert default_input_size("resunet72") == default_input_size("vgg-seed") == 224


@pytest.mark.parametrize("preset", PRESETS)
def test_forward_contract_and_gradients(preset):
    # zero-gamma off, every weight (also inside the residual branches) gets a non-zero
    # gradient on the first step; with the default (on) each must still get a gradient
    runs = [({"zero_init_last": False}, True), ({}, False)] if preset in HEATMAP else [({}, True)]
    for opts, nonzero in runs:
        model = small_model(preset, **opts).train()
        model.zero_grad(set_to_none=True)
        x = batch(preset)
        out = model(x)
        assert out.shape == (2, K, 2) and out.dtype == torch.float32
        assert torch.isfinite(out).all()
        target = torch.rand(2, K, 2, generator=torch.Generator().manual_seed(2)) * (SMALL[preset] - 1)
        (out - target).abs().mean().backward()
        for name, p in model.named_parameters():
            assert p.grad is not None, name
            assert torch.isfinite(p.grad).all(), name
            if nonzero:
                assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("preset", PRESETS)
def test_init_predicts_inside_the_image(preset):
    # direct regressors predict offsets from the centre in image sizes; soft-argmax
    # coordinates are convex combinations of pixel positions
    model = small_model(preset).eval()
    with torch.no_grad():
        out = model(batch(preset))
    s = SMALL[preset]
    assert (out >= 0).all() and (out <= s - 1).all()


def test_resunet72_parameters_and_layers():
    with torch.device("meta"):  # architecture only: no memory, no init cost
        model = create_model("resunet72", 68, input_size=224)
    n = count_params(model)
    assert abs(n - 31e6) / 31e6 < 0.10, n
    layers = main_path_layers(model)
    assert len(layers) == 72, layers
    assert sum(n.startswith("stem.") for n in layers) == 3
    assert sum(n.startswith("stages.") for n in layers) == 48  # 16 bottlenecks x 3
    assert sum(n.startswith("decoder.") for n in layers) == 20  # 5 x (up-conv + 3)
    assert layers[-1] == "head.conv"
    assert [len(s) for s in model.stages] == [3, 4, 6, 3]
    assert all(isinstance(b, Bottleneck) for s in model.stages for b in s)
    assert [s[-1].conv3.conv.out_channels for s in model.stages] == [256, 512, 1024, 2048]
    # ResNet-C stem 32-32-64, strides 2, 1, 2 (the third conv replaces the MaxPool)
    stem = [model.stem.conv1.conv, model.stem.conv2.conv, model.stem.conv3.conv]
    assert [c.out_channels for c in stem] == [32, 32, 64]
    assert [c.stride[0] for c in stem] == [2, 1, 2] and all(c.kernel_size == (3, 3) for c in stem)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    for s in model.stages[1:]:
        first = s[0]
        # ResNet-B: the 3x3 carries the stride; ResNet-D: BlurPool then a stride-1 1x1
        assert first.conv1.conv.stride == (1, 1) and first.conv2.conv.stride == (2, 2)
        pool, conv, _ = first.downsample
        assert isinstance(pool, BlurPool2d) and conv.stride == (1, 1) and conv.kernel_size == (1, 1)
    ups = [lvl.up.conv for lvl in model.decoder]
    assert all(isinstance(u, nn.ConvTranspose2d) and u.stride == (2, 2) for u in ups)
    # decoder skips: stage3, stage2, stage1, the /2 stem conv, the input
    assert [lvl.block.conv1.conv.in_channels - lvl.up.conv.out_channels for lvl in model.decoder] == \
        [1024, 512, 256, 32, 3]
    assert model.head.conv.out_channels == 68


def test_resunet_resolutions():
    model = small_model("resunet-tiny").eval()
    x = batch("resunet-tiny")
    with torch.no_grad():
        feats = model.forward_features(x)
        assert [f.shape[-1] for f in feats] == [64, 32, 16, 8, 4, 2]
        # resunet-tiny stops after 3 of the 5 decoder levels: maps at 1/4 of the input
        assert model.forward_decoder(feats).shape[-2:] == (16, 16)
    full = create_model("resunet-tiny", K, input_size=64, decoder_levels=5).eval()
    with torch.no_grad():
        assert full.forward_decoder(full.forward_features(x)).shape[-2:] == (64, 64)


def test_map_upsample_refines_the_maps_without_a_decoder_level():
    # 3 levels end at 1/4 of the input; map_upsample=2 puts the soft-argmax on a 1/2 grid
    model = small_model("resunet-tiny", map_upsample=2)
    x = batch("resunet-tiny")
    coords, probs = model.forward_maps(x)
    assert probs.shape == (2, K, 32, 32)
    assert len(model.decoder) == 3  # no decoder level was added for the finer maps
    grid = (torch.arange(32, dtype=torch.float32) + 0.5) * 2 - 0.5  # map pixel centres in input px
    assert torch.allclose(coords[..., 0], (probs.sum(-2) * grid).sum(-1), atol=1e-4)
    # the upsampling is bilinear on the pixel-centre convention of soft_argmax's input_hw
    # scaling (align_corners=False), and commutes with the 1x1 head: the maps' logits are the
    # coarse logits upsampled
    model.eval()
    with torch.no_grad():
        feats = model.forward_decoder(model.forward_features(x))  # (B, D, 16, 16)
        coarse = F.conv2d(feats, model.head.conv.weight)  # (B, K, 16, 16)
        fine = F.interpolate(coarse, scale_factor=2, mode="bilinear", align_corners=False)
        _, probs = model.forward_maps(x)
    assert torch.allclose(probs, fine.flatten(2).softmax(-1).view_as(probs), atol=1e-5)
    model.train()
    coords.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    for bad in (3, 2.0, True):
        with pytest.raises(PipelineError, match="map_upsample must be 1, 2 or 4"):
            create_model("resunet-tiny", K, input_size=64, map_upsample=bad)
    with pytest.raises(PipelineError, match="maps larger than the input"):
        create_model("resunet-tiny", K, input_size=64, decoder_levels=4, map_upsample=4)


def test_tiny_is_cheap():
    model = create_model("resunet-tiny", 68, input_size=96)
    assert model_flops(model, 96, 3) < 0.5e9
    assert count_params(model) < 5e6


@pytest.mark.parametrize("preset", PRESETS)
def test_flops_counted(preset):
    model = small_model(preset)
    flops = model_flops(model, SMALL[preset], 3)
    assert flops > 0
    # the meta-device count (rebuilt from the config) equals one on a deep copy
    import copy
    plain = copy.deepcopy(model)
    del plain.config
    assert model_flops(plain, SMALL[preset], 3) == flops


# ---- soft-argmax head -------------------------------------------------------------

def one_hot_logits(h: int, w: int, points: list[tuple[int, int]]) -> torch.Tensor:
    logits = torch.full((1, len(points), h, w), -1e4)
    for k, (c, r) in enumerate(points):
        logits[0, k, r, c] = 1e4
    return logits


def test_soft_argmax_one_hot_gives_the_pixel():
    h, w = 12, 20  # not square: catches x/y swaps
    points = [(0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1), (7, 3), (19, 5), (2, 11)]
    coords, probs = soft_argmax(one_hot_logits(h, w, points))
    assert coords.shape == (1, len(points), 2)
    assert torch.equal(coords[0], torch.tensor(points, dtype=torch.float32))
    assert torch.allclose(probs.sum((-2, -1)), torch.ones(1, len(points)))


def test_soft_argmax_uniform_gives_the_centre():
    coords, _ = soft_argmax(torch.zeros(2, 3, 8, 10))
    assert torch.allclose(coords, torch.tensor([4.5, 3.5]).expand(2, 3, 2))


def test_soft_argmax_scales_coarse_maps_to_input_pixels():
    # map pixel (c, r) of a half-resolution map covers input pixels 2c, 2c + 1
    coords, _ = soft_argmax(one_hot_logits(6, 10, [(0, 0), (9, 5), (3, 2)]), input_hw=(12, 20))
    assert torch.allclose(coords[0], torch.tensor([[0.5, 0.5], [18.5, 10.5], [6.5, 4.5]]))


def test_soft_argmax_is_float32_under_autocast():
    logits = torch.randn(2, 3, 16, 16).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        coords, probs = soft_argmax(logits)
    assert coords.dtype == probs.dtype == torch.float32
    assert torch.allclose(probs.sum((-2, -1)), torch.ones(2, 3), atol=1e-6)


@pytest.mark.parametrize("preset", HEATMAP)
def test_forward_maps(preset):
    model = small_model(preset).eval()
    x = batch(preset)
    with torch.no_grad():
        coords, probs = model.forward_maps(x)
        plain = model(x)
    s = SMALL[preset]
    # map side: coarser with fewer levels, finer with map_upsample
    m = s // 2 ** (5 - getattr(model, "decoder_levels", 5)) * getattr(model, "map_upsample", 1)
    assert probs.shape == (2, K, m, m)
    assert torch.allclose(probs.sum((-2, -1)), torch.ones(2, K), atol=1e-5)
    assert torch.equal(coords, plain)
    grid = (torch.arange(m, dtype=torch.float32) + 0.5) * (s / m) - 0.5  # map pixel centres in input px
    assert torch.allclose(coords[..., 0], (probs.sum(-2) * grid).sum(-1), atol=1e-4)
    assert torch.allclose(coords[..., 1], (probs.sum(-1) * grid).sum(-1), atol=1e-4)


def test_regression_models_have_no_maps():
    assert not hasattr(small_model("vgg-seed"), "forward_maps")
    assert not hasattr(small_model("resnet50-fc"), "forward_maps")


# ---- baselines --------------------------------------------------------------------

def test_vgg_seed_architecture():
    model = create_model("vgg-seed", 68, input_size=224)
    convs = [m for m in model.features.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [8, 16, 32, 32, 64, 64, 128, 128]
    assert [c.stride[0] for c in convs] == [2, 2, 2, 1, 2, 1, 2, 1]
    assert model.num_features == 128 * 7 * 7 == 6272
    assert model.fc[0].in_features == 6272 and model.fc[0].out_features == 1024
    assert isinstance(model.fc[1], nn.BatchNorm1d)
    assert model.head.fc.out_features == 136
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())


def test_resnet50_fc_flattens_the_map():
    with torch.device("meta"):
        model = create_model("resnet50-fc", 68, input_size=224)
        small = create_model("resnet50-fc", 68, input_size=64)
    assert model.head.fc.in_features == 2048 * 7 * 7
    assert small.head.fc.in_features == 2048 * 2 * 2
    assert not any(isinstance(m, nn.AdaptiveAvgPool2d) for m in model.modules())


# ---- registry, config, options ------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_build_model_from_config_and_state_dict_round_trip(preset, tmp_path):
    model = small_model(preset).eval()
    config = model.config
    assert json.loads(json.dumps(config)) == config  # plain values only
    assert config["preset"] == preset and config["num_keypoints"] == K
    assert config["in_chans"] == 3 and config["input_size"] == SMALL[preset]
    torch.manual_seed(123)
    rebuilt = build_model(config).eval()
    a, b = model.state_dict(), rebuilt.state_dict()
    assert list(a) == list(b)
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    assert rebuilt.config == config
    path = tmp_path / "ckpt.pt"
    torch.save({"model_config": config, "model": a}, path)
    ck = torch.load(path, weights_only=True)
    again = build_model(ck["model_config"]).eval()
    again.load_state_dict(ck["model"])
    x = batch(preset)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_config_records_the_resolved_options():
    model = create_model("resunet-tiny", 3, input_size=64, act="hardswish")
    opts = model.config["options"]
    assert opts["act"] == "hardswish" and opts["block"] == "basic" and opts["width"] == 0.5
    assert opts["decoder_widths"] == [128, 64, 32, 16, 8]  # lists, not tuples


def test_unknown_preset():
    with pytest.raises(PipelineError, match=r"unknown model preset 'nope' \(known: .*resunet72"):
        create_model("nope", 68)
    with pytest.raises(PipelineError, match="unknown model preset"):
        build_model({"preset": "nope", "num_keypoints": 68})


@pytest.mark.parametrize("preset", PRESETS)
def test_unknown_option(preset):
    with pytest.raises(PipelineError, match=r"unknown option\(s\) \['colour'\]"):
        create_model(preset, K, input_size=SMALL[preset], colour="red")


@pytest.mark.parametrize("options, match", [
    ({"act": "gelu"}, "unknown activation 'gelu'"),
    ({"block": "dense"}, "unknown block 'dense'"),
    ({"depths": [1, 1]}, "depths must be 4 positive integers"),
    ({"decoder_widths": [8, 8]}, "decoder_widths must be 5"),
    ({"upsample": "nearest"}, "unknown upsample"),
    ({"width": 0}, "width must be a positive number"),
])
def test_bad_option_values(options, match):
    with pytest.raises(PipelineError, match=match):
        create_model("resunet-tiny", K, input_size=64, **options)


def test_bad_sizes():
    with pytest.raises(PipelineError, match="multiple of 32"):
        create_model("resunet-tiny", K, input_size=100)
    with pytest.raises(PipelineError, match=r"num_keypoints must be an integer in \[1, 10000\], got 0"):
        create_model("resunet-tiny", 0)
    # sizes a checkpoint declares are bounded before anything is allocated
    with pytest.raises(PipelineError, match=r"input_size must be an integer in \[1, 4096\], got 8192"):
        build_model({"preset": "resunet-tiny", "num_keypoints": 3, "input_size": 8192})
    with pytest.raises(PipelineError, match=r"declares \d.\d+e\+\d+ parameters \(at most 1e\+09\)"):
        build_model({"preset": "resunet-tiny", "num_keypoints": 3, "input_size": 64, "options": {"width": 100_000}})
    with pytest.raises(PipelineError, match="model config"):
        build_model({"preset": "resunet-tiny", "num_keypoints": 3, "extra": 1})


@pytest.mark.parametrize("options", [
    {"blurpool": False},
    {"act": "hardswish"},
    {"in_chans": 1},
    {"upsample": "bilinear"},
    {"block": "bottleneck", "depths": [1, 1, 1, 1], "width": 0.25},
    {"decoder_block": "bottleneck"},
    {"input_skip": False},
    {"width": 0.25, "decoder_widths": [32, 16, 16, 8, 8]},
])
def test_options_build_and_run(options):
    options = dict(options)
    in_chans = options.pop("in_chans", 3)
    model = create_model("resunet-tiny", K, in_chans=in_chans, input_size=64, **options)
    out = model(batch("resunet-tiny", in_chans))
    assert out.shape == (2, K, 2) and torch.isfinite(out).all()
    out.sum().backward()
    assert build_model(model.config).config == model.config


def test_blurpool_and_act_options_change_the_layers():
    on = create_model("resunet-tiny", K, input_size=64)
    off = create_model("resunet-tiny", K, input_size=64, blurpool=False)
    assert any(isinstance(m, BlurPool2d) for m in on.modules())
    assert not any(isinstance(m, BlurPool2d) for m in off.modules())
    assert any(isinstance(m, nn.AvgPool2d) for m in off.modules())
    # the filter is fixed: both load the same weights
    off.load_state_dict(on.state_dict())
    hs = create_model("resunet-tiny", K, input_size=64, act="hardswish")
    assert any(isinstance(m, nn.Hardswish) for m in hs.modules())
    assert not any(isinstance(m, nn.ReLU) for m in hs.modules())
    assert all(isinstance(b, BasicBlock) for s in on.stages for b in s)


@pytest.mark.parametrize("preset", PRESETS)
def test_grayscale_input(preset):
    model = create_model(preset, K, in_chans=1, input_size=SMALL[preset]).eval()
    with torch.no_grad():
        out = model(batch(preset, in_chans=1))
    assert out.shape == (2, K, 2) and torch.isfinite(out).all()
    assert model.config["in_chans"] == 1


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(ValueError, match="multiples of 32"):
        small_model("resunet-tiny")(torch.zeros(1, 3, 48, 48))


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("hw", [(7, 9), (8, 8), (2, 3)])
def test_blurpool_is_the_depthwise_binomial_conv(stride, hw):
    """The two average pools equal the reflect-padded depthwise [1, 2, 1] x [1, 2, 1] / 16
    conv with the stride, values and gradients, in NCHW and channels_last."""
    k = torch.tensor([1.0, 2.0, 1.0])
    filt = ((k[:, None] * k[None, :]) / 16.0).expand(3, 1, 3, 3)
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    for layout in (torch.contiguous_format, torch.channels_last):
        xa = x.clone().contiguous(memory_format=layout).requires_grad_()
        xb = x.clone().requires_grad_()
        ya = BlurPool2d(3, stride=stride)(xa)
        yb = F.conv2d(F.pad(xb, (1, 1, 1, 1), mode="reflect"), filt.double(), stride=stride, groups=3)
        assert ya.shape == yb.shape and torch.allclose(ya, yb)
        g = torch.randn_like(yb)
        ya.backward(g)
        yb.backward(g)
        assert torch.allclose(xa.grad, xb.grad)


def test_blurpool_filter():
    pool = BlurPool2d(2)
    assert not list(pool.parameters()) and not pool.state_dict()  # fixed, not a weight
    x = torch.full((1, 2, 7, 9), 3.0)
    y = pool(x)
    assert y.shape == (1, 2, 4, 5)
    assert torch.allclose(y, torch.full_like(y, 3.0))  # reflect padding: no dark border
    # an impulse spreads into the binomial kernel
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 2, 2] = 16.0
    y = BlurPool2d(1, stride=1)(x)
    assert torch.allclose(y[0, 0, 1:4, 1:4], torch.tensor([[1.0, 2, 1], [2, 4, 2], [1, 2, 1]]))


def test_head_on_channels_last_features_is_the_1x1_conv(monkeypatch):
    """Channels_last features take the GEMM path: the same maps and coordinates as the
    1x1 conv of NCHW features, the same gradients, the input's gradient channels_last and
    the maps' memory contiguous per map (what the softmax reads)."""
    gemm_calls = []
    apply = head_module._PointwiseToMaps.apply
    monkeypatch.setattr(head_module._PointwiseToMaps, "apply",
                        lambda *a: gemm_calls.append(a[0].shape) or apply(*a))
    torch.manual_seed(0)
    head = SoftArgmaxHead(16, K)  # fp32 whatever comes in
    x = torch.randn(3, 16, 8, 10)
    outputs, grads = [], []
    for layout in (torch.contiguous_format, torch.channels_last):
        head.zero_grad()
        xi = x.clone().contiguous(memory_format=layout).requires_grad_()
        coords, probs = head(xi, (16, 20))
        (coords.square().sum() + (probs * probs.detach().log()).sum()).backward()
        outputs.append((coords, probs))
        grads.append((xi.grad, head.conv.weight.grad.clone()))
        assert probs.is_contiguous()
        assert xi.grad.is_contiguous(memory_format=layout)
    assert gemm_calls == [x.shape]  # the channels_last run only; NCHW keeps the conv
    (c0, p0), (c1, p1) = outputs
    assert torch.allclose(c0, c1, atol=1e-5) and torch.allclose(p0, p1, atol=1e-6)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"map_upsample": 2}])
def test_channels_last_matches(options):
    model = small_model("resunet-tiny", **options).eval()
    x = batch("resunet-tiny")
    # the head's GEMM path wants channels_last features: map_upsample's resize must keep the layout
    head_inputs = []
    model.head.register_forward_pre_hook(lambda _, args: head_inputs.append(args[0]))
    with torch.no_grad():
        ref = model(x)
        cl = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    model.to(memory_format=torch.contiguous_format)
    assert torch.allclose(ref, cl, atol=1e-3)
    assert head_inputs[-1].is_contiguous(memory_format=torch.channels_last)


def test_models_command_lists_every_preset():
    from pipeline.cli import models_cmd

    res = CliRunner().invoke(models_cmd, ["--keypoints", "68"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:3] == ["preset", "params", "(M)"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert set(rows) == set(PRESETS)
    assert abs(float(rows["resunet72"][1]) - 31) < 3.1
    assert rows["resunet-tiny"][3] == "96" and float(rows["resunet-tiny"][2]) < 0.5
    # the one-face-at-a-time preset: a ninth of resunet-tiny's FLOPs at 96 px
    assert rows["resunet-fast"][3] == "64" and float(rows["resunet-fast"][2]) < 0.03


def test_resunet_class_exported():
    assert isinstance(small_model("resunet-tiny"), ResUNet)


def test_every_preset_has_its_options_typed_in_the_config():
    """Issue 48, finding 5: the config checks model.options at load against a table of
    each preset's options and their types (core cannot build a model, nor import torch):
    the table names every registered preset and exactly the options its constructor takes,
    with the constructor's types."""
    import inspect

    from pipeline.core.params_schema import MODEL_OPTIONS
    from pipeline.models.registry import _FIXED

    kinds = {"str": "string", "int": "int", "float": "number", "bool": "bool", "Sequence[int]": "ints",
             "Sequence[int] | None": "ints or null", "str | None": "string or null"}
    assert set(MODEL_OPTIONS) == set(PRESETS)
    for name in PRESETS:
        with torch.device("meta"):
            cls = type(create_model(name, K, 3, SMALL[name]))
        params = {k: p for k, p in inspect.signature(cls).parameters.items() if k not in _FIXED}
        assert set(MODEL_OPTIONS[name]) == set(params), name
        for option, p in params.items():
            assert MODEL_OPTIONS[name][option] == kinds[str(p.annotation)], (name, option, p.annotation)
