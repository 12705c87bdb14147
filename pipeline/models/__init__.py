"""Keypoint models: the ResUNet heatmap family, the direct-regression baselines and the
preset registry. Every model maps normalised float images (B, C, H, W) to (B, K, 2)
input-pixel coordinates; heatmap models also have `forward_maps(x) -> (coords, probs)`.

Importing this package registers every preset (see `pipeline models`)."""

# importing the modules registers their presets, in this order (`pipeline models` lists them so)
from pipeline.models import resunet  # noqa: F401, I001
from pipeline.models import baselines  # noqa: F401
from pipeline.models.baselines import ResNet50FC, VGGSeed
from pipeline.models.head import SoftArgmaxHead, soft_argmax
from pipeline.models.layers import BlurPool2d, ConvNormAct
from pipeline.models.registry import (build_model, count_params, create_model, default_input_size, list_presets,
                                      model_flops, preset_rows, register_model)
from pipeline.models.resunet import ResUNet

__all__ = ["BlurPool2d", "ConvNormAct", "ResNet50FC", "ResUNet", "SoftArgmaxHead", "VGGSeed", "build_model",
           "count_params", "create_model", "default_input_size", "list_presets", "model_flops", "preset_rows",
           "register_model", "soft_argmax"]
