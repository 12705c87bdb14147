"""The `pack` command: the crop cache (every split) and the folds of a data set, as the params
give them, packed small enough to copy to a GPU machine (pipeline/formats/pack.py), where
`gpu-check --train-real PACK` unpacks and trains on them (docs/scaling.md).

Without --cache it runs the crop and folds stages' own functions into a temp folder first, so
`pipeline pack --params recipes/gpu.yaml --out gpu-pack` is all a user runs; with --cache and
--folds it packs what `dvc repro crop folds` (or the commands) already made."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import click

from pipeline.core.config import config_options
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.params_schema import Config
from pipeline.formats.pack import DEFAULT_QUALITY, write_pack
from pipeline.stages.crop import run_crop
from pipeline.stages.folds import run_folds

log = logging.getLogger(__name__)


def run_pack(cfg: Config, out: str | Path, quality: int = DEFAULT_QUALITY, cache: str | Path | None = None,
             folds: str | Path | None = None) -> dict:
    """Crop and folds of cfg (or the given cache and folds file) -> a pack at `out`; pack.json."""
    if (cache is None) != (folds is None):
        raise PipelineError(None, "--cache and --folds go together (or neither: crop and folds run here)")
    check_output(out, folder=True)
    if cache is not None and folds is not None:
        info = write_pack(cache, folds, out, quality)
    else:
        with tempfile.TemporaryDirectory(prefix="pipeline-pack-") as tmp:
            run_crop(cfg, Path(tmp) / "cache")
            run_folds(cfg, Path(tmp) / "cache", Path(tmp) / "folds.csv")
            info = write_pack(Path(tmp) / "cache", Path(tmp) / "folds.csv", out, quality)
    for name, s in info["splits"].items():
        log.info("pack %s: %d faces at %d px, %.1f MB as JPEG (%.1f MB raw), mean |decoded - crop| %.2f grey levels",
                 name, s["faces"], s["side"], s["bytes"] / 1e6, s["raw_bytes"] / 1e6, s["mean_abs_diff"])
    log.info("wrote %s: %.1f MB in all (JPEG quality %d)", out, info["bytes"] / 1e6, info["jpeg_quality"])
    return info


@click.command("pack")
@click.option("--out", default="gpu-pack", show_default=True, help="the pack folder (replaced as a whole)")
@click.option("--quality", default=DEFAULT_QUALITY, show_default=True, type=click.IntRange(1, 100),
              help="JPEG quality of the packed crops")
@click.option("--cache", default=None, help="pack this crop cache (with --folds) instead of cropping here")
@click.option("--folds", "folds_path", default=None, help="the folds file of --cache")
@config_options
def pack_cmd(out, quality, cache, folds_path, cfg):
    """Pack the crop cache (every split) and folds of the params' data set for a GPU machine:
    the crops as JPEG files, everything else as it is (docs/scaling.md)."""
    run_pack(cfg, out, quality, cache, folds_path)
