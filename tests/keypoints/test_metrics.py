"""MAE (the competition metric) and NME on hand-made examples."""


import numpy as np
import pytest

from pipeline.keypoints.metrics import mae, nme
from pipeline.keypoints.schema import IBUG68


def test_mae_and_nme_hand_example():
    truth = np.zeros((2, 3, 2))
    truth[:, 1] = (4.0, 0.0)  # eyes 0 and 1: inter-ocular 4 px
    pred = truth.copy()
    pred[0, 2] += (3.0, 4.0)  # face 0: one point 5 px off -> mean 5/3 -> /4
    pred[1, :, 0] += 2.0      # face 1: every point 2 px off -> 2/4
    assert mae(pred, truth) == pytest.approx((3 + 4 + 2 * 3) / 12)
    assert nme(pred, truth, eyes=(0, 1)) == pytest.approx(((5 / 3) / 4 + 2 / 4) / 2)
    assert nme(pred, truth, eyes=None) is None
    assert nme(pred, truth, eyes=(0, 7)) is None  # out of range for K=3


def test_nme_ibug_eyes_default():
    rng = np.random.default_rng(0)
    truth = rng.uniform(0, 100, (4, 68, 2))
    pred = truth + rng.normal(0, 1, truth.shape)
    iod = np.linalg.norm(truth[:, 36] - truth[:, 45], axis=1)
    want = np.mean(np.linalg.norm(pred - truth, axis=2).mean(1) / iod)
    assert nme(pred, truth) == pytest.approx(want)
    assert IBUG68.eyes == (36, 45)


