"""The predictions format (`pipeline predict` -> `predictions/`): one writer and one reader
of each file.

- `test.npz`: `ensemble` (N, K, 2) original px, what submit writes; `ensemble_raw` the
  fold mean before OOF calibration; `per_fold` (F, N, K, 2); `folds` (F,); `bias` (K, 2);
  `calibrated` () bool.
- `oof.npz`: `tta`, `plain` (N, K, 2) out-of-fold predictions of the training faces
  (NaN where a fold was not trained); `fold` (N,).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_path

OOF_KEYS = ("tta", "plain", "fold")


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # np.savez to an open file: given a path it appends '.npz' to the temp name ('.npz.tmp'),
    # writes there, and the empty temp would be renamed onto the output
    with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def write_test_predictions(path: str | os.PathLike, *, ensemble: np.ndarray, ensemble_raw: np.ndarray,
                           per_fold: np.ndarray, folds: Sequence[int], bias: np.ndarray, calibrated: bool) -> None:
    _write_npz(Path(path), {"ensemble": ensemble, "ensemble_raw": ensemble_raw, "per_fold": per_fold,
                            "folds": np.asarray(folds), "bias": bias, "calibrated": np.array(calibrated)})


def write_oof_predictions(path: str | os.PathLike, *, tta: np.ndarray, plain: np.ndarray, fold: np.ndarray) -> None:
    _write_npz(Path(path), {"tta": tta, "plain": plain, "fold": fold})


def read_predictions(path: str | os.PathLike, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Arrays `keys` of a predictions file (test.npz or oof.npz)."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(path, "predictions not found (run `pipeline predict` first)")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise PipelineError(path, f"missing array(s) {', '.join(missing)} (has {sorted(z.files)})")
            return {k: np.asarray(z[k]) for k in keys}
    except PipelineError:
        raise
    except Exception as e:  # zipfile.BadZipFile, ValueError, OSError
        raise PipelineError(path, f"not a readable .npz file ({type(e).__name__})") from None
