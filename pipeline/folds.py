"""Grouped K folds: faces of one photo never sit on both sides of a split.

`pipeline folds` reads `<cache>/train/meta.csv` (cache order) and writes `folds/folds.csv`
with columns `index, face_id, group, fold`, one row per training face."""

from __future__ import annotations

import logging
from pathlib import Path

import click
import numpy as np

from pipeline.cli import config_options
from pipeline.config import params_source
from pipeline.errors import PipelineError

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


def read_meta(meta_path: str | Path):
    """The cache's meta.csv with face_id / group as strings."""
    import pandas as pd

    meta_path = Path(meta_path)
    if not meta_path.exists():
        raise PipelineError(meta_path, "not found (run `pipeline crop` first)")
    try:
        meta = pd.read_csv(meta_path, dtype={"face_id": str, "group": str, "image": str}, keep_default_na=False)
    except Exception as e:
        raise PipelineError(meta_path, f"unreadable CSV ({type(e).__name__})") from None
    missing = [c for c in ("index", "face_id", "group") if c not in meta.columns]
    if missing:
        raise PipelineError(meta_path, f"missing column(s) {missing}")
    return meta


def group_faces(meta, rule: str, meta_path: str | Path = "meta.csv"):
    """Photo group per face (a pandas Series) from meta.csv's image paths by `rule`
    (folds.group_regex): a face, the other faces of its photo and its mirror share one."""
    import re

    from pipeline.dataset import photo_group

    if "image" not in meta.columns:
        raise PipelineError(meta_path, "missing column 'image' (rerun `pipeline crop`)")
    rx = re.compile(rule)
    return meta["image"].map(lambda im: photo_group(im, rx)).rename("group")


def read_folds(folds_path: str | Path, meta, cache_path: str | Path = "the cache") -> np.ndarray:
    """Fold per face (int64, cache order) from folds.csv, which must list exactly the
    cache's faces in the cache's order (rows shuffled, missing or from another crop are
    refused: train and predict would split the wrong faces)."""
    import pandas as pd

    folds_path = Path(folds_path)
    if not folds_path.exists():
        raise PipelineError(folds_path, "not found (run `pipeline folds` first)")
    try:
        df = pd.read_csv(folds_path, dtype={"face_id": str}, keep_default_na=False)
    except Exception as e:
        raise PipelineError(folds_path, f"unreadable CSV ({type(e).__name__})") from None
    missing = [c for c in ("face_id", "fold") if c not in df.columns]
    if missing:
        raise PipelineError(folds_path, f"missing column(s) {missing}")
    if len(df) != len(meta):
        raise PipelineError(folds_path, f"has {len(df)} rows but {cache_path} has {len(meta)} faces; "
                                        "rerun `pipeline folds`")
    ids, want = df["face_id"].to_numpy(), meta["face_id"].astype(str).to_numpy()
    bad = np.flatnonzero(ids != want)
    if len(bad):
        i = int(bad[0])
        raise PipelineError(folds_path, f"rows do not match the faces of {cache_path} (row {i}: '{ids[i]}', cache: "
                                        f"'{want[i]}'); rerun `pipeline folds`")
    fold = pd.to_numeric(df["fold"], errors="coerce").to_numpy()
    if np.isnan(fold).any() or (fold < 0).any() or (fold != np.round(fold)).any():
        raise PipelineError(folds_path, "column 'fold' must hold integers >= 0")
    return fold.astype(np.int64)


@click.command("folds")
@click.option("--cache", default="data/cache", show_default=True, help="face cache (reads train/meta.csv)")
@click.option("--out", "out_path", default="folds/folds.csv", show_default=True)
@config_options
def folds_cmd(cache, out_path, cfg):
    """Write K grouped train/val folds of the training faces."""
    import pandas as pd

    from pipeline.config import write_resolved
    from pipeline.io import write_text

    meta_path = Path(cache) / "train" / "meta.csv"
    meta = read_meta(meta_path)
    fcfg = cfg["folds"]
    bad = [f for f in fcfg["train"] if not (isinstance(f, int) and 0 <= f < fcfg["k"])]
    if bad:
        raise PipelineError(params_source("folds.train", "folds.k"),
                            f"folds.train has {bad}, folds are 0..{fcfg['k'] - 1}")
    groups = group_faces(meta, fcfg["group_regex"], meta_path)
    sizes = groups.value_counts()
    log.info("%d faces in %d photo groups (folds.group_regex); largest: %s with %d faces", len(groups),
             len(sizes), sizes.index[0], sizes.iloc[0])
    fold = make_folds(groups.to_numpy(), fcfg["k"], fcfg["seed"], source=str(meta_path))
    df = pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": groups, "fold": fold})
    write_text(out_path, df.to_csv(index=False))
    write_resolved(cfg, Path(out_path).parent, ["folds"], name="folds.params.yaml")
    log.info("%d faces (%d photo groups) in %d folds of sizes %s -> %s", len(df), df["group"].nunique(),
             fcfg["k"], np.bincount(fold, minlength=fcfg["k"]).tolist(), out_path)
