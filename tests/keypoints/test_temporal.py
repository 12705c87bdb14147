"""Jitter, lag and track bookkeeping without ground truth, and the centred local polynomial."""

import numpy as np
import pytest

from pipeline.keypoints.smoothing import OneEuroFilter, local_poly_fit_weights, local_poly_in_time, smoothing_factor
from pipeline.keypoints.temporal import (
    lag,
    lag_along_motion,
    per_second_rate,
    second_difference_jitter,
    track_summary,
)


def poly_at(xs: np.ndarray, i: int, half: int) -> np.ndarray:
    """`local_poly_in_time` of frames one second apart: the window is the frames i - half ..
    i + half (clipped to the sequence)."""
    return local_poly_in_time(xs, np.arange(len(xs), dtype=np.float64), i, half)


def _face(n, motion):
    """n frames of a 68-point face whose outer eye corners (36, 45) are 10 px apart."""
    base = np.zeros((68, 2))
    base[45, 0] = 10.0
    return np.stack([base + motion(t) for t in range(n)])


def test_second_difference_jitter_ignores_steady_motion_and_sees_noise():
    frame, face = np.arange(20), np.zeros(20, dtype=int)
    steady = _face(20, lambda t: np.array([0.5 * t, 0.2 * t]))
    assert second_difference_jitter(frame, face, steady, steady) == pytest.approx(0.0, abs=1e-12)
    wobble = _face(20, lambda t: np.array([0.1 * (-1) ** t, 0.0]))  # +-0.1 px: |2nd diff| = 0.4 px = 4 %
    assert second_difference_jitter(frame, face, wobble, wobble) == pytest.approx(0.04)
    # two tracks: no second difference across them
    assert second_difference_jitter(frame, np.repeat([0, 1], 10), steady, steady) == pytest.approx(0.0, abs=1e-12)


def test_lag_finds_the_delay_and_the_offset():
    frame, face = np.arange(30), np.zeros(30, dtype=int)
    raw = _face(30, lambda t: np.array([0.3 * t, 0.0]))
    late = np.concatenate([raw[:2], raw[:-2]])  # two frames behind
    got = lag(frame, face, late, raw)
    assert got["delay"] == 2 and got["offset"] == pytest.approx(0.6 * 28 / 30 / 10)
    assert lag(frame, face, raw, raw) == {"offset": 0.0, "delay": 0.0}


def test_lag_along_motion_is_the_causal_lag_on_a_ramp_and_zero_for_a_centred_filter():
    n, v = 200, 0.3  # px per frame, eye distance 10 px
    frame, face = np.arange(n), np.zeros(n, dtype=int)
    raw = _face(n, lambda t: np.array([v * t, 0.5 * v * t]))
    speed = v * np.hypot(1, 0.5)
    # an exponential filter (One Euro with beta 0) trails a ramp by speed (1 - a) / a once settled
    ema = OneEuroFilter(min_cutoff=2.0, beta=0.0)
    causal = np.stack([ema(p, i / 25) for i, p in enumerate(raw)])
    a = float(smoothing_factor(2.0, 1 / 25))
    assert lag_along_motion(frame, face, causal, raw) == pytest.approx(-speed * (1 - a) / a / 10, rel=0.03)
    centred = np.stack([poly_at(raw, t, 3) for t in range(n)])
    assert lag_along_motion(frame, face, centred, raw) == pytest.approx(0.0, abs=1e-9)
    ahead = np.concatenate([raw[2:], raw[-2:]])  # two frames early: + 2 frames of motion
    assert lag_along_motion(frame, face, ahead, raw) == pytest.approx(2 * speed / 10, rel=0.03)


def test_lag_along_motion_is_not_inflated_by_the_noise_a_filter_removes():
    n = 400
    frame, face = np.arange(n), np.zeros(n, dtype=int)
    rng = np.random.default_rng(0)
    noisy = _face(n, lambda t: np.zeros(2)) + rng.normal(0, 0.3, (n, 68, 2))  # a still face, 0.3 px noise
    smoothed = np.stack([poly_at(noisy, t, 3) for t in range(n)])
    offset = lag(frame, face, smoothed, noisy)["offset"]  # mostly the removed noise
    assert offset > 0.02 and abs(lag_along_motion(frame, face, smoothed, noisy)) < 0.02 * offset
    # the same noise on a ramp: the centred filter still shows no lag, the offset is unchanged
    moving = noisy + _face(n, lambda t: np.array([0.3 * t, 0.0])) - _face(n, lambda t: np.zeros(2))
    smoothed = np.stack([poly_at(moving, t, 3) for t in range(n)])
    assert abs(lag_along_motion(frame, face, smoothed, moving)) < 0.02 * offset
    assert lag_along_motion(frame, face, moving, moving) == 0.0  # unsmoothed: no offset at all


def test_track_summary_counts_tracks_switches_and_extra_faces():
    # frames 0-4: face 0; frame 3 also a face 1 (a duplicate); frames 5-9: face 2 (new id)
    frame = np.array([0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9])
    face = np.array([0, 0, 0, 0, 1, 0, 2, 2, 2, 2, 2])
    assert track_summary(frame, face, 10) == {"tracks": 3, "id_switches": 1, "extra_face_frames": 1,
                                              "expected_faces": 1}


def test_per_second_rate_finds_the_slowest_second():
    secs = np.full(100, 0.01)
    secs[50:75] = 0.04  # the third second (frames 50-74 at 25 fps) runs at a quarter
    r = per_second_rate(secs, 25.0)
    assert r["median"] == pytest.approx(100) and r["slowest_second"] == 2 and r["ratio"] == pytest.approx(0.25)


def test_centred_local_quadratic_passes_a_quadratic_motion_without_lag_and_averages_noise():
    t = np.arange(15, dtype=float)
    x = 0.3 * t ** 2 - 2 * t + 1
    np.testing.assert_allclose([poly_at(x, i, 3) for i in range(3, 12)], x[3:12], atol=1e-9)
    w = local_poly_fit_weights(np.arange(-3, 4))
    assert w.sum() == pytest.approx(1) and (w ** 2).sum() < 0.35  # noise variance x 0.33 at the centre
    # a one-sided window (a track's last frame) fits the same quadratic: exact on linear motion too
    assert poly_at(2 * t, 14, 3) == pytest.approx(28)
