"""predict-video end to end on the project's own test video, and make-test-video."""

import json
import logging

import cv2
import numpy as np
import pytest

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.detection.haar import cascade_available
from pipeline.formats.video import open_video, write_mp4
from pipeline.formats.video_csv import read_video_csv
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.tracking import box_constants, points_to_box
from pipeline.keypoints.schema import IBUG68
from pipeline.stages.train import fit
from pipeline.synth.face import TEMPLATE
from pipeline.synth.moving_face import make_test_video, source_face
from pipeline.tools.video import _as_pred, clip_stats, score_video, track_video

from helpers import run, run_cli

needs_haar = pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")
C = {"w_scale": 1.0, "h_scale": 1.12, "dx": 0.0, "dy": -0.06}
HAAR = ["--set", "video.detector=haar"]  # the test video's face was chosen for it; the others are optional


@pytest.fixture(scope="module")
def tiny_model(tiny_workspace, demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("vidmodel")
    cfg = load_config(None, [f"data.dir={demo_dir}", "crop.side=32", "model.input_size=32", "train.epochs=1",
                             "train.batch_size=16", "train.device=cpu", "folds.k=2", "folds.train=[0,1]"])
    fit(cfg, 0, tiny_workspace / "cache", tiny_workspace / "folds.csv", out, resume=False)
    return out / "fold0" / "best.pt"


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    return {kind: make_test_video(d / f"{kind}.mp4", 12, moving=kind == "moving") for kind in ("still", "moving")}


def _frame_count(path) -> int:
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


@needs_haar
def test_predict_video_writes_the_video_and_the_csv(tiny_model, videos, tmp_path):
    src, _ = videos["moving"]
    out, csv_path = tmp_path / "o" / "v.mp4", tmp_path / "o" / "v.csv"
    strip = tmp_path / "o" / "strip.png"
    assert run(["predict-video", src, "--checkpoint", tiny_model, "--out", out, "--csv", csv_path,
                "--strip", strip, *HAAR]) == 0
    assert _frame_count(out) == _frame_count(src) == 12
    assert cv2.imread(str(strip)).shape[:2] == (20 + 2 * 144 + 3 * 2, 4 * 144 + 5 * 2)  # 4 frames, raw over smoothed
    back = read_video_csv(csv_path)
    assert back["frame"].tolist() == list(range(12))  # one face, every frame
    assert set(back["face"].tolist()) == {0}  # one id throughout
    np.testing.assert_allclose(back["time"], np.arange(12) / 25.0, atol=1e-4)
    assert back["points"].shape == (12, 68, 2)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp files left


@needs_haar
def test_smoothing_reduces_still_jitter_and_keeps_moving_nme(tiny_model, videos, tmp_path):

    landmarker = Landmarker.from_checkpoints([tiny_model], device="cpu")
    vcfg = load_config(None, HAAR[1::2]).video
    scores = {}
    for kind, (src, truth_csv) in videos.items():
        res = track_video(src, landmarker, vcfg, progress=False)
        truth = read_video_csv(truth_csv)
        scores[kind] = {k: score_video(_as_pred(res, res[k]), truth) for k in ("raw", "smoothed")}
        scores[kind]["stats"] = clip_stats(res)
    still, moving = scores["still"], scores["moving"]
    # the second difference: what smoothing removes (a glitch of this 1-epoch model spread
    # over the window can raise the mean first difference)
    assert still["stats"]["jitter_smoothed"] < still["stats"]["jitter_raw"]
    assert still["stats"]["tracks"] == 1 and still["stats"]["lag"]["delay"] == 0
    assert moving["smoothed"]["nme"] <= 1.05 * moving["raw"]["nme"]
    assert still["raw"]["missed"] == moving["raw"]["missed"] == 0.0


@needs_haar
def test_predict_video_smooth_off_writes_raw_points(tiny_model, videos, tmp_path):

    src, _ = videos["still"]
    assert run(["predict-video", src, "--checkpoint", tiny_model, "--out", tmp_path / "a.mp4",
                "--csv", tmp_path / "off.csv", "--smooth", "off", *HAAR]) == 0
    vcfg = load_config(None, HAAR[1::2]).video
    res = track_video(src, Landmarker.from_checkpoints([tiny_model], device="cpu"), vcfg, progress=False)
    np.testing.assert_allclose(read_video_csv(tmp_path / "off.csv")["points"], res["raw"], atol=5e-4)


def test_open_video_missing_or_folder_is_one_line(tmp_path):
    for path, problem in ((tmp_path / "none.mp4", "video file not found"),
                          (tmp_path, "is a directory, expected a video file")):
        with pytest.raises(PipelineError) as e:
            open_video(path)
        assert str(e.value) == f"{path}: {problem}"


def test_predict_video_bad_input_exits_2_without_output(tiny_model, tmp_path, capsys):
    out = tmp_path / "o.mp4"
    code, _, err = run_cli(["predict-video", tmp_path / "missing.mp4", "--checkpoint", tiny_model, "--out", out],
                           capsys)
    assert code == 2 and "missing.mp4: video file not found" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all")
    code, _, err = run_cli(["predict-video", bad, "--checkpoint", tiny_model, "--out", out], capsys)
    assert code == 2 and "bad.mp4" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.mp4"]


def test_make_test_video_command(tmp_path, capsys):
    code, out, _ = run_cli(["make-test-video", tmp_path / "s.mp4", "--frames", "5", "--still"], capsys)
    assert code == 0 and _frame_count(tmp_path / "s.mp4") == 5
    truth = read_video_csv(tmp_path / "s_truth.csv")
    assert truth["frame"].tolist() == list(range(5))
    np.testing.assert_allclose(truth["points"], truth["points"][:1].repeat(5, 0))  # still: truth constant
    assert run(["make-test-video", tmp_path / "s.avi"]) == 2


def test_predict_batch_equals_one_photo_at_a_time(tiny_model):

    landmarker = Landmarker.from_checkpoints([tiny_model], device="cpu", batch_size=2)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (120, 150, 3), dtype=np.uint8) for _ in range(3)]
    boxes = [np.array([[20.0, 20, 60, 70], [70, 30, 50, 55]]), np.zeros((0, 4)), np.array([[10.0, 5, 90, 100]])]
    together = landmarker.predict_batch(images, boxes)
    assert [len(p) for p in together] == [2, 0, 1]
    for im, b, p in zip(images, boxes, together):
        if len(b):
            np.testing.assert_allclose(p, landmarker.predict(im, b), atol=1e-4)


@needs_haar
def test_predict_image_on_a_folder_skips_the_unreadable_file(tiny_model, videos, tmp_path, caplog):
    folder = tmp_path / "photos"
    folder.mkdir()
    image = source_face()[0]  # the test video's face: Haar finds it
    for name in ("a.png", "b.jpg"):
        cv2.imwrite(str(folder / name), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    (folder / "broken.jpg").write_bytes(b"not an image")
    (folder / "notes.txt").write_text("not a photo, not a warning")
    out = tmp_path / "out"
    assert run(["predict-image", folder, "--checkpoint", tiny_model, "--out-dir", out, "--csv",
                "--batch-size", "1", "--detector", "haar"]) == 0
    assert sorted(p.name for p in out.glob("*.json")) == ["a_keypoints.json", "b_keypoints.json"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("broken.jpg" in m for m in warned) == 1 and not any("notes.txt" in m for m in warned)
    rows = (out / "keypoints.csv").read_text().splitlines()
    faces = sum(json.loads((out / f"{s}_keypoints.json").read_text())["n_faces"] for s in "ab")
    assert faces >= 2 and len(rows) == 1 + faces
    assert {r.split(",")[0] for r in rows[1:]} == {str(folder / "a.png"), str(folder / "b.jpg")}
    # a glob that matches only the broken file, and a folder of broken files: exit 2
    assert run(["predict-image", str(folder / "broken*"), "--checkpoint", tiny_model, "--out-dir", out]) == 2
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    for n in ("x.jpg", "y.png"):
        (only_bad / n).write_bytes(b"junk")
    assert run(["predict-image", only_bad, "--checkpoint", tiny_model, "--out-dir", out]) == 2


@needs_haar
def test_video_stats_writes_one_row_per_clip(tiny_model, videos, tmp_path):
    src, _ = videos["still"]
    out = tmp_path / "stats.csv"
    assert run(["video-stats", src, src, "--checkpoint", tiny_model, "--csv", out, *HAAR]) == 0
    rows = out.read_text().splitlines()
    assert rows[0].startswith("clip,frames,tracks,id_switches,extra_face_frames") and len(rows) == 3
    cells = dict(zip(rows[0].split(","), rows[1].split(",")))
    assert cells["frames"] == "12" and cells["tracks"] == "1" and float(cells["lag_delay_frames"]) == 0
    assert rows[0].endswith(",lag_offset_pct,lag_delay_frames,lag_along_motion_pct")
    assert np.isfinite(float(cells["lag_along_motion_pct"]))  # 12 frames: the +-5-frame baseline fits


class NoisyStillFace:
    """A stand-in landmarker: one 60 px face at a fixed place, with fresh noise on every call
    (one call per frame), so the smoothing has something to remove; `detect` finds its box."""

    schema = IBUG68

    def __init__(self, vcfg, seed=0):
        self.rng = np.random.default_rng(seed)
        p = TEMPLATE[:, :2]
        self.face = (p - p.min(0)) / (p.max(0) - p.min(0)) * 60 + 50
        self.box = points_to_box(self.face, box_constants(vcfg))

    def predict(self, image, boxes):
        return np.stack([self.face + self.rng.normal(0, 0.5, self.face.shape) for _ in boxes])

    def detect(self, image):
        return self.box


class TimedCapture:
    """A capture whose frames carry the given time stamps (ms), as a variable frame rate
    clip's do; it declares 25 fps."""

    def __init__(self, ms):
        self.ms, self.i = list(ms), 0

    def read(self):
        if self.i >= len(self.ms):
            return False, None
        self.i += 1
        return True, np.zeros((160, 160, 3), np.uint8)

    def get(self, prop):
        return float(self.ms[self.i - 1]) if prop == cv2.CAP_PROP_POS_MSEC and self.i else 0.0

    def release(self):
        pass


def test_poly_smoothing_windows_in_seconds_of_the_frames_time_stamps(monkeypatch):
    # frames 15, 25 and 90 ms apart in turn (a variable frame rate clip declaring 25 fps): each
    # frame's smoothed points are the value at its time of the least-squares quadratic in time
    # through the frames within +-half_window_s of it (no frame lies near the window's edge)
    ms = np.cumsum([0] + [15, 25, 90] * 10)
    monkeypatch.setattr("pipeline.tools.video.open_video", lambda src: (TimedCapture(ms), 25.0, len(ms)))
    vcfg = load_config(None, []).video
    assert vcfg.filter == "poly" and vcfg.half_window_s == 0.1
    face = NoisyStillFace(vcfg)
    res = track_video("vfr.mp4", face, vcfg, progress=False, detect=face.detect)
    assert res["frame"].tolist() == list(range(len(ms))) and set(res["face"].tolist()) == {0}
    np.testing.assert_allclose(res["time"], ms / 1000, rtol=0, atol=1e-12)
    t, raw = ms / 1000, res["raw"].reshape(len(ms), -1)
    for i in range(len(ms)):
        near = np.abs(t - t[i]) <= 0.1
        want = np.polyfit(t[near] - t[i], raw[near], min(2, near.sum() - 1))[-1]
        np.testing.assert_allclose(res["smoothed"][i].reshape(-1), want, rtol=0, atol=1e-6, err_msg=f"frame {i}")
    assert np.abs(res["smoothed"] - res["raw"]).max() > 0.1  # it did smooth


def test_a_clip_too_slow_to_smooth_warns_and_a_normal_one_does_not(tmp_path, caplog):
    vcfg = load_config(None, []).video
    frames = [np.zeros((160, 160, 3), np.uint8)] * 12
    for fps in (4.0, 25.0):
        clip = write_mp4(tmp_path / f"at{fps:g}.mp4", frames, fps)
        face = NoisyStillFace(vcfg)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            res = track_video(clip, face, vcfg, progress=False, detect=face.detect)
        np.testing.assert_allclose(res["time"], np.arange(12) / fps, atol=1e-9)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if fps == 4.0:  # frames 0.25 s apart: +-0.1 s holds the frame alone, nothing is smoothed
            assert len(warned) == 1 and str(clip) in warned[0] and "video.half_window_s" in warned[0], warned
            np.testing.assert_array_equal(res["smoothed"], res["raw"])
        else:
            assert warned == [] and np.abs(res["smoothed"] - res["raw"]).max() > 0.1
