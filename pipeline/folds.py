"""Grouped K folds: faces of one photo never sit on both sides of a split."""

from __future__ import annotations

import logging
from pathlib import Path

import click
import numpy as np

from pipeline.cli import config_options
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


def make_folds(groups, k: int, seed: int) -> np.ndarray:
    """Fold per face. Groups are shuffled (by seed), then placed largest first into the
    currently smallest fold, so folds stay balanced even with multi-face photos."""
    groups = np.asarray(groups)
    uniq, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if k < 2:
        raise PipelineError("params.yaml", f"folds.k must be >= 2, got {k}")
    if k > len(uniq):
        raise PipelineError("params.yaml", f"folds.k = {k} but there are only {len(uniq)} photos")
    order = np.random.default_rng(seed).permutation(len(uniq))
    order = order[np.argsort(-counts[order], kind="stable")]  # big groups first, ties shuffled
    sizes = np.zeros(k, dtype=np.int64)
    fold_of_group = np.empty(len(uniq), dtype=np.int64)
    for g in order:
        f = int(np.argmin(sizes))
        fold_of_group[g] = f
        sizes[f] += counts[g]
    return fold_of_group[inverse]


@click.command("folds")
@click.option("--cache", default="data/cache", show_default=True)
@click.option("--out", "out_path", default="folds/folds.csv", show_default=True)
@config_options
def folds_cmd(cache, out_path, cfg):
    """Write K grouped train/val folds of the training faces."""
    import pandas as pd

    from pipeline.config import write_resolved
    from pipeline.io import atomic_path

    meta_path = Path(cache) / "train" / "meta.csv"
    if not meta_path.exists():
        raise PipelineError(meta_path, "not found (run `pipeline crop` first)")
    meta = pd.read_csv(meta_path)
    fcfg = cfg["folds"]
    bad = [f for f in fcfg["train"] if not 0 <= f < fcfg["k"]]
    if bad:
        raise PipelineError("params.yaml", f"folds.train has {bad}, folds are 0..{fcfg['k'] - 1}")
    fold = make_folds(meta["group"].to_numpy(), fcfg["k"], fcfg["seed"])
    df = pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": meta["group"], "fold": fold})
    with atomic_path(out_path, suffix=".csv") as tmp:
        df.to_csv(tmp, index=False)
    write_resolved(cfg, Path(out_path).parent, ["folds"], name="folds.params.yaml")
    log.info("%d faces in %d folds of sizes %s -> %s", len(df), fcfg["k"],
             np.bincount(fold, minlength=fcfg["k"]).tolist(), out_path)
