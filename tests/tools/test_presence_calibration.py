"""`pipeline calibrate-presence`, the `presence` stage (pipeline/stages/presence.py) whose
calibration it runs, and the face-presence score where a box is trusted: predict-image leaves
a false detection out, every backend gives one answer."""

import json
import shutil

import numpy as np
import pytest

from pipeline.detection.haar import cascade_available
from pipeline.formats.checkpoint import checkpoint_identity, load_checkpoint, save_checkpoint
from pipeline.formats.photo_keypoints import read_photo_json, read_photo_keypoints_csv
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.onnx_runtime import onnx_available
from pipeline.synth.moving_face import source_face

from helpers import run, run_cli


def test_the_score_separates_held_out_faces_from_non_face_crops(face_model, capsys):
    stamp = face_model["calibration"]["stamp"]
    # faces the model never trained on (fold 0) against crops of the same photos
    assert stamp["fold"] == 0 and stamp["faces"] >= 50 and stamp["non_faces"] >= 6 * stamp["faces"]
    assert stamp["auc"] >= 0.95, face_model["calibration"]["by_kind"]
    assert stamp["faces_kept"] >= 0.9 and stamp["non_faces_dropped"] >= 0.9
    by_kind = face_model["calibration"]["by_kind"]
    assert set(by_kind) == {"face", "shifted", "part", "wide", "background"}
    assert all(v["auc"] >= 0.8 for k, v in by_kind.items() if k != "face"), by_kind
    # the threshold travels in the checkpoint (written to --out; the original is untouched)
    calibrated, raw = load_checkpoint(face_model["ckpt"]), load_checkpoint(face_model["raw"])
    assert calibrated["presence"] == stamp
    assert "presence" not in raw
    # the same checkpoint otherwise: every key, the weights and what they predict with
    assert set(calibrated) == set(raw) | {"presence"}
    assert checkpoint_identity(calibrated) == checkpoint_identity(raw)
    landmarker = Landmarker.from_checkpoints([face_model["ckpt"]], device="cpu")
    assert landmarker.presence_threshold == stamp["threshold"] and landmarker.presence[0]["calibrated"]
    assert not Landmarker.from_checkpoints([face_model["raw"]], device="cpu").presence[0]["calibrated"]
    # --out names one checkpoint
    code, _, err = run_cli(["calibrate-presence", face_model["raw"], face_model["raw"], "--out", "x.pt"], capsys)
    assert code == 2 and "--out writes one checkpoint" in err


def test_a_model_whose_faces_and_non_faces_do_not_separate_gets_no_threshold(viz_ws, tmp_path, capsys):
    """The 1-epoch model's maps are flat on faces and non-faces alike: calibrate-presence
    refuses to stamp a threshold (one line, exit 2, nothing written); the presence stage
    records the measurement without one, so the model gates nothing and `dvc repro` goes on."""
    fold = tmp_path / "models" / "fold0"
    fold.mkdir(parents=True)
    ckpt = fold / "best.pt"
    shutil.copy(viz_ws["ckpt"], ckpt)
    where = ["--cache", viz_ws["cache"], "--folds", viz_ws["cache"].parent / "folds.csv",
             "--set", f"data.dir={viz_ws['data']}"]
    for out in (["--out", tmp_path / "stamped.pt"], []):
        code, _, err = run_cli(["calibrate-presence", ckpt, *out, *where], capsys)
        assert code == 2, err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"error: {ckpt}: faces and non-faces do not separate (ROC AUC "), line
        assert not (tmp_path / "stamped.pt").exists() and not (fold / "presence.json").exists()
    assert run(["presence", "--fold", 0, "--models", tmp_path / "models", *where]) == 0
    stamp = json.loads((fold / "presence.json").read_text())["presence"]
    assert stamp["threshold"] is None and stamp["keep"] is None and stamp["auc"] < 0.9
    landmarker = Landmarker.from_checkpoints([ckpt], device="cpu")
    assert landmarker.presence_threshold is None and "do not separate" in landmarker.presence[0]["why"]


def _photo_with_a_wall():
    """A rendered face the model never saw, its box, and a box of the same size on the
    photo's background as far from the face as the photo allows."""
    image, box, _ = source_face(seed=0)
    h, w = image.shape[:2]
    side = float(max(box[2], box[3]))
    corners = [(0.0, 0.0), (w - side, 0.0), (0.0, h - side), (w - side, h - side)]
    cx, cy = box[0] + box[2] / 2, box[1] + box[3] / 2
    x, y = max(corners, key=lambda c: (c[0] + side / 2 - cx) ** 2 + (c[1] + side / 2 - cy) ** 2)
    return image, box, np.array([x, y, side * 1.05, side * 1.05])  # a little larger: the detector lists it first


@pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")
def test_predict_image_leaves_out_a_false_detection_or_marks_it_with_keep_all(face_model, tmp_path, monkeypatch):
    import cv2

    image, box, wall = _photo_with_a_wall()
    photo = tmp_path / "face.png"
    cv2.imwrite(str(photo), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    both = np.stack([wall, box])  # the detector's boxes, largest first: the wall, then the face
    monkeypatch.setattr(Landmarker, "detect", lambda self, im, max_faces=0: (both, both))
    out = tmp_path / "out"
    assert run(["predict-image", photo, "--checkpoint", face_model["ckpt"], "--out-dir", out, "--csv",
                "--detector", "haar", "--max-faces", "1"]) == 0
    res = read_photo_json(out / "face_keypoints.json")
    assert res["n_faces"] == 1 and res["faces"][0]["box"] == [round(float(v), 2) for v in box]
    threshold = res["presence_threshold"]
    assert threshold == pytest.approx(face_model["calibration"]["stamp"]["threshold"], abs=1e-4)
    assert res["faces"][0]["is_face"] and res["faces"][0]["score"] >= threshold
    table = read_photo_keypoints_csv(out / "keypoints.csv")
    assert table["is_face"].tolist() == [True] and table["score"][0] == res["faces"][0]["score"]
    # --keep-all: both, in the detector's order, the wall marked and scored below the threshold
    assert run(["predict-image", photo, "--checkpoint", face_model["ckpt"], "--out-dir", out, "--csv",
                "--detector", "haar", "--keep-all"]) == 0
    res = json.loads((out / "face_keypoints.json").read_text())
    assert [f["is_face"] for f in res["faces"]] == [False, True]
    assert res["faces"][0]["score"] < threshold <= res["faces"][1]["score"]
    assert read_photo_keypoints_csv(out / "keypoints.csv")["is_face"].tolist() == [False, True]
    # the Python API says the same
    faces = Landmarker.from_checkpoints([face_model["ckpt"]], device="cpu").faces(image, both, keep_all=True)
    assert faces.is_face.tolist() == [False, True]
    np.testing.assert_allclose(faces.scores, [f["score"] for f in res["faces"]], atol=1e-4)


@pytest.mark.skipif(not onnx_available(), reason="onnxruntime not installed")
def test_the_exported_model_carries_the_threshold_and_gives_the_same_scores(face_model, tmp_path):
    image, box, wall = _photo_with_a_wall()
    onnx = tmp_path / "m.onnx"
    assert run(["export", face_model["ckpt"], "--out", onnx, "--no-verify"]) == 0
    assert json.loads(onnx.with_suffix(".json").read_text())["presence"] == face_model["calibration"]["stamp"]
    boxes = np.stack([wall, box])
    a = Landmarker.from_checkpoints([face_model["ckpt"]], device="cpu").faces(image, boxes, keep_all=True)
    b = Landmarker.from_checkpoints([onnx], device="cpu").faces(image, boxes, keep_all=True)
    np.testing.assert_allclose(b.scores, a.scores, atol=1e-4)
    assert b.is_face.tolist() == a.is_face.tolist() == [False, True]


def _set_args(sets):
    return [a for s in sets for a in ("--set", s)]


def test_the_stage_writes_a_file_beside_the_checkpoint_that_every_backend_and_export_read(face_model, tmp_path):
    models = tmp_path / "models"
    (models / "fold0").mkdir(parents=True)
    ckpt = models / "fold0" / "best.pt"
    shutil.copy(face_model["raw"], ckpt)
    weights = ckpt.read_bytes()
    # a keep threshold that drops half the non-faces: below the start one, whatever the model
    sets = _set_args([*face_model["sets"], "presence.keep_drop=0.5"])
    stage = ["presence", "--fold", 0, "--models", models, "--cache", face_model["cache"], "--folds",
             face_model["folds"], *sets]
    assert run(stage) == 0
    sidecar = models / "fold0" / "presence.json"
    written = json.loads(sidecar.read_text())
    stamp = written["presence"]
    assert ckpt.read_bytes() == weights  # the checkpoint, a train output, is left as it was
    assert written["checkpoint"] == "best.pt"
    assert written["identity"] == checkpoint_identity(load_checkpoint(ckpt))
    # the very calibration `calibrate-presence` made of the same model (same params but
    # keep_drop, same seed)
    assert {k: v for k, v in stamp.items() if not k.startswith("keep")} == \
        {k: v for k, v in face_model["calibration"]["stamp"].items() if not k.startswith("keep")}
    assert stamp["fold"] == 0 and stamp["auc"] >= 0.9 and 0 < stamp["keep"] < stamp["threshold"]
    # every backend reads it, the tracker starts at the threshold and keeps down to `keep`
    landmarker = Landmarker.from_checkpoints([ckpt], device="cpu")
    assert landmarker.presence_threshold == stamp["threshold"] and landmarker.presence_keep == stamp["keep"]
    tracker = landmarker.tracker(detect=lambda image: np.zeros((0, 4)))
    assert (tracker.threshold, tracker.keep_threshold) == (stamp["threshold"], stamp["keep"])
    if onnx_available():
        assert Landmarker.from_checkpoints([ckpt], backend="onnx").presence_threshold == stamp["threshold"]
        onnx = tmp_path / "m.onnx"
        assert run(["export", ckpt, "--out", onnx, "--no-verify"]) == 0
        assert json.loads(onnx.with_suffix(".json").read_text())["presence"] == stamp
        assert Landmarker.from_checkpoints([onnx]).presence_keep == stamp["keep"]
    # calibrate-presence without --out writes the same file, and no checkpoint either
    sidecar.unlink()
    assert run(["calibrate-presence", ckpt, "--cache", face_model["cache"], "--folds", face_model["folds"],
                *sets]) == 0
    assert json.loads(sidecar.read_text()) == written and ckpt.read_bytes() == weights
    # retrained weights (another identity): the file is not theirs, so no gate
    retrained = load_checkpoint(ckpt)
    name = next(k for k, v in retrained["model"].items() if v.is_floating_point())
    retrained["model"][name] = retrained["model"][name] + 0.01
    save_checkpoint(ckpt, retrained)
    landmarker = Landmarker.from_checkpoints([ckpt], device="cpu")
    assert landmarker.presence_threshold is None and not landmarker.presence[0]["calibrated"]
