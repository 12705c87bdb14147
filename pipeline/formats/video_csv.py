"""The keypoint table of a video (written by `pipeline predict-video --csv`, and as the truth
of `pipeline make-test-video`): one row per frame and face,

    frame,time,face,x0,y0,x1,y1,...,x67,y67

frame: 0-based frame index; time: seconds since the first frame (the frame's time stamp:
uneven on a variable frame rate clip); face: the track id (stable while the face is tracked,
never reused); x/y: keypoints in frame pixels (pixel centres at integers). Rows are sorted by
frame, then face."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file, read_csv_rows, write_csv

FIXED = ("frame", "time", "face")


def header(k: int) -> list[str]:
    return [*FIXED, *[f"{c}{i}" for i in range(k) for c in ("x", "y")]]


def write_video_csv(path: str | os.PathLike, frames: np.ndarray, times: np.ndarray, faces: np.ndarray,
                    points: np.ndarray) -> Path:
    """Rows (frame[i], times[i], faces[i], points[i] (K, 2)), written atomically."""
    points = np.asarray(points, dtype=np.float64).reshape(len(frames), -1, 2)
    rows = [[int(f), f"{float(t):.4f}", int(face), *[f"{v:.3f}" for v in p.reshape(-1)]]
            for f, t, face, p in zip(frames, times, faces, points)]
    return write_csv(path, [header(points.shape[1]), *rows])


def read_video_csv(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """{"frame": (N,), "time": (N,), "face": (N,), "points": (N, K, 2)}."""
    path = input_file(path, "keypoint CSV not found", "a keypoint CSV file")
    rows = read_csv_rows(path)
    if not rows or tuple(rows[0][:3]) != FIXED or (len(rows[0]) - 3) % 2:
        raise PipelineError(path, f"not a video keypoint CSV (header must start {','.join(FIXED)},x0,y0,...)")
    k = (len(rows[0]) - 3) // 2
    if rows[0] != header(k):
        raise PipelineError(path, "unexpected column names")
    try:
        data = np.array([[float(v) for v in r] for r in rows[1:]], dtype=np.float64).reshape(-1, 3 + 2 * k)
    except ValueError as e:
        raise PipelineError(path, f"bad row ({e})") from None
    return {"frame": data[:, 0].astype(np.int64), "time": data[:, 1], "face": data[:, 2].astype(np.int64),
            "points": data[:, 3:].reshape(-1, k, 2)}
