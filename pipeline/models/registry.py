"""Named model presets. A preset is one decorated function (timm-style):

    @register_model(input_size=96)
    def resunet_tiny(**kwargs):
        return build_preset(ResUNet, dict(block="basic", depths=(1, 1, 1, 1), ...), kwargs)

registered as `resunet-tiny` (underscores become dashes). `create_model` builds it and
stamps `model.config`, a plain dict `build_model` turns back into the same architecture
(checkpoints store it next to the weights)."""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pipeline.core.errors import PipelineError

# arguments every model constructor takes; everything else is a preset option
_FIXED = ("num_keypoints", "in_chans", "input_size")
_CONFIG_KEYS = {"preset", "num_keypoints", "in_chans", "input_size", "options"}
# upper bounds of the sizes a model config may declare (a checkpoint's config is read
# from a file: an absurd size must be refused before anything is allocated)
MAX_SIZES = {"num_keypoints": 10_000, "in_chans": 4, "input_size": 4096}  # input_size: model.input_size's range
MAX_PARAMS = 1_000_000_000  # 4 GB of float32 weights; the largest preset has a few million


@dataclass(frozen=True)
class Preset:
    name: str
    fn: Callable[..., nn.Module]
    input_size: int  # the size the preset is meant for (the `pipeline models` table)
    doc: str


_PRESETS: dict[str, Preset] = {}


def register_model(fn: Callable[..., nn.Module] | None = None, *, input_size: int = 224):
    """Decorator: register `fn(**kwargs) -> nn.Module` as preset `fn.__name__` with dashes."""

    def wrap(f):
        name = f.__name__.replace("_", "-")
        doc = (inspect.getdoc(f) or "").split("\n")[0]
        _PRESETS[name] = Preset(name, f, input_size, doc)
        return f

    return wrap(fn) if fn is not None else wrap


def _plain(v: Any) -> Any:
    """Tuples -> lists, recursively: model.config must be plain (JSON, weights_only)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


M = TypeVar("M", bound=nn.Module)


def build_preset(cls: type[M], defaults: dict[str, Any], kwargs: dict[str, Any]) -> M:
    """cls(**fixed, **defaults overridden by the user's options); rejects options the
    constructor does not take. The resolved options (constructor defaults, then preset
    defaults, then the user's) land on `model.options`, so the config records the full
    architecture even if a preset's or a constructor's defaults change later."""
    fixed = {k: kwargs[k] for k in _FIXED if k in kwargs}
    user = {k: v for k, v in kwargs.items() if k not in _FIXED}
    known = [p for p in inspect.signature(cls).parameters if p not in _FIXED]
    unknown = sorted(set(user) - set(known))
    if unknown:
        raise PipelineError(None, f"unknown option(s) {unknown} (known: {', '.join(known) or 'none'})")
    sig_defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()
                    if k not in _FIXED and p.default is not inspect.Parameter.empty}
    options = {**sig_defaults, **defaults, **user}
    model = cls(**fixed, **options)
    model.options = _plain(options)
    return model


def list_presets() -> list[str]:
    return list(_PRESETS)


def default_input_size(preset: str) -> int:
    return _get(preset).input_size


def _get(preset: str) -> Preset:
    try:
        return _PRESETS[preset]
    except KeyError:
        raise PipelineError(None, f"unknown model preset '{preset}' (known: {', '.join(_PRESETS)})") from None


def create_model(preset: str, num_keypoints: int, in_chans: int = 3, input_size: int = 224,
                 **options) -> nn.Module:
    """Build a registered preset. The model maps (B, in_chans, H, W) normalised float
    images to (B, num_keypoints, 2) input-pixel coordinates."""
    p = _get(preset)
    for key, value in (("num_keypoints", num_keypoints), ("in_chans", in_chans), ("input_size", input_size)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZES[key]:
            raise PipelineError(None, f"model preset '{preset}': {key} must be an integer in [1, {MAX_SIZES[key]}], "
                                      f"got {value!r}")
    try:
        model = p.fn(num_keypoints=num_keypoints, in_chans=in_chans, input_size=input_size, **options)
    except PipelineError as e:
        raise PipelineError(e.path, f"model preset '{preset}': {e.problem}", e.where) from None
    except (TypeError, ValueError) as e:
        raise PipelineError(None, f"model preset '{preset}': bad option value in {options}: {e}") from None
    # a plain attribute; nn.Module types its attributes Tensor | Module
    model.config = {"preset": preset, "num_keypoints": num_keypoints, "in_chans": in_chans,  # type: ignore[assignment]
                    "input_size": input_size, "options": getattr(model, "options", {})}
    return model


def build_model(config: dict[str, Any]) -> nn.Module:
    """Inverse of `model.config`: the same architecture, freshly initialised."""
    if not isinstance(config, dict) or not {"preset", "num_keypoints"} <= set(config):
        raise PipelineError(None, f"model config must be a dict with keys {sorted(_CONFIG_KEYS)}, got {config!r}")
    extra = set(config) - _CONFIG_KEYS
    if extra:
        raise PipelineError(None, f"model config: unknown key(s) {sorted(extra)}")
    args = (config["preset"], config["num_keypoints"], config.get("in_chans", 3), config.get("input_size", 224))
    options = config.get("options") or {}
    if not isinstance(options, dict):
        raise PipelineError(None, f"model config: options must be a mapping, got {type(options).__name__}")
    if torch.get_default_device().type != "meta":  # the sizes the options declare, counted without memory
        with torch.device("meta"):
            n = count_params(create_model(*args, **options))
        if n > MAX_PARAMS:
            raise PipelineError(None, f"model config declares {n:.3g} parameters (at most {MAX_PARAMS:.0e})")
    return create_model(*args, **options)


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def model_flops(model: nn.Module, input_size: int, in_chans: int = 3) -> float:
    """Forward FLOPs for one (in_chans, input_size, input_size) image, counted by
    torch.utils.flop_counter (a multiply-add is 2 FLOPs; convs and matmuls only).

    Runs on a copy on the meta device: no memory for activations, no real compute, so
    counting a 224 px ResUNet-72 is instant even on a CPU."""
    if hasattr(model, "config"):
        with torch.device("meta"):
            meta = build_model(model.config)  # type: ignore[arg-type]  # the dict set by create_model
    else:
        meta = copy.deepcopy(model).to("meta")
    meta.eval()
    x = torch.zeros(1, in_chans, input_size, input_size, device="meta")
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        meta(x)
    return float(counter.get_total_flops())


def preset_rows(keypoints: int = 68, in_chans: int = 3) -> list[dict[str, Any]]:
    """One row per preset: parameters, forward FLOPs per image at its default input size,
    output type and description (the models are built on the meta device: no weights)."""
    rows = []
    for name in list_presets():
        size = default_input_size(name)
        with torch.device("meta"):  # counting only: no weights allocated
            model = create_model(name, keypoints, in_chans, size)
        rows.append({"preset": name, "params": count_params(model), "flops": model_flops(model, size, in_chans),
                     "input_size": size, "output": "heatmap" if hasattr(model, "forward_maps") else "regression",
                     "doc": _PRESETS[name].doc})
    return rows
