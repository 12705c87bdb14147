"""The embedded demo data set: layout, determinism, iBUG semantics of the drawn faces."""

import math

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.formats.annotations import load_xml, read_image
from pipeline.keypoints.schema import IBUG68
from pipeline.synth.face import TEMPLATE
from pipeline.synth.layout import MARKER, generate_demo

TRAIN = "labels_ibug_300W_train.xml"
TEST = "labels_ibug_300W_test_parsed.xml"


def test_template_is_mirror_symmetric_under_the_flip_permutation():
    mirrored = TEMPLATE[list(IBUG68.flip_perm)] * [-1, 1, 1]
    np.testing.assert_allclose(mirrored, TEMPLATE, atol=1e-12)
    # and it follows the iBUG order: image-left first
    assert TEMPLATE[36, 0] < TEMPLATE[39, 0] < 0 < TEMPLATE[42, 0] < TEMPLATE[45, 0]
    assert TEMPLATE[0, 0] < TEMPLATE[8, 0] == 0 < TEMPLATE[16, 0] and TEMPLATE[8, 1] == TEMPLATE[:17, 1].max()
    assert np.all(np.diff(TEMPLATE[17:27, 0]) > 0) and np.all(np.diff(TEMPLATE[27:31, 1]) > 0)


def test_layout_and_counts(demo_dir):
    for name in (TRAIN, TEST, "solution.csv", MARKER):
        assert (demo_dir / name).is_file()
    train = load_xml(demo_dir / TRAIN, IBUG68, require_parts=True)
    test = load_xml(demo_dir / TEST, IBUG68, require_parts=False)
    assert len(train) == 48 and len(test) == 8
    assert all(f.image.startswith("images/") and f.image.endswith(".jpg") for f in train + test)
    assert not {f.group for f in train} & {f.group for f in test}
    # some photos hold two faces: as <photo>_1 / <photo>_2 files or two boxes in one image
    sizes = np.unique([f.group for f in train], return_counts=True)[1]
    assert sizes.max() >= 2 and len(sizes) < len(train)
    shapes = {read_image(demo_dir / f.image).shape[:2] for f in train}
    assert all(200 <= h <= 320 and 200 <= w <= 320 for h, w in shapes)
    lines = (demo_dir / "solution.csv").read_text().splitlines()
    assert lines[0] == "Id,Predicted" and len(lines) == 1 + 8 * 68 * 2
    ids = [int(ln.split(",")[0]) for ln in lines[1:]]
    assert ids == list(range(8 * 68 * 2))


def test_solution_is_the_truth_of_the_test_boxes(demo_dir):
    test = load_xml(demo_dir / TEST, IBUG68, require_parts=False)
    vals = np.array([float(ln.split(",")[1]) for ln in (demo_dir / "solution.csv").read_text().splitlines()[1:]])
    truth = vals.reshape(len(test), 68, 2)
    for f, kp in zip(test, truth):
        left, top, w, h = f.box
        cx, cy = kp[:, 0].mean(), kp[:, 1].mean()
        assert left < cx < left + w and top < cy < top + h  # each face's points lie in its box
        # box ~ keypoint extent (x) and brow-to-chin (y), jittered by ~10 %
        assert abs(w - np.ptp(kp[:, 0])) < 0.35 * w and abs((top + h) - kp[:, 1].max()) < 0.3 * h


def test_same_seed_is_byte_identical_other_seed_differs(tmp_path):
    a = generate_demo(tmp_path / "a", n_train=10, n_test=3, seed=5)
    b = generate_demo(tmp_path / "b", n_train=10, n_test=3, seed=5, n_jobs=2)
    c = generate_demo(tmp_path / "c", n_train=10, n_test=3, seed=6)
    for name in (TRAIN, TEST, "solution.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
        assert (a / name).read_bytes() != (c / name).read_bytes(), name
    imgs = sorted(p.relative_to(a) for p in a.rglob("*.jpg"))
    assert imgs == sorted(p.relative_to(b) for p in b.rglob("*.jpg"))
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in imgs)


def test_flip_semantics_on_demo_faces(demo_dir):
    faces = load_xml(demo_dir / TRAIN, IBUG68)
    small = 0
    for f in faces:
        kp = f.keypoints
        d = kp[45] - kp[36]
        roll = math.degrees(math.atan2(d[1], d[0]))
        if abs(roll) < 25:
            small += 1
            assert kp[36, 0] < kp[39, 0] < kp[42, 0] < kp[45, 0], f.face_id
            assert kp[0, 0] < kp[16, 0] and kp[17, 0] < kp[26, 0] and kp[48, 0] < kp[54, 0], f.face_id
            assert kp[27, 1] < kp[30, 1] < kp[51, 1] < kp[57, 1] < kp[8, 1], f.face_id
    assert small >= len(faces) // 2


def test_faces_vary_in_pose_and_appearance(tmp_path):
    d = generate_demo(tmp_path / "v", n_train=80, n_test=1, seed=1)
    faces = load_xml(d / TRAIN, IBUG68)
    kp = np.stack([f.keypoints for f in faces])
    eye = kp[:, 45] - kp[:, 36]
    roll = np.degrees(np.arctan2(eye[:, 1], eye[:, 0]))
    assert roll.min() < -30 and roll.max() > 30  # in-plane rotation beyond +-30 deg
    # yaw: the nose tip moves off the eye midline, to both sides
    mid = (kp[:, 39] + kp[:, 42]) / 2
    off = ((kp[:, 30] - mid) @ np.array([1.0, 0.0]) * np.cos(np.radians(roll))
           + (kp[:, 30] - mid) @ np.array([0.0, 1.0]) * np.sin(np.radians(roll))) / np.linalg.norm(eye, axis=1)
    assert off.min() < -0.15 and off.max() > 0.15
    width = np.linalg.norm(kp[:, 16] - kp[:, 0], axis=1)
    assert width.max() > 1.5 * width.min()  # scale varies
    gray = [read_image(d / f.image) for f in faces]
    n_gray = sum(np.array_equal(g[..., 0], g[..., 2]) for g in gray)
    assert 0 < n_gray < len(gray)  # some grayscale photos, mostly colour
    # a few boxes leave the picture (the crop must pad them)
    out = [f for f, g in zip(faces, gray) if f.box[0] < 0 or f.box[1] < 0 or f.box[0] + f.box[2] > g.shape[1]
           or f.box[1] + f.box[3] > g.shape[0]]
    assert 0 < len(out) < len(faces) // 4


def test_cli_options_default_from_params_and_resolved_written(tmp_path, capsys):
    out = tmp_path / "demo"
    params = tmp_path / "p.yaml"
    params.write_text("demo:\n  n_train: 6\n  n_test: 2\n  seed: 4\n")
    main(["demo-data", str(out), "--params", str(params), "--n-test", "3"])
    assert len(load_xml(out / TRAIN, IBUG68)) == 6 and len(load_xml(out / TEST, IBUG68, False)) == 3
    assert "n_test: 3" in (out / "params.resolved.yaml").read_text()
    again = tmp_path / "again"
    generate_demo(again, 6, 3, 4)
    assert (again / TRAIN).read_bytes() == (out / TRAIN).read_bytes()


def test_cli_refuses_to_replace_a_foreign_folder(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit) as e:
        main(["demo-data", str(out), "--n-train", "2", "--n-test", "1"])
    assert e.value.code == 2
    assert "mine" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left
    # an earlier demo output is replaced as a whole
    d = generate_demo(tmp_path / "d", 3, 1, 0)
    (d / "stale.jpg").write_bytes(b"x")
    generate_demo(d, 3, 1, 1)
    assert not (d / "stale.jpg").exists() and (d / TRAIN).exists()


def test_300w_layout_names_and_mirrors(tmp_path):
    """layout 300w: the full set's subset folders and names, one file per face of a
    multi-face photo, and beside every training image its `_mirror.jpg` copy: the image
    flipped left-right, the box and points mirrored (x -> W - 1 - x, renumbered by the flip
    permutation)."""
    import json
    import re

    ds = generate_demo(tmp_path / "d", n_train=200, n_test=6, seed=4, layout="300w")
    train = load_xml(ds / TRAIN, IBUG68, require_parts=True)
    test = load_xml(ds / TEST, IBUG68, require_parts=False)
    assert len(train) == 200 and len(test) == 6
    patterns = [r"afw/\d{10}_\d+", r"helen/trainset/\d{9}_\d+", r"lfpw/trainset/image_\d{4}",
                r"ibug/image_\d{3}_\d{2}"]
    originals = [f for f in train if not f.image.endswith("_mirror.jpg")]
    assert len(originals) == 100
    for f in originals:
        assert any(re.fullmatch(p + (r"\.png" if "lfpw" in p else r"\.jpg"), f.image) for p in patterns), f.image
    assert {f.image.split("/")[0] for f in originals} == {"afw", "helen", "lfpw", "ibug"}
    assert all(re.fullmatch(r"(helen/testset/\d{9}_\d+\.jpg|lfpw/testset/image_\d{4}\.png)", f.image) for f in test)
    photos = json.loads((ds / MARKER).read_text())["photos"]
    per_photo = np.unique([photos[f.image] for f in originals], return_counts=True)[1]
    assert per_photo.max() == 2  # some photos hold two faces, one file each
    by_image = {f.image: f for f in train}
    perm = list(IBUG68.flip_perm)
    for f in originals:
        m = by_image[f.image.rsplit(".", 1)[0] + "_mirror.jpg"]
        img, mimg = read_image(ds / f.image), read_image(ds / m.image)
        w = img.shape[1]
        assert mimg.shape == img.shape
        assert np.abs(mimg.astype(int) - img[:, ::-1].astype(int)).mean() < 6  # JPEG noise only
        np.testing.assert_array_equal(m.keypoints, np.stack([w - 1 - f.keypoints[:, 0], f.keypoints[:, 1]], 1)[perm])
        assert m.box == (w - f.box[0] - f.box[2], f.box[1], f.box[2], f.box[3])
        assert photos[m.image] == photos[f.image]
    with pytest.raises(Exception, match="demo.n_train must be even"):
        generate_demo(tmp_path / "odd", n_train=7, n_test=2, layout="300w")
