"""Grouped K folds: faces of one photo never sit on both sides of a split.

`pipeline folds` reads `<cache>/train/meta.csv` (cache order) and writes `folds/folds.csv`
with columns `index, face_id, group, fold`, one row per training face."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import click
import numpy as np

from pipeline.core.config import config_options, params_source, write_resolved
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.params_schema import Config
from pipeline.core.paths import CACHE_DIR, FOLDS_FILE
from pipeline.formats.annotations import photo_group
from pipeline.formats.cache import read_meta
from pipeline.formats.folds import write_folds

log = logging.getLogger(__name__)


def make_folds(groups, k: int, seed: int, source: str = "folds") -> np.ndarray:
    """Fold (0..k-1, int64) per face. Groups are shuffled (by seed), then placed largest first
    into the currently smallest fold, so folds stay balanced even with multi-face photos and
    every fold gets at least one group. A group larger than a fold (n / k faces) is refused:
    it would leave one fold far bigger than the others (usually a grouping rule that lumps
    unrelated photos together); `source` is named in that error."""
    groups = np.asarray([str(g) for g in groups])
    if len(groups) == 0:
        raise PipelineError("folds", "no faces to split")
    uniq, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise PipelineError(params_source("folds.k"), f"folds.k must be an integer >= 2, got {k!r}")
    if k > len(uniq):
        raise PipelineError(params_source("folds.k"), f"folds.k = {k} but there are only {len(uniq)} photo groups "
                                           f"({len(groups)} faces)")
    big = int(np.argmax(counts))
    if counts[big] > len(groups) / k:
        raise PipelineError(source, f"photo group '{uniq[big]}' has {counts[big]} faces, more than a fold "
                                    f"({len(groups)} faces / folds.k={k} = {len(groups) / k:.0f}): check "
                                    "folds.group_regex, or lower folds.k")
    order = np.random.default_rng(seed).permutation(len(uniq))
    order = order[np.argsort(-counts[order], kind="stable")]  # big groups first, ties shuffled
    sizes = np.zeros(k, dtype=np.int64)
    fold_of_group = np.empty(len(uniq), dtype=np.int64)
    for g in order:
        f = int(np.argmin(sizes))
        fold_of_group[g] = f
        sizes[f] += counts[g]
    return fold_of_group[inverse.reshape(-1)]


def group_faces(meta, rule: str, meta_path: str | Path = "meta.csv"):
    """Photo group per face (a pandas Series) from meta.csv's image paths by `rule`
    (folds.group_regex): a face, the other faces of its photo and its mirror share one."""

    if "image" not in meta.columns:
        raise PipelineError(meta_path, "missing column 'image' (rerun `pipeline crop`)")
    rx = re.compile(rule)
    return meta["image"].map(lambda im: photo_group(im, rx)).rename("group")


def run_folds(cfg: Config, cache: str | Path, out_path: str | Path) -> np.ndarray:
    """The `folds` stage: grouped folds of the cache's training faces -> folds.csv."""
    check_output(out_path)
    train_split = Path(cache) / "train"
    meta_path = train_split / "meta.csv"
    meta = read_meta(train_split)
    fcfg = cfg.folds  # folds.train within folds.k: checked when the params were loaded (check_params)
    groups = group_faces(meta, fcfg.group_regex, meta_path)
    fold = make_folds(groups.to_numpy(), fcfg.k, fcfg.seed, source=str(meta_path))
    write_folds(out_path, meta, groups, fold)
    write_resolved(cfg, Path(out_path).parent, ["folds"], name="folds.params.yaml")
    sizes = groups.value_counts()  # logged once written: a failure is the command's only line
    log.info("%d faces in %d photo groups (folds.group_regex); largest: %s with %d faces", len(groups),
             len(sizes), sizes.index[0], sizes.iloc[0])
    log.info("%d faces (%d photo groups) in %d folds of sizes %s -> %s", len(meta), groups.nunique(),
             fcfg.k, np.bincount(fold, minlength=fcfg.k).tolist(), out_path)
    return fold


@click.command("folds")
@click.option("--cache", default=CACHE_DIR, show_default=True, help="face cache (reads train/meta.csv)")
@click.option("--out", "out_path", default=FOLDS_FILE, show_default=True)
@config_options
def folds_cmd(cache, out_path, cfg):
    """Write K grouped train/val folds of the training faces."""
    run_folds(cfg, cache, out_path)
