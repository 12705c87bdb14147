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


# Frame times are often stored rounded to the millisecond, and at 29.97 fps the third frame
# lies 0.1 ms beyond 0.1 s: a frame this close past the window's edge counts as inside it.
WINDOW_TOLERANCE_S = 1e-3


def local_poly_fit_weights(offsets: np.ndarray, order: int = 2) -> np.ndarray:
    """Weights (n,) that turn samples at `offsets` (n,) (any unit, 0 = where the value is
    wanted) into the value at 0 of their least-squares polynomial of `order` (Savitzky and
    Golay 1964 on a regular grid). An asymmetric window (a track's first and last frames)
    fits the same order: the fit is then as unbiased as in the middle (a quadratic motion
    passes through exactly), and the value of a least-squares fit at one of its own samples
    never amplifies the noise (the weights' sum of squares is at most 1), it only removes
    less of it. Too few distinct offsets for `order`: the highest order they determine."""
    u = np.asarray(offsets, dtype=np.float64)
    order = min(order, len(np.unique(u)) - 1)
    return np.linalg.pinv(np.vander(u, order + 1, increasing=True))[0]


def in_window(times: np.ndarray, t: float, half_s: float) -> np.ndarray:
    """Mask of the `times` within +-half_s of t (WINDOW_TOLERANCE_S included)."""
    return np.abs(np.asarray(times, dtype=np.float64) - t) <= half_s + WINDOW_TOLERANCE_S


def local_poly_in_time(xs: np.ndarray, times: np.ndarray, i: int, half_s: float, order: int = 2) -> np.ndarray:
    """The local-polynomial value of sequence xs (T, ...) sampled at `times` (T,) (seconds) at
    times[i]: the polynomial is fitted in time over the samples within +-half_s of it, so a
    variable frame rate is smoothed as its time stamps say. half_s 0: xs[i] itself."""
    if half_s <= 0:
        return np.asarray(xs[i], dtype=np.float64).copy()
    times = np.asarray(times, dtype=np.float64)
    near = in_window(times, times[i], half_s)
    # offsets in half windows: the Vandermonde matrix stays well conditioned at any fps
    w = local_poly_fit_weights((times[near] - times[i]) / half_s, order)
    return np.tensordot(w, np.asarray(xs, dtype=np.float64)[near], axes=1)


def window_counts(times: np.ndarray, half_s: float) -> np.ndarray:
    """How many of `times` (T,), sorted, lie within +-half_s of each (itself included)."""
    t = np.asarray(times, dtype=np.float64)
    reach = half_s + WINDOW_TOLERANCE_S
    return np.searchsorted(t, t + reach, side="right") - np.searchsorted(t, t - reach, side="left")
