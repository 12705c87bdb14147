"""predict-image: detector boxes to keypoints on photos, and its answers to bad photos."""

import json

import cv2
import numpy as np
import pytest

from pipeline.detection.boxes import iou
from pipeline.detection.haar import cascade_available

from helpers import check_picture, run

needs_haar = pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")


@needs_haar
def test_predict_image_blank_photo_gives_zero_faces(viz_ws, tmp_path, caplog):
    photo = tmp_path / "blank.png"
    cv2.imwrite(str(photo), np.full((120, 160, 3), 127, np.uint8))
    out = tmp_path / "out"
    assert run(["predict-image", photo, "--checkpoint", viz_ws["ckpt"], "--out-dir", out, "--csv"]) == 0
    res = json.loads((out / "blank_keypoints.json").read_text())
    assert res["n_faces"] == 0 and res["faces"] == [] and (res["width"], res["height"]) == (160, 120)
    assert cv2.imread(str(out / "blank_keypoints.png")).shape == (120, 160, 3)
    assert (out / "keypoints.csv").read_text().count("\n") == 1  # header only
    assert "no face found" in caplog.text


@needs_haar
def test_predict_image_unreadable_photo_exits_2(viz_ws, tmp_path, capsys):
    photo = tmp_path / "bad.jpg"
    photo.write_bytes(b"not an image")
    assert run(["predict-image", photo, "--checkpoint", viz_ws["ckpt"], "--out-dir", tmp_path / "o"]) == 2
    assert "cannot decode" in capsys.readouterr().err


@pytest.mark.skipif(cascade_available(), reason="this OpenCV has the Haar cascade")
def test_predict_image_without_cascade_says_how_to_fix(viz_ws, tmp_path, capsys):
    assert run(["predict-image", tmp_path / "x.png", "--checkpoint", viz_ws["ckpt"], "--out-dir", tmp_path,
                "--detector", "haar"]) == 2
    assert "opencv-python-headless<5" in capsys.readouterr().err


@needs_haar
@pytest.mark.realdata
def test_predict_image_finds_a_real_face(viz_ws, real_dir, tmp_path):
    from pipeline.formats.annotations import load_xml
    from pipeline.keypoints.schema import IBUG68

    face = load_xml(real_dir / "labels_ibug_300W_train.xml", IBUG68)[0]  # helen/trainset/100032540_1.jpg
    out = tmp_path / "out"
    # --keep-all: the 1-epoch model's flat maps score no face above the presence threshold
    assert run(["predict-image", real_dir / face.image, "--checkpoint", viz_ws["ckpt"], "--out-dir", out,
                "--csv", "--keep-all"]) == 0
    stem = (real_dir / face.image).stem
    res = json.loads((out / f"{stem}_keypoints.json").read_text())
    assert res["n_faces"] >= 1
    f0 = res["faces"][0]
    assert np.asarray(f0["points"]).shape == (68, 2)
    # the calibrated detector box lands on the annotated one
    assert iou(np.array([f0["box"]]), np.array([face.box]))[0, 0] > 0.5
    check_picture(out / f"{stem}_keypoints.png", (res["height"], res["width"]))
    assert (out / "keypoints.csv").read_text().count("\n") == 1 + res["n_faces"]
