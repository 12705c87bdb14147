"""The keypoint table of a video (written by `pipeline predict-video --csv`, and as the truth
of `pipeline make-test-video`): one row per frame and face,

    frame,time,face,score,x0,y0,x1,y1,...,x67,y67

frame: 0-based frame index; time: seconds since the first frame (the frame's time stamp:
uneven on a variable frame rate clip); face: the track id (stable while the face is tracked,
never reused); score: the face-presence score of the model (pipeline/inference/presence.py;
empty for a model without heatmaps; the truth table has no score column); x/y: keypoints in
frame pixels (pixel centres at integers). Rows are sorted by frame, then face."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file, read_csv_rows, write_csv

FIXED = ("frame", "time", "face")
SCORE = "score"


def header(k: int, scores: bool = False) -> list[str]:
    return [*FIXED, *([SCORE] if scores else []), *[f"{c}{i}" for i in range(k) for c in ("x", "y")]]


def score_value(v: Any) -> float | None:
    """A face-presence score for the files (this table, and pipeline/formats/photo_keypoints.py's
    CSV and JSON): rounded to 4 decimals; None (an empty CSV cell, JSON null) when there is
    none (None, NaN)."""
    return None if v is None or not np.isfinite(float(v)) else round(float(v), 4)


def score_cell(v: Any) -> str:
    """`score_value` as a CSV cell: 4 decimals, empty when there is none."""
    score = score_value(v)
    return "" if score is None else f"{score:.4f}"


def write_video_csv(path: str | os.PathLike, frames: np.ndarray, times: np.ndarray, faces: np.ndarray,
                    points: np.ndarray, scores: np.ndarray | None = None) -> Path:
    """Rows (frame[i], times[i], faces[i], scores[i], points[i] (K, 2)), written atomically;
    without `scores` (the truth table), no score column."""
    points = np.asarray(points, dtype=np.float64)
    points = points if points.ndim == 3 else points.reshape(len(frames), -1, 2)
    extra = [[]] * len(frames) if scores is None else [[score_cell(v)] for v in np.asarray(scores, dtype=np.float64)]
    rows = [[int(f), f"{float(t):.4f}", int(face), *e, *[f"{v:.3f}" for v in p.reshape(-1)]]
            for f, t, face, e, p in zip(frames, times, faces, extra, points)]
    return write_csv(path, [header(points.shape[1], scores is not None), *rows])


def read_video_csv(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """{"frame": (N,), "time": (N,), "face": (N,), "score": (N,) (NaN where empty or without
    the column), "points": (N, K, 2)}."""
    path = input_file(path, "keypoint CSV not found", "a keypoint CSV file")
    rows = read_csv_rows(path)
    scores = bool(rows) and len(rows[0]) > 3 and rows[0][3] == SCORE
    fixed = 3 + scores
    if not rows or tuple(rows[0][:3]) != FIXED or (len(rows[0]) - fixed) % 2:
        raise PipelineError(path, f"not a video keypoint CSV (header must start {','.join(FIXED)}[,{SCORE}],x0,y0,...)")
    k = (len(rows[0]) - fixed) // 2
    if rows[0] != header(k, scores):
        raise PipelineError(path, "unexpected column names")
    try:
        data = np.array([[np.nan if scores and i == 3 and v == "" else float(v) for i, v in enumerate(r)] for r in rows[1:]],
                        dtype=np.float64).reshape(-1, fixed + 2 * k)
    except ValueError as e:
        raise PipelineError(path, f"bad row ({e})") from None
    return {"frame": data[:, 0].astype(np.int64), "time": data[:, 1], "face": data[:, 2].astype(np.int64),
            "score": data[:, 3] if scores else np.full(len(data), np.nan), "points": data[:, fixed:].reshape(-1, k, 2)}
