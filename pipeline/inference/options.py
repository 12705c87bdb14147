"""The click options of the commands that predict with trained models: which models
(`--checkpoint`, repeatable), where they run (`--device`) and on which runtime (`--backend`),
worded once for predict-image, predict-video, video-stats, morph, predict and bench."""

from __future__ import annotations

from typing import Callable, TypeVar

import click

from pipeline.inference.predictor import BACKENDS

F = TypeVar("F", bound=Callable)

BACKEND_HELP = "onnx: onnxruntime on the CPU (a .onnx --checkpoint always runs there)"


def backend_option(help: str = BACKEND_HELP) -> Callable[[F], F]:
    """`--backend torch|onnx` (default torch)."""
    return click.option("--backend", type=click.Choice(list(BACKENDS)), default="torch", show_default=True, help=help)


def device_option(fn: F) -> F:
    """`--device` (default auto: the GPU when there is one)."""
    return click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda | cuda:N")(fn)


def model_options(fn: F) -> F:
    """`--checkpoint` (required, repeatable; passed as `checkpoints`), `--device`, `--backend`."""
    fn = device_option(backend_option()(fn))
    return click.option("--checkpoint", "checkpoints", multiple=True, required=True,
                        help="model checkpoint or exported .onnx (repeatable: predictions are averaged)")(fn)
