"""The predictions format (`pipeline predict` -> `predictions/`): one writer and one reader
of each file.

- `test.npz`: `ensemble` (N, K, 2) original px, what submit writes; `ensemble_raw` the
  fold mean before OOF calibration; `per_fold` (F, N, K, 2); `folds` (F,); `bias` (K, 2);
  `calibrated` () bool; `oof_kind` () str: the oof.npz array made the way `ensemble` was
  (`tta`, or `plain` when predict.tta is none); `face_id` (N,) str, the test cache's faces;
  what made it, where `pipeline predict` wrote it (not `pipeline blend`): `checkpoint_identity`
  (F,) str, each fold checkpoint's `checkpoint_identity` (the sha256 of its weights and
  geometry), `runtime` (F,) str, how each ran (`predictor.model_runtime`: 'torch fp32', or
  'onnx int8 <sha256>' for an exported twin), and `predict_params` () str, the predict section
  as JSON (so `submit --xml` knows which models, run how, and params its bias is for).
- `oof.npz`: `tta`, `plain` (N, K, 2) out-of-fold predictions of the training faces
  (NaN where a fold was not trained); `fold` (N,); `face_id` (N,) str, the training cache's
  faces.
- both: `keypoint_names` (K,) str, the schema's.

`pipeline blend` checks its inputs' `face_id` and `keypoint_names` against the cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_path

OOF_KEYS = ("tta", "plain", "fold")
# which faces and keypoints the arrays hold, in both files
ID_KEYS = ("face_id", "keypoint_names")


def _text(values: Sequence[str] | np.ndarray) -> np.ndarray:
    # fixed-width unicode, not object: np.load(allow_pickle=False) reads it back
    return np.asarray([str(v) for v in values], dtype=str)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # np.savez to an open file: given a path it appends '.npz' to the temp name ('.npz.tmp'),
    # writes there, and the empty temp would be renamed onto the output
    with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stubs read ** as allow_pickle


def write_test_predictions(path: str | os.PathLike, *, ensemble: np.ndarray, ensemble_raw: np.ndarray,
                           per_fold: np.ndarray, folds: Sequence[int] | np.ndarray, bias: np.ndarray, calibrated: bool,
                           oof_kind: str, face_id: Sequence[str] | np.ndarray, keypoint_names: Sequence[str],
                           checkpoint_identity: Sequence[str] | None = None, runtime: Sequence[str] | None = None,
                           predict_params: dict[str, Any] | None = None) -> None:
    """`checkpoint_identity` with `runtime` (one each per fold, in `folds` order) and
    `predict_params` name what made the predictions; a blend, made of several runs, gives none."""
    if oof_kind not in ("tta", "plain"):
        raise ValueError(f"oof_kind must be tta or plain, got {oof_kind!r}")
    made = {}
    if checkpoint_identity is not None or runtime is not None:
        if checkpoint_identity is None or runtime is None or not len(checkpoint_identity) == len(runtime) == len(folds):
            raise ValueError("checkpoint_identity and runtime need one entry each per fold")
        made = {"checkpoint_identity": _text(checkpoint_identity), "runtime": _text(runtime)}
    if predict_params is not None:
        made["predict_params"] = np.array(json.dumps(predict_params, sort_keys=True))
    _write_npz(Path(path), {"ensemble": ensemble, "ensemble_raw": ensemble_raw, "per_fold": per_fold,
                            "folds": np.asarray(folds), "bias": bias, "calibrated": np.array(calibrated),
                            "oof_kind": np.array(oof_kind), "face_id": _text(face_id),
                            "keypoint_names": _text(keypoint_names), **made})


def write_oof_predictions(path: str | os.PathLike, *, tta: np.ndarray, plain: np.ndarray, fold: np.ndarray,
                          face_id: Sequence[str] | np.ndarray, keypoint_names: Sequence[str]) -> None:
    _write_npz(Path(path), {"tta": tta, "plain": plain, "fold": fold, "face_id": _text(face_id),
                            "keypoint_names": _text(keypoint_names)})


def read_predictions(path: str | os.PathLike, keys: Sequence[str],
                     optional: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Arrays `keys` of a predictions file (test.npz or oof.npz), and those of `optional`
    that it holds."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(path, "predictions not found (run `pipeline predict` first)")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise PipelineError(path, f"missing array(s) {', '.join(missing)} (has {sorted(z.files)})")
            return {k: np.asarray(z[k]) for k in (*keys, *(k for k in optional if k in z.files))}
    except PipelineError:
        raise
    except Exception as e:  # zipfile.BadZipFile, ValueError, OSError
        raise PipelineError(path, f"not a readable .npz file ({type(e).__name__})") from None
