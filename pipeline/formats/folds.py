"""The folds file (`pipeline folds` -> `folds/folds.csv`): columns `index, face_id, group,
fold`, one row per training face in cache order. One writer, one reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.errors import PipelineError
from pipeline.core.io import write_text

COLUMNS = ["index", "face_id", "group", "fold"]


def write_folds(path: str | Path, meta, groups, fold: np.ndarray) -> None:
    """One row per face of the cache's `meta` (cache order): its photo group and fold."""
    df = pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": groups, "fold": fold},
                      columns=COLUMNS)
    write_text(path, df.to_csv(index=False))


def read_folds(folds_path: str | Path, meta=None, cache_path: str | Path = "the cache") -> np.ndarray:
    """Fold per face (int64, cache order) from folds.csv, which must list exactly the
    faces of the cache's `meta` in the cache's order (rows shuffled, missing or from
    another crop are refused: train and predict would split the wrong faces). Without
    `meta` only the file itself is checked."""
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
    if meta is not None:
        _check_rows(folds_path, df["face_id"].to_numpy(), meta["face_id"].astype(str).to_numpy(), cache_path)
    fold = pd.to_numeric(df["fold"], errors="coerce").to_numpy()
    # below the row count: fold numbers size loops and arrays downstream (a fold per face at most)
    if np.isnan(fold).any() or (fold < 0).any() or (fold != np.round(fold)).any() or (fold >= len(df)).any():
        raise PipelineError(folds_path, f"column 'fold' must hold integers in 0..{len(df) - 1} (one per row)")
    return fold.astype(np.int64)


def _check_rows(folds_path: Path, ids: np.ndarray, want: np.ndarray, cache_path) -> None:
    if len(ids) != len(want):
        raise PipelineError(folds_path, f"has {len(ids)} rows but {cache_path} has {len(want)} faces; "
                                        "rerun `pipeline folds`")
    bad = np.flatnonzero(ids != want)
    if len(bad):
        i = int(bad[0])
        raise PipelineError(folds_path, f"rows do not match the faces of {cache_path} (row {i}: '{ids[i]}', cache: "
                                        f"'{want[i]}'); rerun `pipeline folds`")
