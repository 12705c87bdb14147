"""OOF bias calibration: per-keypoint bias, honest leave-one-out check, the auto switch,
and the predict/evaluate wiring."""

import numpy as np
import pytest

from pipeline.keypoints.calibrate import keypoint_bias, leave_one_out_calibrated, should_calibrate


def _faces(n=40, k=5, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0, 100, (n, k, 2))
    noise = rng.normal(0, 1.0, (n, k, 2))
    return truth, noise


def test_keypoint_bias_is_the_mean_residual_and_skips_unpredicted_faces():
    truth, noise = _faces()
    offset = np.array([[1.5, -0.5]] * 5)
    pred = truth + noise + offset
    pred[3] = np.nan  # a face of an untrained fold
    ok = np.arange(len(pred)) != 3
    np.testing.assert_allclose(keypoint_bias(pred, truth), (pred[ok] - truth[ok]).mean(0))
    assert keypoint_bias(np.full_like(pred, np.nan), truth).tolist() == np.zeros((5, 2)).tolist()


def test_leave_one_out_uses_every_other_face_only():
    truth, noise = _faces(n=6, k=3)
    pred = truth + noise + 2.0
    pred[1] = np.nan
    cal = leave_one_out_calibrated(pred, truth)
    assert np.isnan(cal[1]).all()
    for i in (0, 2, 5):
        others = [j for j in range(6) if j not in (i, 1)]
        expect = pred[i] - (pred[others] - truth[others]).mean(0)
        np.testing.assert_allclose(cal[i], expect)


def test_auto_calibrates_a_constant_offset_but_not_pure_noise():
    truth, noise = _faces(n=200)
    assert should_calibrate("auto", truth + noise + [1.0, 0.0], truth)
    assert not should_calibrate("auto", truth + noise, truth)
    assert should_calibrate("on", truth + noise, truth)
    assert not should_calibrate("off", truth + noise + 5.0, truth)
    with pytest.raises(ValueError):
        should_calibrate("maybe", truth, truth)
