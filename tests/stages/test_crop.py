"""Crop and cache: the stored transform maps cached keypoints back onto the XML exactly,
pixels land where the transform says, padding, atomic output, worker errors; crop-extra's
training-only caches of data.extra_train (their errors: tests/test_bad_input.py)."""

import json

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.formats.annotations import Face, crop_faces, load_xml
from pipeline.formats.cache import load_cache
from pipeline.keypoints.geometry import crop_one, crop_transform, to_crop, to_original
from pipeline.keypoints.schema import IBUG68
from pipeline.stages.crop import run_crop

META = ["index", "face_id", "group", "image", "box_left", "box_top", "box_width", "box_height",
        "image_width", "image_height"]


def _cfg(data_dir, *sets):
    return load_config(None, [f"data.dir={data_dir}", "crop.n_jobs=1", *sets])


def _check_cache(split, xml, size):
    c = load_cache(split)
    faces = load_xml(xml, IBUG68, require_parts=c.keypoints is not None)
    assert len(c) == len(faces)
    raw = np.load(split / "faces.npy", mmap_mode="r")
    assert isinstance(c.faces, np.memmap) and raw.dtype == np.uint8 and raw.shape == (len(faces), size, size, 3)
    assert c.crop_to_orig.shape == (len(faces), 2, 3) and c.crop_to_orig.dtype == np.float64
    assert list(c.meta.columns) == META and c.meta["face_id"].tolist() == [f.face_id for f in faces]
    assert c.info["size"] == size and c.info["n"] == len(faces) and c.info["schema"]["name"] == "ibug68"
    assert (c.meta[["box_left", "box_top", "box_width", "box_height"]].to_numpy() == [f.box for f in faces]).all()
    if c.keypoints is not None:
        truth = np.stack([f.keypoints for f in faces])
        assert c.keypoints.dtype == np.float32 and c.keypoints_orig.dtype == np.float64
        np.testing.assert_array_equal(c.keypoints_orig, truth)
        back = to_original(c.keypoints, c.crop_to_orig)
        assert np.abs(back - truth).max() < 0.5  # float32 crop coords: in fact ~1e-4
        np.testing.assert_allclose(to_crop(truth, c.crop_to_orig), c.keypoints, atol=1e-3)
        # the face sits in the middle of its crop: the box is expanded around its centre
        assert np.abs(c.keypoints.mean(axis=(0, 1)) - size / 2).max() < size * 0.15
    return c


def test_demo_cache_round_trip(demo_dir, tmp_path):
    counts = run_crop(_cfg(demo_dir, "crop.side=40"), tmp_path / "cache")
    assert counts == {"train": 48, "test": 8}
    tr = _check_cache(tmp_path / "cache" / "train", demo_dir / "labels_ibug_300W_train.xml", 40)
    te = _check_cache(tmp_path / "cache" / "test", demo_dir / "labels_ibug_300W_test_parsed.xml", 40)
    assert te.keypoints is None and te.info["has_keypoints"] is False and tr.info["has_keypoints"] is True
    assert not (tmp_path / "cache" / "test" / "keypoints.npy").exists()
    assert "crop:" in (tmp_path / "cache" / "params.resolved.yaml").read_text()


def test_real_cache_round_trip(real_dir, make_dataset, tmp_path):
    # a subset of the real faces; the image folders are linked, never copied
    import xml.etree.ElementTree as ET

    root = make_dataset()
    for sub in ("afw", "helen"):
        (root / sub).symlink_to(real_dir / sub)
    for name, keep in (("labels_ibug_300W_train.xml", 60), ("labels_ibug_300W_test_parsed.xml", 20)):
        tree = ET.parse(real_dir / name)
        images = tree.getroot().find("images")
        for im in images.findall("image")[keep:]:
            images.remove(im)
        tree.write(root / name)
    run_crop(_cfg(root, "crop.side=64"), tmp_path / "c")
    c = _check_cache(tmp_path / "c" / "train", root / "labels_ibug_300W_train.xml", 64)
    assert len(c) == 60 and c.faces[:, 20:44, 20:44].mean() > 30  # real content in the middle
    _check_cache(tmp_path / "c" / "test", root / "labels_ibug_300W_test_parsed.xml", 64)


def test_transform_geometry():
    a = crop_transform((10, 20, 100, 50), 1.2, 60)  # square side 120 about centre (60, 45)
    corners = to_original(np.array([[[-0.5, -0.5], [59.5, 59.5]]]), a[None])[0]
    np.testing.assert_allclose(corners, [[0 - 0.5, -15 - 0.5], [120 - 0.5, 105 - 0.5]])
    rng = np.random.default_rng(0)
    pts, aa = rng.uniform(-50, 150, (4, 7, 2)), np.stack([crop_transform(b, 1.3, 48) for b in
                                                           rng.uniform(5, 80, (4, 4))])
    np.testing.assert_allclose(to_crop(to_original(pts, aa), aa), pts, atol=1e-9)


@pytest.mark.parametrize("side,size", [(64, 64), (200, 48)])
def test_pixels_land_where_the_transform_says(side, size):
    # a bright dot in a dark photo must appear at to_crop(dot) (scale 1, and strong reduction)
    img = np.zeros((300, 320, 3), np.uint8)
    dot = np.array([171.0, 143.0])
    import cv2

    cv2.circle(img, (171, 143), 3 if side > 100 else 0, (255, 255, 255), -1)
    a = crop_transform((160 - side / 2, 150 - side / 2, side, side), 1.0, size)
    crop = crop_one(img, a, size).astype(np.float64)[..., 0]
    ys, xs = np.mgrid[0:size, 0:size]
    centroid = np.array([(crop * xs).sum(), (crop * ys).sum()]) / crop.sum()
    expected = to_crop(dot[None, None], a[None])[0, 0]
    assert np.abs(centroid - expected).max() < 0.25


def test_box_partly_outside_is_padded(make_dataset, face_points):
    photo = np.full((120, 140, 3), 200, np.uint8)
    root = make_dataset(images={"a.png": photo},
                        train=[("a.png", [((-40, -30, 90, 100), face_points - 70)])],
                        test=[("a.png", [((100, 90, 80, 80), None)])])
    faces = load_xml(root / "labels_ibug_300W_train.xml", IBUG68)
    crops, a = crop_faces(faces, root, 50, 1.25)
    assert crops.shape == (1, 50, 50, 3) and a.shape == (1, 2, 3)
    c = crops[0]
    assert (c[:5, :5] == 0).all() and (c[-5:, -5:] == 200).all()  # black padding top-left
    run_crop(_cfg(root, "crop.side=50"), root / "cache")
    te = load_cache(root / "cache" / "test")
    assert (te.faces[0, -3:, -3:] == 0).all() and (te.faces[0, :3, :3] == 200).all()


def test_failure_writes_nothing_and_keeps_the_old_cache(demo_dir, make_dataset, face_points, tmp_path):
    out = tmp_path / "cache"
    run_crop(_cfg(demo_dir, "crop.side=16"), out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    photo = np.zeros((100, 100, 3), np.uint8)
    root = make_dataset(images={"a.jpg": photo, "b.jpg": b"\xff\xd8\xff garbage" * 30},
                        train=[("a.jpg", [((20, 20, 50, 50), face_points * 0.5)])],
                        test=[("b.jpg", [((20, 20, 50, 50), None)])])
    with pytest.raises(PipelineError, match="b.jpg.*cannot decode"):
        run_crop(_cfg(root, "crop.side=16"), out)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # the failing run (train was fine) changed nothing
    assert not [p for p in tmp_path.rglob(".*tmp*")]


def test_worker_error_comes_back_as_pipeline_error(make_dataset, face_points):
    # PipelineError does not pickle; the joblib worker must hand it back intact
    photo = np.zeros((100, 100, 3), np.uint8)
    images = {f"{i}.jpg": photo for i in range(5)}
    images["3.jpg"] = b"\xff\xd8\xff not a jpeg" * 30
    root = make_dataset(images=images, test=[(f"{i}.jpg", [((20, 20, 50, 50), None)]) for i in range(5)])
    faces = load_xml(root / "labels_ibug_300W_test_parsed.xml", IBUG68, require_parts=False)
    with pytest.raises(PipelineError, match=r"3\.jpg.*cannot decode"):
        crop_faces(faces, root, 16, 1.2, n_jobs=2)
    crops, _ = crop_faces(faces[:3], root, 16, 1.2, n_jobs=2)
    assert crops.shape == (3, 16, 16, 3)


def test_refuses_to_replace_a_foreign_folder(demo_dir, tmp_path):
    (tmp_path / "c" / "train").mkdir(parents=True)
    (tmp_path / "c" / "train" / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match="not a face cache"):
        run_crop(_cfg(demo_dir), tmp_path / "c")
    assert (tmp_path / "c" / "train" / "notes.txt").read_text() == "mine"


def test_cli_and_missing_demo(demo_dir, tmp_path, monkeypatch, capsys):
    main(["crop", "--set", f"data.dir={demo_dir}", "--set", "crop.side=24", "--set", "crop.n_jobs=1",
          "--out", str(tmp_path / "c")])
    info = json.loads((tmp_path / "c" / "train" / "info.json").read_text())
    assert info["size"] == 24 and info["expand"] == 1.25 and info["xml"].endswith("labels_ibug_300W_train.xml")
    monkeypatch.chdir(tmp_path)  # data.dir null -> data/demo, absent here
    with pytest.raises(SystemExit) as e:
        main(["crop", "--out", str(tmp_path / "c2")])
    assert e.value.code == 2 and "data/demo" in capsys.readouterr().err
    with pytest.raises(PipelineError, match="no face cache"):
        load_cache(tmp_path / "nowhere")


def test_crop_faces_refuses_paths_leaving_the_root():
    # crop_faces takes Face objects from any caller (predict-image); such a path is still refused
    f = Face("../x.jpg", (0, 0, 10, 10), None, "x", "x")
    with pytest.raises(PipelineError, match="leaves the dataset folder"):
        crop_faces([f], "/tmp", 16, 1.2)


def test_strong_reduction_is_low_passed():
    # 1-px stripes reduced ~4x must come out nearly flat grey, not as aliasing moire
    img = np.zeros((400, 400, 3), np.uint8)
    img[:, ::2] = 255
    a = crop_transform((100, 100, 200, 200), 1.0, 48)
    crop = crop_one(img, a, 48).astype(np.float64)
    assert abs(crop.mean() - 127.5) < 10 and crop.std() < 12


def test_nose1_schema_keeps_part_30(demo_dir, tmp_path):
    run_crop(_cfg(demo_dir, "crop.side=16", "data.schema=nose1"), tmp_path / "c")
    c = load_cache(tmp_path / "c" / "train")
    full = np.stack([f.keypoints for f in load_xml(demo_dir / "labels_ibug_300W_train.xml", IBUG68)])
    assert c.schema.name == "nose1" and c.keypoints.shape == (48, 1, 2)
    np.testing.assert_array_equal(c.keypoints_orig[:, 0], full[:, 30])


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_inputs_give_byte_identical_caches(demo_dir, tmp_path):
    """Every file of two crops of the same inputs is the same (so DVC skips what follows),
    and both splits of a run carry one id; a changed photo gives another id."""
    import shutil

    cfg = _cfg(demo_dir, "crop.side=16")
    run_crop(cfg, tmp_path / "a")
    run_crop(cfg, tmp_path / "b")
    a = _files(tmp_path / "a")
    assert {"train/info.json", "test/info.json", "params.resolved.yaml", "train/faces.npy"} <= set(a)
    assert a == _files(tmp_path / "b")
    run = json.loads(a["train/info.json"])["run"]
    assert run == json.loads(a["test/info.json"])["run"]

    ds = tmp_path / "ds"
    shutil.copytree(demo_dir, ds)
    photo = sorted((ds / "images" / "test").iterdir())[0]
    photo.write_bytes(photo.read_bytes() + b"\0")  # same pixels, other bytes: what was read differs
    run_crop(_cfg(ds, "crop.side=16"), tmp_path / "c")
    other = json.loads((tmp_path / "c" / "train" / "info.json").read_text())["run"]
    assert other != run and (tmp_path / "c" / "train" / "faces.npy").read_bytes() == a["train/faces.npy"]


# ------------------------------------------------------------------ crop-extra (data.extra_train)

def test_main_crop_is_byte_identical_with_or_without_extras(demo_dir, tmp_path):
    """data.extra_train is crop-extra's: the main cache (run id, params.resolved.yaml, every
    array) is the same with extras named, so adding one re-trains without re-cropping."""
    run_crop(_cfg(demo_dir, "crop.side=16"), tmp_path / "plain")
    run_crop(_cfg(demo_dir, "crop.side=16", "data.extra_train={a: elsewhere, b: ../other}"), tmp_path / "extras")
    plain = _files(tmp_path / "plain")
    assert "train/params.resolved.yaml" in plain and plain == _files(tmp_path / "extras")
    assert b"extra_train" not in plain["params.resolved.yaml"]


def test_crop_extra_caches_the_training_faces_of_its_folder(extra_ws, tiny_workspace, tmp_path):
    """One training split (no test/) in the cache format, cropped like the main cache,
    with photos.json (sha256 per photo) and what train checks in info.json's `extra`; the
    same inputs give the same bytes."""
    import hashlib

    from pipeline.stages.crop import run_crop_extra

    folder, split = extra_ws["folder"], extra_ws["root"] / "more"
    c = _check_cache(split, folder / "labels_ibug_300W_train.xml", 32)
    main = load_cache(tiny_workspace / "cache" / "train")
    assert len(c) == 12 and not (split / "test").exists() and not (split / "train").exists()
    assert {k: c.info[k] for k in ("size", "expand", "label_origin")} == \
        {k: main.info[k] for k in ("size", "expand", "label_origin")}
    extra = c.info["extra"]
    assert extra["name"] == "more" and extra["folder"] == str(folder) and extra["main_run"] == main.info["run"]
    assert extra["params"] == {"data": {"train_xml": "labels_ibug_300W_train.xml", "schema": "ibug68",
                                        "custom_schema": None, "label_origin": 0.0},
                               "crop": {"expand": 1.25, "side": 32}}
    photos = json.loads((split / "photos.json").read_text())
    assert set(photos) == set(c.meta["image"])
    assert all(hashlib.sha256((folder / rel).read_bytes()).hexdigest() == h for rel, h in photos.items())
    assert c.info["run"] != main.info["run"]
    run_crop_extra(load_config(None, extra_ws["sets"]), "more", tmp_path / "again", tiny_workspace / "cache")
    assert _files(tmp_path / "again") == _files(split)
