"""Checkpoints: plain dicts of tensors and Python values, written atomically and read
with `torch.load(weights_only=True)` so loading one never runs pickled code."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import PipelineError
from pipeline.io import torch_save

REQUIRED = ("model_config", "model", "schema", "epoch")


def save_checkpoint(path: str | os.PathLike, ckpt: dict[str, Any]) -> None:
    torch_save(path, ckpt)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    schema=None) -> dict[str, Any]:
    """Load and check a checkpoint; `schema` (a KeypointSchema) must match if given."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(path, "checkpoint not found")
    if path.is_dir():
        raise PipelineError(path, "is a directory, expected a checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError,
            AttributeError, OSError) as e:
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise PipelineError(path, f"not a loadable checkpoint ({reason})") from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED):
        raise PipelineError(path, f"not a pipeline checkpoint (needs keys {', '.join(REQUIRED)})")
    if schema is not None:
        theirs = ckpt["schema"]
        if theirs.get("names") != list(schema.names) or theirs.get("flip") != list(schema.flip_perm):
            raise PipelineError(path, f"checkpoint is for schema '{theirs.get('name')}' "
                                      f"({len(theirs.get('names', []))} points), data uses "
                                      f"'{schema.name}' ({schema.k} points)")
    return ckpt


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", schema=None):
    """(model in eval mode on `device`, checkpoint dict)."""
    from pipeline.models import build_model

    ckpt = load_checkpoint(path, "cpu", schema)
    try:
        model = build_model(ckpt["model_config"])
        model.load_state_dict(ckpt["model"])
    except PipelineError as e:
        raise PipelineError(path, e.problem) from None
    except (RuntimeError, KeyError, TypeError) as e:
        raise PipelineError(path, f"weights do not fit model '{ckpt['model_config'].get('preset')}' "
                                  f"({str(e).splitlines()[0][:120]})") from None
    return model.to(device).eval(), ckpt
