"""The scores, one implementation for training, evaluation and benchmarks.

- MAE: mean absolute error over every coordinate, in original pixels (the competition
  metric).
- NME: per face, the mean point-to-point Euclidean error divided by the distance between
  the truth's outer eye corners (schema.eyes), averaged over faces; a fraction (x100 = %).
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from pipeline.core.errors import PipelineError


def mae(pred, truth) -> float:
    """Mean absolute error over all coordinates (pixels)."""
    p, t = np.asarray(pred, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    if p.shape != t.shape:
        raise ValueError(f"mae: shapes differ {p.shape} vs {t.shape}")
    if p.size == 0:
        raise ValueError("mae: empty arrays")
    return float(np.mean(np.abs(p - t)))


def _point_errors(pred, truth, eyes: tuple[int, int] | Sequence[int] | None,
                  where: str | os.PathLike | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(err (N, K) point-to-point errors, iod (N,) the truth's inter-ocular distances, ok (N,)
    the faces with one) after `nme`'s checks; None when `nme` is None."""
    if eyes is None:
        return None
    p, t = np.asarray(pred, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    if p.shape != t.shape or p.ndim != 3 or p.shape[2] != 2:
        raise ValueError(f"nme: need two (N, K, 2) arrays, got {p.shape} and {t.shape}")
    e0, e1 = int(eyes[0]), int(eyes[1])
    k = t.shape[1]
    if not (0 <= e0 < k and 0 <= e1 < k):
        return None
    if e0 == e1:
        raise PipelineError(where, f"NME is undefined: its eye points are one point ({e0}), whose distance "
                                   "is 0 (the schema's eyes must be two different keypoints)")
    iod = np.linalg.norm(t[:, e0] - t[:, e1], axis=-1)
    ok = iod > 0
    if not ok.any():
        raise PipelineError(where, f"NME is undefined: eye points {e0} and {e1} coincide in the truth of "
                                   f"every face ({len(t)}): inter-ocular distance 0")
    return np.linalg.norm(p - t, axis=-1), iod, ok


def nme(pred, truth, eyes: tuple[int, int] | Sequence[int] | None = (36, 45),
        where: str | os.PathLike | None = None) -> float | None:
    """Mean over faces of mean point error / inter-ocular distance of the truth.

    pred, truth: (N, K, 2). Returns a fraction, or None when `eyes` is None or out of
    range for K. Faces whose truth eye corners coincide (distance 0) are left out; when that
    is every face (or `eyes` names one point twice) the NME is undefined: a PipelineError
    naming `where` (the truth's file)."""
    terms = _point_errors(pred, truth, eyes, where)
    if terms is None:
        return None
    err, iod, ok = terms
    return float(np.mean(err.mean(axis=1)[ok] / iod[ok]))


def region_nme(pred, truth, regions: Mapping[str, Sequence[int]],
               eyes: tuple[int, int] | Sequence[int] | None = (36, 45),
               where: str | os.PathLike | None = None) -> dict[str, float] | None:
    """NME of each region's points (schema.regions(): jaw, brows, ...): per face the mean
    point error over the region / the truth's inter-ocular distance, averaged over faces,
    as `nme` does for all points (the faces `nme` leaves out are left out here too). None
    when `nme` is undefined for these points (no eyes)."""
    terms = _point_errors(pred, truth, eyes, where)
    if terms is None:
        return None
    err, iod, ok = terms
    per_point = err[ok] / iod[ok, None]  # (faces, K)
    return {name: float(per_point[:, list(idx)].mean()) for name, idx in regions.items() if len(idx)}


def per_face_mae(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(N,) mean absolute coordinate error per face (`mae` per face); NaN when unpredicted."""
    return np.abs(np.asarray(pred, np.float64) - np.asarray(truth, np.float64)).mean(axis=(1, 2))
