"""predict-video end to end on the project's own test video, and make-test-video."""

import json
import logging

import cv2
import numpy as np
import pytest

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.detection.haar import cascade_available
from pipeline.formats.video import open_video, timed_frames_of, write_mp4
from pipeline.formats.video_csv import read_video_csv, write_video_csv
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
# the test video's face was chosen for Haar (the other detectors are optional); the 1-epoch
# model's maps are too flat to pass any presence threshold: these tests are about tracking
HAAR = ["--set", "video.detector=haar", "--set", "video.presence=off"]


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
    together = landmarker.predict(images, boxes)
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
                "--batch-size", "1", "--detector", "haar", "--keep-all"]) == 0
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
    monkeypatch.setattr("pipeline.tools.video.open_capture", lambda src: (TimedCapture(ms), 25.0, len(ms)))
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


WALL = np.array([5.0, 5, 100, 100])  # the test video's background, left of the face (x 114-206)


def test_a_clip_with_a_false_detection_is_one_track(face_model, videos):
    # a detector that finds the face and, on every run, a patch of the background beside it
    # (larger, so listed first): the wall scores below the threshold and starts no track
    src, truth_csv = videos["still"]
    truth = read_video_csv(truth_csv)
    face = points_to_box(truth["points"][0], C)[0]
    detect = lambda image: np.stack([WALL, face])  # noqa: E731
    landmarker = Landmarker.from_checkpoints([face_model["ckpt"]], device="cpu")
    vcfg = load_config(None, ["video.max_faces=1"]).video
    res = track_video(src, landmarker, vcfg, progress=False, detect=detect)
    assert res["frame"].tolist() == list(range(12)) and set(res["face"].tolist()) == {0}
    assert len(res["tracks"]) == 1 and res["rejected"] == res["detections"] >= 2
    assert (res["score"] >= res["presence_threshold"]).all()
    # the keypoints are the face's, not the wall's
    assert score_video(_as_pred(res, res["raw"]), truth)["nme"] < 0.25
    # without the gate the wall takes max_faces' one place
    res = track_video(src, landmarker, vcfg.model_copy(update={"presence": "off"}), progress=False, detect=detect)
    assert set(res["face"].tolist()) == {0} and (res["box"][:, 0] < 60).all()


@needs_haar
def test_a_fast_head_turn_is_one_track_with_one_face_on_every_frame(face_model, videos, tmp_path):
    # the test video's face jumps 70 px (0.7 of its box) between frames 5 and 6, as in a fast
    # head turn or dropped frames: the box from frame 5's keypoints misses it on frame 6, and
    # the tracker must find it on that same frame (Haar, the default install's detector)
    src, truth_csv = videos["still"]
    cap, fps, _ = open_video(src)
    frames = [frame for _, frame in timed_frames_of(cap, fps)]
    cap.release()
    shift = np.float32([[1, 0, 70], [0, 1, 0]])
    frames = frames[:6] + [cv2.warpAffine(f, shift, f.shape[1::-1], borderMode=cv2.BORDER_REPLICATE)
                           for f in frames[6:]]
    fast = write_mp4(tmp_path / "fast.mp4", frames, fps)
    truth = read_video_csv(truth_csv)
    truth["points"][6:, :, 0] += 70
    landmarker = Landmarker.from_checkpoints([face_model["ckpt"]], device="cpu")
    res = track_video(fast, landmarker, load_config(None, ["video.detector=haar"]).video, progress=False)
    assert res["frame"].tolist() == list(range(12)) and set(res["face"].tolist()) == {0}
    assert [t["end"] for t in res["tracks"]] == ["end of video"]
    assert score_video(_as_pred(res, res["raw"]), truth)["nme"] < 0.25


@needs_haar
def test_tracker_update_over_the_frames_gives_the_csv_of_predict_video(face_model, videos, tmp_path):
    src, _ = videos["moving"]
    sets = ["video.detector=haar", "video.filter=one_euro"]  # the live filter, the tracker's own
    assert run(["predict-video", src, "--checkpoint", face_model["ckpt"], "--out", tmp_path / "v.mp4",
                "--csv", tmp_path / "command.csv", *[a for s in sets for a in ("--set", s)]]) == 0
    tracker = Landmarker.from_checkpoints([face_model["ckpt"]], device="cpu").tracker(load_config(None, sets).video)
    cap, fps, _ = open_video(src)
    rows = []
    for i, (t, frame) in enumerate(timed_frames_of(cap, fps)):
        rows += [(i, t, f.id, f.score, f.points) for f in tracker.update(frame, t)]
    cap.release()
    frames, times, ids, scores, points = (np.array(c) for c in zip(*rows))
    write_video_csv(tmp_path / "loop.csv", frames, times, ids, points, scores)
    assert (tmp_path / "loop.csv").read_bytes() == (tmp_path / "command.csv").read_bytes()
    assert len(rows) == 12 and set(ids.tolist()) == {0} and np.isfinite(scores).all()


@needs_haar
def test_predict_video_reads_an_opencv_capture_source(tiny_model, videos, tmp_path, monkeypatch):
    src, _ = videos["moving"]
    ref = tmp_path / "file.csv"
    assert run(["predict-video", src, "--checkpoint", tiny_model, "--out", tmp_path / "f.mp4", "--csv", ref,
                "--smooth", "off", *HAAR]) == 0
    # a stream URL: the same file through OpenCV's capture (FFmpeg's file:// protocol)
    url = tmp_path / "url.csv"
    assert run(["predict-video", f"file://{src}", "--checkpoint", tiny_model, "--out", tmp_path / "u.mp4",
                "--csv", url, "--smooth", "off", *HAAR]) == 0
    assert url.read_bytes() == ref.read_bytes()
    # camera 0: the file played through cv2.VideoCapture as if it were the camera, stopped after
    # 8 frames; raw points, so the first 8 frames' rows are the file's
    real = cv2.VideoCapture
    opened = []
    monkeypatch.setattr(cv2, "VideoCapture", lambda s, *a: opened.append(s) or real(str(src) if s == 0 else s, *a))
    monkeypatch.chdir(tmp_path)
    cam = tmp_path / "cam.csv"
    assert run(["predict-video", "0", "--checkpoint", tiny_model, "--csv", cam, "--smooth", "off",
                "--max-frames", "8", *HAAR]) == 0
    assert 0 in opened and (tmp_path / "out" / "camera0_keypoints.mp4").is_file()
    want = [r for r in ref.read_text().splitlines() if not r[:1].isdigit() or int(r.split(",")[0]) < 8]
    assert cam.read_text().splitlines() == want and len(want) == 9
    assert _frame_count(tmp_path / "out" / "camera0_keypoints.mp4") == 8
    # a camera that is not there: one line, nothing written
    monkeypatch.setattr(cv2, "VideoCapture", lambda s, *a: real(str(tmp_path / "none.mp4")))
    assert run(["predict-video", "3", "--checkpoint", tiny_model, "--csv", tmp_path / "no.csv", *HAAR]) == 2
    assert not (tmp_path / "no.csv").exists()
