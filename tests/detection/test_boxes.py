"""Box overlap and the detector -> training box conversion."""

import numpy as np

from pipeline.detection.boxes import iou, to_box


def test_box_conversion_and_iou():
    b = to_box(np.array([[0.0, 0.0, 100.0, 100.0]]), {"w_scale": 0.86, "h_scale": 0.93, "dx": 0.0, "dy": 0.09})[0]
    np.testing.assert_allclose(b[2:], [86, 93])
    np.testing.assert_allclose([b[0] + b[2] / 2, b[1] + b[3] / 2], [50, 59])
    m = iou(np.array([[0, 0, 10, 10]]), np.array([[0, 0, 10, 10], [5, 0, 10, 10], [20, 20, 5, 5]]))
    np.testing.assert_allclose(m[0], [1, 5 / 15, 0])
