"""The test video: every frame's truth is the photo's keypoints through the frame's affine."""


import cv2
import numpy as np
import pytest

from pipeline.detection.haar import cascade_available
from pipeline.synth.moving_face import synthetic_frames

needs_haar = pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")
C = {"w_scale": 1.0, "h_scale": 1.12, "dx": 0.0, "dy": -0.06}
HAAR = ["--set", "video.detector=haar"]  # the test video's face was chosen for it; the others are optional


def test_test_video_truth_is_exact():
    # dots at the keypoints of a black photo: in every frame of the moving path the dots'
    # centroids land on the truth (no noise; JPEG at quality 100)

    pts = np.array([[60.0, 50.0], [140.0, 52.0], [100.0, 90.0], [70.0, 130.0], [130.0, 128.0]])
    image = np.zeros((200, 200, 3), np.uint8)
    for x, y in pts:
        cv2.circle(image, (int(x), int(y)), 3, (255, 255, 255), -1)
    box = np.array([50.0, 40.0, 100.0, 100.0])
    for frame, truth in synthetic_frames(image, box, pts, 10, True, noise=0.0, jpeg_quality=100):
        g = frame[..., 0].astype(np.float64)
        for x, y in truth:
            x0, y0 = int(round(x)), int(round(y))
            win = g[y0 - 5:y0 + 6, x0 - 5:x0 + 6]
            win = np.where(win > 60, win, 0)
            yy, xx = np.mgrid[y0 - 5:y0 + 6, x0 - 5:x0 + 6]
            cx, cy = (win * xx).sum() / win.sum(), (win * yy).sum() / win.sum()
            assert abs(cx - x) < 0.25 and abs(cy - y) < 0.25
