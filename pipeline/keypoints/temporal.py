"""Measures of keypoints over time that need no ground truth, for real footage: jitter (the
second difference, which a smooth motion hardly has and frame-to-frame noise has in full),
the lag of a smoothed sequence behind the raw one (its distance from it, and its signed
offset along the direction of motion, which the removed noise does not inflate), and per-track bookkeeping (tracks, id
switches, frames with more faces than expected). Every distance is in outer-eye-corner
distances of the raw keypoints, so a clip's figures do not depend on the face's size.

Rows are (frame, face id, points (K, 2)) in frame order, as `pipeline.tools.video.track_video`
returns them."""

from __future__ import annotations

import numpy as np


def _eye_distance(points: np.ndarray, eyes: tuple[int, int]) -> np.ndarray:
    """(N, K, 2) -> (N,) outer-eye-corner distance (at least 1e-9)."""
    return np.maximum(np.linalg.norm(points[:, eyes[0]] - points[:, eyes[1]], axis=-1), 1e-9)


def track_runs(frame: np.ndarray, face: np.ndarray) -> list[np.ndarray]:
    """Row indices of each run of consecutive frames of one face id, in frame order."""
    runs: list[np.ndarray] = []
    for fid in np.unique(face):
        rows = np.flatnonzero(face == fid)
        breaks = np.flatnonzero(np.diff(frame[rows]) != 1) + 1
        runs.extend(r for r in np.split(rows, breaks) if len(r))
    return runs


def second_difference_jitter(frame: np.ndarray, face: np.ndarray, points: np.ndarray, raw: np.ndarray,
                             eyes: tuple[int, int] = (36, 45)) -> float:
    """Mean over every three consecutive frames of one track and over the keypoints of
    |p[t+1] - 2 p[t] + p[t-1]|, in raw eye distances at t (nan without three such frames)."""
    vals = []
    for rows in track_runs(frame, face):
        if len(rows) < 3:
            continue
        p = points[rows]
        d2 = np.linalg.norm(p[2:] - 2 * p[1:-1] + p[:-2], axis=-1).mean(axis=1)  # (n - 2,)
        vals.append(d2 / _eye_distance(raw[rows][1:-1], eyes))
    return float(np.concatenate(vals).mean()) if vals else float("nan")


def lag(frame: np.ndarray, face: np.ndarray, smoothed: np.ndarray, raw: np.ndarray,
        eyes: tuple[int, int] = (36, 45), max_delay: int = 10) -> dict[str, float]:
    """How far the smoothed keypoints sit from the raw ones: `offset`, the mean point distance
    smoothed[t] - raw[t] in raw eye distances, and `delay`, the shift d in frames (0 ..
    max_delay) that minimises the mean distance smoothed[t] - raw[t - d] (0: no lag)."""
    runs = [r for r in track_runs(frame, face) if len(r)]
    if not runs:
        return {"offset": float("nan"), "delay": float("nan")}
    eye = np.concatenate([_eye_distance(raw[r], eyes) for r in runs])
    off = np.concatenate([np.linalg.norm(smoothed[r] - raw[r], axis=-1).mean(axis=1) for r in runs]) / eye
    cost = []
    for d in range(max_delay + 1):
        parts = [np.linalg.norm(smoothed[r][d:] - raw[r][:len(r) - d], axis=-1).mean(axis=1)
                 / _eye_distance(raw[r][d:], eyes) for r in runs if len(r) > d]
        cost.append(float(np.concatenate(parts).mean()) if parts else float("inf"))
    return {"offset": float(off.mean()), "delay": float(np.argmin(cost))}


def lag_along_motion(frame: np.ndarray, face: np.ndarray, smoothed: np.ndarray, raw: np.ndarray,
                     eyes: tuple[int, int] = (36, 45), baseline: int = 5) -> float:
    """Systematic lag: the mean over frames and keypoints of (smoothed[t] - raw[t]) projected
    on the unit direction of the smoothed keypoint's motion, smoothed[t + b] - smoothed[t - b]
    (b = `baseline` frames, within one track run), in raw eye distances, signed: negative =
    behind the motion (a causal filter on a steady motion v lags by v x its delay), positive
    = ahead, ~0 for a zero-phase filter (nan without such frames).

    Why this and not `lag`'s offset: |smoothed - raw| is mostly the noise the filter removes,
    so it grows with the raw jitter whatever the filter's phase. Noise removed is as likely to
    point along the motion as against it, so projected and signed it averages out, while a
    lag keeps one sign. Exactly so for a symmetric (centred) filter: its noise terms in the
    offset and in the direction are uncorrelated. A causal filter's direction carries some of
    the noise it lags behind, so on pure noise it reads slightly negative; the baseline of
    +-b frames keeps that small (white noise through an exponential filter of alpha 0.5, b 5:
    -0.04 noise sigmas against a mean |smoothed - raw| of 0.72), and it is a lag of that filter
    too."""
    vals = []
    b = max(1, int(baseline))
    for rows in track_runs(frame, face):
        if len(rows) < 2 * b + 1:
            continue
        s, r = smoothed[rows], raw[rows]
        v = s[2 * b:] - s[:-2 * b]  # (n - 2b, K, 2) motion over +-b frames
        speed = np.linalg.norm(v, axis=-1)  # (n - 2b, K)
        moving = speed > 1e-12
        along = ((s[b:-b] - r[b:-b]) * v).sum(axis=-1) / np.where(moving, speed, 1.0)  # (n - 2b, K) px
        eye = _eye_distance(r[b:-b], eyes)[:, None]
        vals.append((along / eye)[moving])
    vals = [v for v in vals if len(v)]
    return float(np.concatenate(vals).mean()) if vals else float("nan")


def track_summary(frame: np.ndarray, face: np.ndarray, n_frames: int, expected_faces: int = 0) -> dict[str, int]:
    """`tracks`: face ids seen; `id_switches`: frames whose oldest face id differs from the
    previous frame's (both with a face: the face was handed a new id); `extra_face_frames`: frames with
    more faces than `expected_faces` (0: the median count over frames with a face)."""
    counts = np.bincount(frame, minlength=n_frames) if len(frame) else np.zeros(n_frames, dtype=np.int64)
    if expected_faces <= 0:
        seen = counts[counts > 0]
        expected_faces = int(np.median(seen)) if len(seen) else 0
    first: dict[int, int] = {}
    for f, fid in zip(frame.tolist(), face.tolist()):
        first[f] = min(first.get(f, fid), fid)
    switches = sum(1 for f in first if f - 1 in first and first[f] != first[f - 1])
    return {"tracks": len(np.unique(face)), "id_switches": switches,
            "extra_face_frames": int((counts > expected_faces).sum()), "expected_faces": int(expected_faces)}


def per_second_rate(frame_seconds: np.ndarray, fps: float) -> dict[str, float]:
    """Frames/s over each whole second of the clip (frame_seconds: (T,) time spent on each
    frame): the median over seconds, the slowest second (its index and rate) and their ratio."""
    per = max(1, round(fps))
    n = len(frame_seconds) // per
    if n == 0:
        rate = len(frame_seconds) / max(float(np.sum(frame_seconds)), 1e-9)
        return {"median": rate, "slowest": rate, "slowest_second": 0, "ratio": 1.0}
    rates = per / np.maximum(np.asarray(frame_seconds[:n * per]).reshape(n, per).sum(axis=1), 1e-9)
    med, k = float(np.median(rates)), int(np.argmin(rates))
    return {"median": med, "slowest": float(rates[k]), "slowest_second": k, "ratio": float(rates[k] / med)}
