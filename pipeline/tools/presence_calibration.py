"""`pipeline calibrate-presence`: the presence stage's calibration
(pipeline/stages/presence.py) of any checkpoints, each on its held-out fold, written into the
presence file beside each (models/foldK/presence.json, as the stage writes it) or, with
--out, into a copy of one checkpoint (`presence` in it: a model that carries its own).
Unlike the stage it refuses a model whose faces and non-faces do not separate: one line,
nothing written."""

from __future__ import annotations

import logging
import os
from typing import Sequence

import click

from pipeline.core.config import Config, config_options
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.paths import CACHE_DIR, FOLDS_FILE
from pipeline.formats.cache import dataset_root
from pipeline.formats.checkpoint import presence_file, save_checkpoint, write_presence_file
from pipeline.stages.presence import calibrate_checkpoint, describe

log = logging.getLogger(__name__)


def run_calibrate_presence(cfg: Config, checkpoints: Sequence[str], cache_dir: str | os.PathLike = CACHE_DIR,
                           folds_path: str | os.PathLike = FOLDS_FILE, fold: int | None = None,
                           out: str | None = None, seed: int | None = None, device: str | None = None) -> list[dict]:
    """Calibrate every checkpoint on its held-out fold (the photos of data.dir; the presence
    params, `seed` and `device` overriding theirs) and write each result beside it (or, for
    one checkpoint, into a copy at `out`); nothing is written unless every one separates."""
    if out is not None and len(checkpoints) != 1:
        raise PipelineError(out, "--out writes one checkpoint: give one")
    for target in [out] if out is not None else [presence_file(p) for p in checkpoints]:
        check_output(target)
    pcfg = cfg.presence if seed is None else cfg.presence.model_copy(update={"seed": seed})
    root = dataset_root(cfg.data)
    done = []
    for path in checkpoints:
        res, ckpt = calibrate_checkpoint(path, cache_dir, folds_path, root, pcfg, fold, device)
        if res["stamp"]["threshold"] is None:
            raise PipelineError(path, f"{res['stamp']['why']}: no threshold written (train the model longer, or "
                                      "check data.dir)")
        if res["skipped"]:
            log.warning("%s: %d held-out faces skipped (photo not under %s)", path, res["skipped"], root)
        done.append((path, res, ckpt))
    for path, res, ckpt in done:
        if out is not None:
            save_checkpoint(out, {**ckpt, "presence": res["stamp"]})
        else:
            write_presence_file(path, ckpt, res["stamp"], by_kind=res["by_kind"], skipped=res["skipped"])
        log.info("%s -> %s", describe(res), out or presence_file(path))
    return [res for _, res, _ in done]


@click.command("calibrate-presence")
@click.argument("checkpoints", nargs=-1, required=True)
@click.option("--cache", "cache_dir", default=CACHE_DIR, show_default=True, help="the face cache it was trained on")
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@click.option("--fold", default=None, type=click.IntRange(min=0),
              help="the held-out fold [the checkpoint's own]")
@click.option("--out", default=None, help="write a calibrated copy of the checkpoint here instead (one checkpoint)")
@click.option("--seed", default=None, type=click.IntRange(min=0), help="for the non-face boxes [presence.seed]")
@click.option("--device", default=None, help="[presence.device]")
@config_options
def calibrate_presence_cmd(checkpoints, cache_dir, folds_path, fold, out, seed, device, cfg):
    """The face-presence thresholds of each CHECKPOINT: its held-out faces against non-face
    crops of the same photos (shifted and scaled boxes, parts of faces, background), written
    beside it into presence.json (every backend and `pipeline export` read it there)."""
    for r in run_calibrate_presence(cfg, checkpoints, cache_dir, folds_path, fold, out, seed, device):
        kinds = ", ".join(f"{k} {v['n']} (median {v['median']:.3f})" for k, v in r["by_kind"].items())
        click.echo(f"{describe(r)}; {kinds}")
