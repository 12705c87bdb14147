"""The video CSV: one row per frame and face."""


import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.detection.haar import cascade_available
from pipeline.formats.video_csv import read_video_csv, write_video_csv

needs_haar = pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")
C = {"w_scale": 1.0, "h_scale": 1.12, "dx": 0.0, "dy": -0.06}
HAAR = ["--set", "video.detector=haar"]  # the test video's face was chosen for it; the others are optional


def test_video_csv_round_trip_and_columns(tmp_path):
    pts = np.random.default_rng(0).uniform(0, 100, (3, 68, 2))
    write_video_csv(tmp_path / "a.csv", np.array([0, 0, 1]), np.array([0, 0, 0.04]), np.array([0, 1, 0]), pts)
    header = (tmp_path / "a.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["frame", "time", "face", "x0", "y0"] and header[-1] == "y67" and len(header) == 3 + 136
    back = read_video_csv(tmp_path / "a.csv")
    np.testing.assert_allclose(back["points"], pts, atol=5e-4)
    assert back["face"].tolist() == [0, 1, 0] and back["frame"].tolist() == [0, 0, 1]


def test_read_video_csv_missing_or_folder_is_a_one_line_error(tmp_path):
    for path, problem in ((tmp_path / "none.csv", "keypoint CSV not found"),
                          (tmp_path, "is a directory, expected a keypoint CSV file")):
        with pytest.raises(PipelineError) as e:
            read_video_csv(path)
        assert str(e.value) == f"{path}: {problem}"
