"""Annotation readers (imglab XML, .pts) and image decoding, real-data quirks and every
kind of bad input (PipelineError naming the file; exit 2 and nothing written via the CLI)."""

import re
import struct
import subprocess
import sys

import cv2
import numpy as np
import pytest

from pipeline.cli import main
from pipeline.core.errors import PipelineError
from pipeline.formats.annotations import load_xml, photo_group, read_image, xml_comment, xml_text
from pipeline.keypoints.schema import IBUG68, NOSE1

TRAIN = "labels_ibug_300W_train.xml"
TEST = "labels_ibug_300W_test_parsed.xml"


def _photo(h=160, w=150, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ---------------------------------------------------------------- real data


def test_real_train_and_test_xml(real_dir):
    train = load_xml(real_dir / TRAIN, IBUG68, require_parts=True)
    test = load_xml(real_dir / TEST, IBUG68, require_parts=False)
    assert len(train) == 1107 and len(test) == 100
    assert all(f.keypoints.shape == (68, 2) and f.keypoints.dtype == np.float64 for f in train)
    assert all(f.keypoints is None for f in test)
    assert len({f.face_id for f in train}) == 1107 and len({f.face_id for f in test}) == 100
    by_id = {f.face_id: f for f in test}
    a, b = by_id["afw/afw/1130084326_1"], by_id["afw/afw/1130084326_2"]
    assert a.group == b.group == "afw/afw/1130084326"
    assert all(isinstance(v, float) and v == v for f in train for v in f.box)
    # part '30' (nose tip) is what nose1 keeps
    nose = load_xml(real_dir / TRAIN, NOSE1)
    assert nose[5].keypoints.shape == (1, 2)
    np.testing.assert_array_equal(nose[5].keypoints[0], train[5].keypoints[30])


def test_real_parts_sorted_by_number_not_file_order(make_dataset, face_points):
    parts = [(f"{i:02d}", x, y) for i, (x, y) in enumerate(face_points.tolist())]
    shuffled = [parts[i] for i in np.random.default_rng(0).permutation(68)]
    root = make_dataset(images={"a.jpg": _photo()}, train=[("a.jpg", [((40, 40, 80, 90), shuffled)])])
    (face,) = load_xml(root / TRAIN, IBUG68)
    np.testing.assert_allclose(face.keypoints, face_points)


def test_photo_group_and_face_ids(make_dataset):
    assert photo_group("afw/1130084326_1.jpg") == photo_group("afw/1130084326_2.jpg") == "afw/1130084326"
    assert photo_group("helen/trainset/100032540_1.jpg") == "helen/trainset/100032540"
    assert photo_group("other/x_1.jpg") != photo_group("afw/x_1.jpg")  # folders keep photos apart
    assert photo_group("a/face.png") == "a/face"
    root = make_dataset(images={"p/12_1.jpg": _photo(), "p/12_2.jpg": _photo(seed=1)},
                        test=[("p/12_1.jpg", [((10, 10, 50, 50), None), ((80, 60, 40, 40), None)]),
                              ("p/12_2.jpg", [((20, 20, 60, 60), None)])])
    faces = load_xml(root / TEST, IBUG68, require_parts=False)
    assert [f.face_id for f in faces] == ["p/12_1#0", "p/12_1#1", "p/12_2"]
    assert {f.group for f in faces} == {"p/12"}
    assert faces[1].box == (80.0, 60.0, 40.0, 40.0)


# ---------------------------------------------------------------- quirks that are valid


def _exif_jpeg(img_bgr: np.ndarray, orientation: int) -> bytes:
    """A JPEG with an APP1 Exif segment holding only the Orientation tag."""
    ok, buf = cv2.imencode(".jpg", img_bgr)
    data = buf.tobytes()
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1)
    tiff += struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    payload = b"Exif\x00\x00" + tiff
    app1 = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    return data[:2] + app1 + data[2:]


def test_quirks_load(make_dataset, face_points):
    rgb = _photo(120, 200)
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 128, np.uint8)])
    rgba[0, 0, :3] = (255, 0, 0)  # a red pixel must stay red (RGB order, alpha dropped)
    gray = rgb[..., 0].copy()
    deep = rgb.astype(np.uint16) * 257  # 16-bit PNG: v * 257 must read back as v
    exif = _exif_jpeg(np.ascontiguousarray(rgb[..., ::-1]), 6)  # "rotate 90": must be ignored
    images = {"q/gray.jpg": gray, "q/alpha.png": rgba, "q/deep.png": deep, "q/exif.jpg": exif}
    boxes = [((40, 40, 80, 90), face_points)]
    outside = [((-30, -20, 100, 110), face_points - 60)]  # box and points partly outside the image
    root = make_dataset(images=images, train=[(k, boxes) for k in images] + [("q/alpha.png", outside)])
    faces = load_xml(root / TRAIN, IBUG68)
    assert len(faces) == 5 and faces[-1].box == (-30.0, -20.0, 100.0, 110.0)
    for rel in images:
        img = read_image(root / rel)
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3, rel
    g = read_image(root / "q/gray.jpg")
    assert g.shape == (120, 200, 3) and np.array_equal(g[..., 0], g[..., 2])
    a = read_image(root / "q/alpha.png")
    assert tuple(a[0, 0]) == (255, 0, 0)
    np.testing.assert_array_equal(a[1:, 1:], rgb[1:, 1:])
    np.testing.assert_array_equal(read_image(root / "q/deep.png"), rgb)
    assert read_image(root / "q/exif.jpg").shape == (120, 200, 3)  # stored pixels, not rotated


# ---------------------------------------------------------------- bad input


def _base(face_points):
    """(images, train entries, test entries) of a valid two-image data set."""
    images = {"img/a.jpg": _photo(), "img/b.jpg": _photo(seed=1)}
    train = [("img/a.jpg", [((40, 40, 80, 90), face_points)])]
    test = [("img/b.jpg", [((30, 30, 70, 70), None)])]
    return images, train, test


def _parts(face_points):
    return [(f"{i:02d}", x, y) for i, (x, y) in enumerate(face_points.tolist())]


def _case(name, face_points):
    """-> (images, train, test, file named in the message, message regex)."""
    images, train, test = _base(face_points)
    p = _parts(face_points)
    box = (40, 40, 80, 90)
    if name == "truncated_xml":
        from pipeline.formats.annotations import xml_text

        return images, xml_text(train)[:500], test, TRAIN, "malformed XML"
    if name == "no_images_element":
        return images, "<?xml version='1.0'?>\n<dataset><name>x</name></dataset>\n", test, TRAIN, "no <images>"
    if name == "missing_image":
        return images, [("img/nope.jpg", [(box, face_points)])], test, TRAIN, "img/nope.jpg.*not found"
    if name == "directory_as_image":
        return {**images, "img/dir.jpg/x.jpg": _photo()}, [("img/dir.jpg", [(box, face_points)])], test, \
            TRAIN, "img/dir.jpg.*directory"
    if name == "zero_byte_image":
        return {**images, "img/empty.jpg": b""}, [("img/empty.jpg", [(box, face_points)])], test, TRAIN, \
            "img/empty.jpg.*0 bytes"
    if name == "zero_width_box":
        return images, [("img/a.jpg", [((40, 40, 0, 90), face_points)])], test, TRAIN, "non-positive size"
    if name == "negative_height_box":
        return images, train, [("img/b.jpg", [((30, 30, 70, -5), None)])], TEST, "non-positive size"
    if name == "too_few_parts":
        return images, [("img/a.jpg", [(box, p[:67])])], test, TRAIN, "67 parts.*expects 68"
    if name == "duplicate_part":
        return images, [("img/a.jpg", [(box, p[:67] + [("05", 1, 2)])])], test, TRAIN, "duplicate part name '05'"
    if name == "duplicate_part_numeric":
        return images, [("img/a.jpg", [(box, p[:67] + [("5", 1, 2)])])], test, TRAIN, "duplicate part name"
    if name == "part_out_of_range":
        return images, [("img/a.jpg", [(box, p[:67] + [("68", 1, 2)])])], test, TRAIN, "part name '68'"
    if name == "non_numeric_coordinate":
        return images, [("img/a.jpg", [(box, p[:10] + [("10", "abc", 3)] + p[11:])])], test, TRAIN, \
            "part 10.*x='abc' is not a number"
    if name == "nan_coordinate":
        return images, [("img/a.jpg", [(box, p[:10] + [("10", 3, "nan")] + p[11:])])], test, TRAIN, \
            "part 10.*y='nan' is not finite"
    if name == "non_numeric_box":
        return images, [("img/a.jpg", [((40, "x", 80, 90), face_points)])], test, TRAIN, "top='x'"
    if name == "dotdot_path":
        return images, [("../img/a.jpg", [(box, face_points)])], test, TRAIN, "leaves the dataset folder"
    if name == "absolute_path":
        return images, [("/etc/passwd", [(box, face_points)])], test, TRAIN, "leaves the dataset folder"
    if name == "train_box_without_parts":
        return images, [("img/a.jpg", [(box, None)])], test, TRAIN, "no <part>"
    raise AssertionError(name)


BAD = ["truncated_xml", "no_images_element", "missing_image", "directory_as_image", "zero_byte_image",
       "zero_width_box", "negative_height_box", "too_few_parts", "duplicate_part", "duplicate_part_numeric",
       "part_out_of_range", "non_numeric_coordinate", "nan_coordinate", "non_numeric_box", "dotdot_path",
       "absolute_path", "train_box_without_parts"]


@pytest.mark.parametrize("name", BAD)
def test_bad_input_raises_naming_the_file(name, make_dataset, face_points):
    images, train, test, fname, pattern = _case(name, face_points)
    root = make_dataset(images=images, train=train, test=test)
    xml, req = (root / TRAIN, True) if fname == TRAIN else (root / TEST, False)
    with pytest.raises(PipelineError, match=pattern) as e:
        load_xml(xml, IBUG68, require_parts=req)
    assert fname in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", BAD + ["corrupt_image"])
def test_bad_input_via_cli_exits_2_and_writes_nothing(name, make_dataset, face_points, tmp_path, capsys):
    if name == "corrupt_image":  # found when decoding, in the crop stage
        images, train, test = _base(face_points)
        images["img/b.jpg"] = b"\xff\xd8\xff\xe0 this is not really a jpeg" * 20
        fname, pattern = "img/b.jpg", "cannot decode"
    else:
        images, train, test, fname, pattern = _case(name, face_points)
    root = make_dataset(images=images, train=train, test=test)
    out = tmp_path / "out" / "cache"
    with pytest.raises(SystemExit) as e:
        main(["crop", "--set", f"data.dir={root}", "--set", "crop.n_jobs=1", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and fname in err
    assert re.search(pattern, err), err
    assert not (tmp_path / "out").exists()


def test_cli_subprocess_exit_status(make_dataset, face_points, tmp_path):
    images, train, test, _, _ = _case("dotdot_path", face_points)
    root = make_dataset(images=images, train=train, test=test)
    out = tmp_path / "cache"
    r = subprocess.run([sys.executable, "-m", "pipeline", "crop", "--set", f"data.dir={root}", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and TRAIN in r.stderr and "../img/a.jpg" in r.stderr
    assert not out.exists()


def test_read_image_errors(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)
    (tmp_path / "d.jpg").mkdir()
    for name, msg in (("empty.png", "0 bytes"), ("junk.png", "cannot decode"), ("d.jpg", "is a directory, expected an image file"),
                      ("missing.jpg", "not found")):
        with pytest.raises(PipelineError, match=msg) as e:
            read_image(tmp_path / name)
        assert name in str(e.value)


def test_xml_comment_is_what_the_maker_wrote_or_none(tmp_path):
    entries = [("a.png", [((1, 2, 3, 4), None)])]
    (tmp_path / "with.xml").write_text(xml_text(entries, "Test faces", " boxes from\n  dlib's HOG detector "))
    (tmp_path / "without.xml").write_text(xml_text(entries, "Test faces"))
    assert xml_comment(tmp_path / "with.xml") == "boxes from dlib's HOG detector"
    assert xml_comment(tmp_path / "without.xml") is None
