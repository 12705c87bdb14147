"""The One Euro filter: still signals stay still, ramps are followed with bounded lag."""


import numpy as np
import pytest

from pipeline.detection.haar import cascade_available
from pipeline.keypoints.smoothing import (
    OneEuroFilter,
    local_poly_fit_weights,
    local_poly_in_time,
    smoothing_factor,
)

needs_haar = pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")
C = {"w_scale": 1.0, "h_scale": 1.12, "dx": 0.0, "dy": -0.06}
HAAR = ["--set", "video.detector=haar"]  # the test video's face was chosen for it; the others are optional


def poly_at(xs: np.ndarray, i: int, half: int) -> np.ndarray:
    """`local_poly_in_time` of frames one second apart: the window is the frames i - half ..
    i + half (clipped to the sequence)."""
    return local_poly_in_time(xs, np.arange(len(xs), dtype=np.float64), i, half)


def smooth_sequence(xs: np.ndarray, fps: float, min_cutoff: float, beta: float, d_cutoff: float,
                    scales: np.ndarray | None = None) -> np.ndarray:
    """One Euro over a whole sequence (T, ...) sampled at `fps` (scales: (T,) or None)."""
    f = OneEuroFilter(min_cutoff, beta, d_cutoff)
    xs = np.asarray(xs, dtype=np.float64)
    return np.stack([f(x, i / fps, 1.0 if scales is None else float(scales[i])) for i, x in enumerate(xs)])


def test_one_euro_keeps_a_constant_signal_exactly():
    x = np.full((68, 2), 37.25)
    f = OneEuroFilter(0.1, 100.0, 1.0)
    for i in range(50):
        np.testing.assert_array_equal(f(x, i / 25), x)


def test_one_euro_reduces_jitter_on_a_noisy_still_signal():
    rng = np.random.default_rng(0)
    xs = 50.0 + rng.normal(0, 0.5, (200, 68, 2))
    ys = smooth_sequence(xs, 25.0, min_cutoff=0.5, beta=1.0, d_cutoff=1.0, scales=np.full(200, 100.0))
    jitter_raw = np.abs(np.diff(xs, axis=0)).mean()
    jitter_smooth = np.abs(np.diff(ys[20:], axis=0)).mean()
    assert jitter_smooth < 0.25 * jitter_raw
    assert abs(ys[20:].mean() - 50.0) < 0.05  # no bias


def test_one_euro_follows_a_ramp_with_bounded_lag():
    # x = v t: once the speed estimate has settled, a first-order filter with smoothing factor
    # a lags by v * dt * (1 - a) / a; beta raises the cutoff with the speed, so the lag is
    # below the one of the fixed min_cutoff filter (beta 0) and within the bound of its cutoff
    fps, v, n = 25.0, 40.0, 150
    xs = v * np.arange(n) / fps
    lag = {}
    for beta in (0.0, 2.0):
        ys = smooth_sequence(xs[:, None], fps, min_cutoff=1.0, beta=beta, d_cutoff=1.0)[:, 0]
        lag[beta] = xs[-1] - ys[-1]
        a = smoothing_factor(1.0 + beta * v, 1 / fps)
        assert 0 < lag[beta] <= v / fps * (1 - a) / a * 1.01
    assert lag[2.0] < 0.1 * lag[0.0]


def test_one_euro_first_sample_passes_and_speed_is_per_face_size():
    f = OneEuroFilter(1.0, 1.0, 1.0)
    np.testing.assert_array_equal(f(np.array([3.0]), 0.0), [3.0])
    # the same motion on a face 10x larger (scale 10x) is filtered as the small one's
    a, b = OneEuroFilter(1.0, 5.0, 1.0), OneEuroFilter(1.0, 5.0, 1.0)
    for i in range(10):
        ya = a(np.array([2.0 * i]), i / 25, scale=10.0)
        yb = b(np.array([20.0 * i]), i / 25, scale=100.0)
    np.testing.assert_allclose(10 * ya, yb)
    with pytest.raises(ValueError):
        OneEuroFilter(0.0, 1.0, 1.0)


def test_local_quadratic_has_no_bias_at_a_tracks_ends():
    # a pure quadratic trajectory passes through exactly on every frame, the first and last
    # three included: an edge window with enough points fits the interior's order (a line
    # there is biased by a multiple of the acceleration, largest on the third frame from an end)
    t = np.arange(15, dtype=float)
    x = 0.15 * t ** 2 - 2 * t + 1  # acceleration 0.3 px/frame^2
    smoothed = np.array([poly_at(x, i, 3) for i in range(15)])
    np.testing.assert_allclose(smoothed, x, rtol=0, atol=1e-9)
    # fitted, not interpolated, at the ends: the value at a sample of a least-squares fit
    # never amplifies the noise (weights' sum of squares <= 1) and averages it from 5 points on
    for before, after in ((0, 3), (1, 3), (2, 3), (3, 0), (3, 2)):
        w = local_poly_fit_weights(np.arange(-before, after + 1))
        assert w.sum() == pytest.approx(1) and (w ** 2).sum() <= 1 + 1e-12
        if before + after + 1 >= 5:
            assert (w ** 2).sum() < 0.9
    # too few points for a quadratic (a track two frames long): the highest order they fix
    np.testing.assert_allclose([poly_at(x[:2], i, 3) for i in range(2)], x[:2], atol=1e-12)
