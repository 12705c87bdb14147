"""The live tracker (`Tracker.update`): its clock and the params it reads."""

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.inference.live import Tracker
from pipeline.inference.tracking import points_to_box
from pipeline.synth.face import TEMPLATE

FRAME = np.zeros((160, 200, 3), np.uint8)


class Moving:
    """A predictor without scores (no presence gate) whose one face moves 2 px right per
    frame (`frame`, set by the test), and a detector that finds it; records its boxes."""

    detector = "auto"

    def __init__(self):
        p = TEMPLATE[:, :2]
        self.shape = (p - p.min(0)) / (p.max(0) - p.min(0)) * [40, 46] + [60, 50]
        self.frame, self.boxes = 0, []

    def points(self):
        return self.shape + [2.0 * self.frame, 0.0]

    def detect(self, image):
        return points_to_box(self.points(), {"w_scale": 1.0, "h_scale": 1.12, "dx": 0.0, "dy": -0.06})

    def predict(self, image, boxes):
        self.boxes.append(np.array(boxes))
        return np.stack([self.points() for _ in boxes])


def smoothed_x(times, wall=None):
    face = Moving()
    tracker = Tracker(face, detect=face.detect)
    if wall is not None:
        tracker._clock.now = wall
    out = []
    for i, t in enumerate(times):
        face.frame = i
        (tracked,) = tracker.update(FRAME, t)
        out.append(tracked.points[:, 0].mean())
    return np.array(out)


def test_times_that_jump_back_do_not_freeze_the_smoothed_points():
    # the caller's clock restarts after two frames: the smoothed points go on following the face
    x = smoothed_x([10.0, 10.1, 0.0, 0.1, 0.2])
    assert (np.diff(x) > 0.5).all(), x


def test_a_missing_time_after_given_ones_does_not_freeze_the_smoothed_points():
    ticks = iter(np.arange(0, 100, 0.1))
    x = smoothed_x([10.0, 10.1, None, None, None], wall=lambda: next(ticks))
    assert (np.diff(x) > 0.5).all(), x


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_time_that_is_no_finite_number_is_an_error_and_the_tracker_goes_on(bad):
    face = Moving()
    tracker = Tracker(face, detect=face.detect)
    tracker.update(FRAME, 0.0)
    with pytest.raises(PipelineError, match="frame time must be a finite number"):
        tracker.update(FRAME, bad)
    face.frame = 1
    (tracked,) = tracker.update(FRAME, 0.04)
    assert np.isfinite(tracked.points).all() and tracked.id == 0


def test_without_video_params_the_tracker_reads_params_yaml_as_predict_video_does(tmp_path, monkeypatch):
    # the second frame's box is the box of the first frame's keypoints, by params.yaml's
    # video.box_* (a recipe's), not by the built-in defaults
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("video:\n  box_w_scale: 1.3\n  box_dy: 0.1\n")
    face = Moving()
    tracker = Tracker(face, detect=face.detect)
    tracker.update(FRAME, 0.0)
    tracker.update(FRAME, 0.04)
    want = points_to_box(face.shape, {"w_scale": 1.3, "h_scale": 1.12, "dx": 0.0, "dy": 0.1})
    np.testing.assert_allclose(face.boxes[1], want)
