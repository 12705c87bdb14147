"""Temporal smoothing of keypoints: the One Euro filter (Casiez, Roussel and Vogel, "1 Euro
Filter: A Simple Speed-based Low-pass Filter for Noisy Input in Interactive Systems", CHI
2012), run independently on every coordinate.

An exponential low-pass filter whose cutoff frequency rises with the (low-passed) speed of
the signal: a still face is filtered hard (cutoff `min_cutoff` Hz: little jitter), a fast
one hardly at all (cutoff `min_cutoff + beta * speed`: little lag). `d_cutoff` is the
cutoff of the speed estimate itself.

One change of units against the paper: the speed that raises the cutoff is divided by
`scale` (the face's size in pixels), so `beta` means the same for a face of 50 px and of
500 px; with scale 1 this is the paper's filter."""

from __future__ import annotations

import math

import numpy as np


def smoothing_factor(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
    """alpha of an exponential filter x_hat = alpha * x + (1 - alpha) * x_hat_prev for a
    first-order low-pass of `cutoff` Hz sampled every `dt` s."""
    tau = 1.0 / (2.0 * math.pi * np.asarray(cutoff, dtype=np.float64))
    return 1.0 / (1.0 + tau / dt)


class OneEuroFilter:
    """One Euro filter over an array of any shape (every element its own filter).

    `f(x, t, scale=1.0)` -> the filtered array at time t (seconds, increasing). The first
    call returns x unchanged."""

    def __init__(self, min_cutoff: float = 1.0, beta: float = 0.0, d_cutoff: float = 1.0):
        if min_cutoff <= 0 or d_cutoff <= 0 or beta < 0:
            raise ValueError(f"need min_cutoff > 0, d_cutoff > 0, beta >= 0; got {min_cutoff}, {d_cutoff}, {beta}")
        self.min_cutoff, self.beta, self.d_cutoff = float(min_cutoff), float(beta), float(d_cutoff)
        self.x_hat: np.ndarray | None = None
        self.dx_hat: np.ndarray | None = None
        self.t: float | None = None

    def reset(self) -> None:
        self.x_hat = self.dx_hat = self.t = None

    def __call__(self, x: np.ndarray, t: float, scale: float = 1.0) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.x_hat is None or self.t is None:
            self.x_hat, self.dx_hat, self.t = x.copy(), np.zeros_like(x), float(t)
            return x.copy()
        dt = float(t) - self.t
        if dt <= 0:  # a repeated time stamp: nothing new to filter over
            return self.x_hat.copy()
        dx = (x - self.x_hat) / dt
        a_d = smoothing_factor(self.d_cutoff, dt)
        self.dx_hat = self.dx_hat + a_d * (dx - self.dx_hat)  # = a x + (1 - a) x_hat, exact on constants
        cutoff = self.min_cutoff + self.beta * np.abs(self.dx_hat) / max(float(scale), 1e-9)
        a = smoothing_factor(cutoff, dt)
        self.x_hat = self.x_hat + a * (x - self.x_hat)
        self.t = float(t)
        return self.x_hat.copy()


def local_poly_weights(before: int, after: int, order: int = 2) -> np.ndarray:
    """Weights (before + 1 + after,) that turn the samples at offsets -before..after into the
    value at 0 of their least-squares polynomial of `order` (Savitzky and Golay 1964).
    Centred, it has no lag: a motion that is polynomial of that order over the window passes
    through exactly, and noise is averaged over the window. A one-sided window (a track's
    first and last frames) fits a line instead: a quadratic extrapolated to the window's end
    amplifies noise there rather than removing it."""
    u = np.arange(-before, after + 1, dtype=np.float64)
    order = min(order if before == after else 1, len(u) - 1)
    return np.linalg.pinv(np.vander(u, order + 1, increasing=True))[0]


def local_poly_at(xs: np.ndarray, t: int, half: int, order: int = 2) -> np.ndarray:
    """The centred local-polynomial value of sequence xs (T, ...) at index t, over
    t - half .. t + half (clipped to the sequence)."""
    lo, hi = max(0, t - half), min(len(xs), t + half + 1)
    return np.tensordot(local_poly_weights(t - lo, hi - 1 - t, order), np.asarray(xs[lo:hi], dtype=np.float64), axes=1)


def smooth_sequence(xs: np.ndarray, fps: float, min_cutoff: float, beta: float, d_cutoff: float,
                    scales: np.ndarray | None = None) -> np.ndarray:
    """One Euro over a whole sequence (T, ...) sampled at `fps` (scales: (T,) or None)."""
    f = OneEuroFilter(min_cutoff, beta, d_cutoff)
    xs = np.asarray(xs, dtype=np.float64)
    return np.stack([f(x, i / fps, 1.0 if scales is None else float(scales[i])) for i, x in enumerate(xs)])


def fit_similarity(src: np.ndarray, dst: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Least-squares similarity dst ~ s R(angle) src + T (Umeyama 1991) of (K, 2) point sets:
    (log s, angle in radians, T (2,))."""
    ms, md = src.mean(axis=0), dst.mean(axis=0)
    a, b = src - ms, dst - md
    var = max(float((a ** 2).sum()), 1e-12)
    dot = float((a * b).sum())
    cross = float((a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]).sum())
    angle = math.atan2(cross, dot)
    s = math.hypot(dot, cross) / var
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    return math.log(max(s, 1e-12)), angle, md - s * ms @ rot.T


def apply_similarity(points: np.ndarray, log_s: float, angle: float, t: np.ndarray) -> np.ndarray:
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    return math.exp(log_s) * points @ rot.T + t


class PoseShapeFilter:
    """Keypoints (K, 2) smoothed in two parts, so that head motion does not count as jitter:
    the face's pose (the similarity transform from the track's first keypoints to this
    frame's: position, log scale, roll) through one One Euro filter, and the shape in that
    face-aligned frame (the keypoints mapped back through the pose) through another.

    A head that moves or turns moves the pose, whose noise is averaged over every keypoint
    (about 1 / sqrt(K) of one point's), so it can follow fast at little jitter; the
    aligned shape changes only with expression and holds most of the per-point noise, so it
    is smoothed harder. Both use `scale`, the face's size, as the One Euro speed unit; the
    pose's position and the shape are in face sizes (so the params do not depend on the
    face's size in pixels), its log scale and roll are unitless.

    `f(x, t, scale)` -> smoothed (K, 2); the first call returns x unchanged."""

    def __init__(self, pose: tuple[float, float, float], shape: tuple[float, float, float]):
        self.pose_filter = OneEuroFilter(*pose)
        self.shape_filter = OneEuroFilter(*shape)
        self.reference: np.ndarray | None = None
        self.size = 1.0

    def __call__(self, x: np.ndarray, t: float, scale: float = 1.0) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.reference is None:  # the first frame's shape, in face sizes; its size the unit of position
            self.size = max(float(scale), 1e-9)
            self.reference = (x - x.mean(axis=0)) / self.size
        size = self.size
        log_s, angle, shift = fit_similarity(self.reference, x)
        aligned = apply_similarity(x - shift, 0.0, -angle, np.zeros(2)) / math.exp(log_s)  # back in the reference frame
        pose = self.pose_filter(np.array([shift[0] / size, shift[1] / size, log_s, angle]), t, 1.0)
        shape = self.shape_filter(aligned, t, 1.0)
        return apply_similarity(shape, pose[2], pose[3], pose[:2] * size)
