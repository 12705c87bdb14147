"""The `submit` stage: the competition CSV (pipeline/formats/submission.py) from the test
predictions (pipeline/formats/predictions.py), or, standalone, from any test XML and checkpoints.
The coordinates are validated against the test cache's face and keypoint counts before
anything is written."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import click
import numpy as np

from pipeline.core.config import Config, config_options, params_source
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, input_file
from pipeline.core.paths import CACHE_DIR
from pipeline.formats.cache import face_count, split_schema
from pipeline.formats.predictions import read_predictions
from pipeline.formats.submission import validate_coords, write_submission
from pipeline.keypoints.schema import get_schema

log = logging.getLogger(__name__)


def submission_path(cfg: Config, out_dir: str | os.PathLike, out_path: str | os.PathLike | None) -> Path:
    """--out, else <out_dir>/<submit.name>.csv (submit.name must be a plain file name)."""
    name = cfg.submit.name
    if not name or "/" in name or "\\" in name or "\0" in name or name in (".", ".."):
        raise PipelineError(params_source("submit.name"), f"submit.name must be a plain file name, got {name!r}")
    return Path(out_path) if out_path else Path(out_dir) / f"{name}.csv"


def run_submit(predictions_path: str | os.PathLike, cache: str | os.PathLike, out: Path) -> np.ndarray:
    """The `submit` stage: test.npz's `ensemble` -> CSV; the test cache (when present)
    fixes how many faces and keypoints it must hold."""
    coords = read_predictions(predictions_path, ("ensemble",))["ensemble"]
    test_split = Path(cache) / "test"
    schema = split_schema(test_split)
    return _write(coords, predictions_path, out, face_count(test_split), None if schema is None else schema.k)


def run_submit_xml(cfg: Config, xml_path: str | os.PathLike, checkpoints: Sequence[str], out: Path) -> np.ndarray:
    """Standalone: predict any test XML with any checkpoints (fold-averaged) -> CSV."""
    # the one path of submit that runs a network: the DVC stage (from predictions/) starts
    # without torch's import
    from pipeline.inference.predictor import predict_xml

    input_file(xml_path, "test XML not found", "a test XML file")
    for c in checkpoints:  # all of them before the first one predicts
        input_file(c, "checkpoint not found", "a checkpoint file")
    coords = predict_xml(xml_path, checkpoints, cfg.predict, cfg.data, cfg.crop)
    return _write(coords, xml_path, out, None, get_schema(cfg.data).k)


def _write(coords, source, out: Path, n_faces: int | None, k: int | None) -> np.ndarray:
    arr = validate_coords(coords, source, n_faces=n_faces, k=k)
    write_submission(out, arr)
    return arr


@click.command("submit")
@click.option("--predictions", "predictions_path", default="predictions/test.npz", show_default=True,
              help="test predictions from `pipeline predict` (its `ensemble` array is written)")
@click.option("--cache", default=CACHE_DIR, show_default=True,
              help="face cache; test/meta.csv gives the expected face count")
@click.option("--out-dir", default="submissions", show_default=True,
              help="folder of <submit.name>.csv")
@click.option("--xml", "xml_path", default=None,
              help="standalone mode: predict this test XML instead of reading --predictions")
@click.option("--checkpoints", multiple=True,
              help="standalone mode: checkpoint(s) to ensemble; more may follow as arguments")
@click.option("--out", "out_path", default=None,
              help="output CSV (default <out-dir>/<submit.name>.csv)")
@click.argument("more_checkpoints", nargs=-1)
@config_options
def submit_cmd(predictions_path, cache, out_dir, xml_path, checkpoints, out_path, more_checkpoints, cfg):
    """Write the competition CSV (Id,Predicted) from the test predictions.

    Standalone: `pipeline submit --xml TEST_XML --checkpoints a.pt [b.pt ...] [--out PATH]`
    predicts any test XML with any checkpoints (fold-averaged)."""
    out = check_output(submission_path(cfg, out_dir, out_path))
    ckpts = list(checkpoints) + list(more_checkpoints)
    if xml_path is None:
        if ckpts:
            raise click.UsageError("checkpoints are only used with --xml (standalone mode)")
        arr = run_submit(predictions_path, cache, out)
    else:
        if not ckpts:
            raise click.UsageError("--xml needs --checkpoints a.pt [b.pt ...]")
        arr = run_submit_xml(cfg, xml_path, ckpts, out)
    click.echo(f"wrote {out}: {arr.shape[0]} faces x {arr.shape[1]} keypoints = {arr.size} rows")
