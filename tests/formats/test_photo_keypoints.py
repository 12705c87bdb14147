"""The photo keypoints of `pipeline predict-image`: keypoints.csv and <stem>_keypoints.json."""

import json

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.formats.photo_keypoints import (
    photo_record,
    read_photo_json,
    read_photo_keypoints_csv,
    write_photo_json,
    write_photo_keypoints_csv,
)

# two keypoints; a path with a comma (quoted by csv) and a photo without a face; values that
# exercise the rounding (half-way cases, a negative zero)
PHOTOS = [("a/one,two.jpg", np.array([[10.004, 20.005, 30.5, 40.0], [0.0, -1.255, 5.0, 6.0]]),
           np.array([[[1.0005, 2.0004], [-0.0004, 3.14159]], [[100.0, 200.0], [1e-3, 12345.6789]]]),
           np.array([[9.0, 19.0, 33.333, 44.444], [1.0, 2.0, 3.0, 4.0]])),
          ('b "q".png', np.zeros((0, 4)), np.zeros((0, 2, 2)), np.zeros((0, 4)))]

# what predict-image's inline writers produced for PHOTOS before the format had a module
OLD_CSV = (b'image,face,box_left,box_top,box_width,box_height,x0,y0,x1,y1\n'
           b'"a/one,two.jpg",0,10.00,20.00,30.50,40.00,1.000,2.000,-0.000,3.142\n'
           b'"a/one,two.jpg",1,0.00,-1.25,5.00,6.00,100.000,200.000,0.001,12345.679\n')
OLD_JSON = (b'{\n "image": "a/one,two.jpg",\n "width": 640,\n "height": 480,\n "detector": "haar (OpenCV)",\n'
            b' "schema": "two",\n "names": [\n  "l",\n  "r"\n ],\n "checkpoints": [\n  "m/a.pt"\n ],\n'
            b' "tta": "flip",\n "n_faces": 2,\n "faces": [\n  {\n   "box": [\n    10.0,\n    20.0,\n    30.5,\n'
            b'    40.0\n   ],\n   "detector_box": [\n    9.0,\n    19.0,\n    33.33,\n    44.44\n   ],\n'
            b'   "points": [\n    [\n     1.0,\n     2.0\n    ],\n    [\n     -0.0,\n     3.142\n    ]\n   ]\n'
            b'  },\n  {\n   "box": [\n    0.0,\n    -1.25,\n    5.0,\n    6.0\n   ],\n   "detector_box": [\n'
            b'    1.0,\n    2.0,\n    3.0,\n    4.0\n   ],\n   "points": [\n    [\n     100.0,\n     200.0\n'
            b'    ],\n    [\n     0.001,\n     12345.679\n    ]\n   ]\n  }\n ]\n}\n')
OLD_JSON_NO_FACE = (b'{\n "image": "b \\"q\\".png",\n "width": 640,\n "height": 480,\n "detector": "haar (OpenCV)",\n'
                    b' "schema": "two",\n "names": [\n  "l",\n  "r"\n ],\n "checkpoints": [\n  "m/a.pt"\n ],\n'
                    b' "tta": "flip",\n "n_faces": 0,\n "faces": []\n}\n')


def _record(photo):
    image, boxes, points, detector_boxes = photo
    return photo_record(image, 640, 480, detector="haar (OpenCV)", schema="two", names=("l", "r"),
                        checkpoints=["m/a.pt"], tta="flip", boxes=boxes, detector_boxes=detector_boxes, points=points)


def test_csv_bytes_are_those_predict_image_wrote_before(tmp_path):
    write_photo_keypoints_csv(tmp_path / "k.csv", [p[:3] for p in PHOTOS], 2)
    assert (tmp_path / "k.csv").read_bytes() == OLD_CSV
    write_photo_keypoints_csv(tmp_path / "none.csv", [PHOTOS[1][:3]], 2)
    assert (tmp_path / "none.csv").read_bytes() == OLD_CSV.split(b"\n")[0] + b"\n"


def test_json_bytes_are_those_predict_image_wrote_before(tmp_path):
    write_photo_json(tmp_path / "a.json", _record(PHOTOS[0]))
    assert (tmp_path / "a.json").read_bytes() == OLD_JSON
    write_photo_json(tmp_path / "b.json", _record(PHOTOS[1]))
    assert (tmp_path / "b.json").read_bytes() == OLD_JSON_NO_FACE


def test_csv_round_trip(tmp_path):
    pts = np.random.default_rng(0).uniform(-50, 500, (3, 68, 2))
    boxes = np.random.default_rng(1).uniform(0, 300, (3, 4))
    write_photo_keypoints_csv(tmp_path / "k.csv", [("p,1.jpg", boxes[:2], pts[:2]), ("empty.png", [], []),
                                                   ("p2.png", boxes[2:], pts[2:])], 68)
    back = read_photo_keypoints_csv(tmp_path / "k.csv")
    assert back["image"].tolist() == ["p,1.jpg", "p,1.jpg", "p2.png"] and back["face"].tolist() == [0, 1, 0]
    np.testing.assert_allclose(back["box"], boxes, atol=5e-3)
    np.testing.assert_allclose(back["points"], pts, atol=5e-4)
    write_photo_keypoints_csv(tmp_path / "none.csv", [], 5)
    assert read_photo_keypoints_csv(tmp_path / "none.csv")["points"].shape == (0, 5, 2)


def test_json_round_trip(tmp_path):
    for photo in PHOTOS:
        record = _record(photo)
        write_photo_json(tmp_path / "a.json", record)
        assert read_photo_json(tmp_path / "a.json") == record


HEAD = "image,face,box_left,box_top,box_width,box_height,x0,y0,x1,y1\n"


@pytest.mark.parametrize("text, problem", [
    ("", "empty file (no header)"),
    ("image,face,box_left,box_top,box_width,x0,y0,x1,y1\n",
     "missing column(s) box_height (the header must start image,face,box_left,box_top,box_width,box_height,x0,y0,...)"),
    ("face,image,box_left,box_top,box_width,box_height,x0,y0\n",
     "columns out of order (the header must start image,face,box_left,box_top,box_width,box_height,x0,y0,...)"),
    ("image,face,box_left,box_top,box_width,box_height,x0,y0,x1\n",
     "3 coordinate columns, expected an x and a y column per keypoint"),
    ("image,face,box_left,box_top,box_width,box_height,x0,y0,y1,x1\n", "column 9 is 'y1', expected 'x1'"),
    (HEAD + "a.jpg,0,1,2,3,4,5,6,7\n", "line 2: 3 coordinates, expected 4 (x, y of 2 keypoints)"),
    (HEAD + "a.jpg,0,1,2,3,4,5,6,7,8\na.jpg,1,1,2,3,4,5,6,7,8,9\n",
     "line 3: 5 coordinates, expected 4 (x, y of 2 keypoints)"),
    (HEAD + "a.jpg,0,1,2,3,4,5,six,7,8\n", "line 2: y0='six' is not a number"),
    (HEAD + "a.jpg,0,1,2,3,,5,6,7,8\n", "line 2: box_height='' is not a number"),
    (HEAD + "a.jpg,first,1,2,3,4,5,6,7,8\n", "line 2: face='first' is not a face number"),
    (b"\xff\xfe\x00junk", "cannot read (UnicodeDecodeError)"),
])
def test_read_csv_names_the_file_and_the_problem(tmp_path, text, problem):
    path = tmp_path / "k.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PipelineError) as e:
        read_photo_keypoints_csv(path)
    assert str(e.value) == f"{path}: {problem}"


def test_read_missing_or_folder_is_a_one_line_error(tmp_path):
    for read, what in ((read_photo_keypoints_csv, "CSV"), (read_photo_json, "JSON")):
        for path, problem in ((tmp_path / "none", f"photo keypoint {what} not found"),
                              (tmp_path, f"is a directory, expected a photo keypoint {what} file")):
            with pytest.raises(PipelineError) as e:
                read(path)
            assert str(e.value) == f"{path}: {problem}"


def _broken(record: dict, edit) -> dict:
    record = json.loads(json.dumps(record))
    edit(record)
    return record


@pytest.mark.parametrize("edit, problem", [
    (lambda r: r.pop("names"), "missing key(s) names"),
    (lambda r: r.update(n_faces=3), "n_faces is 3 but 2 faces follow"),
    (lambda r: r["faces"][1].pop("detector_box"), "face 1: a face needs the keys box, detector_box, points"),
    (lambda r: r["faces"][0]["box"].pop(), "face 0: box has 3 values, expected 4"),
    (lambda r: r["faces"][0]["points"].pop(), "face 0: 1 points, expected 2 (one per name)"),
    (lambda r: r["faces"][1]["points"][1].append(3.0), "face 1 point 1: point has 3 values, expected 2"),
    (lambda r: r["faces"][1]["points"][0].__setitem__(0, "x"), "face 1 point 0: point value 'x' is not a number"),
    (lambda r: r["faces"][0]["detector_box"].__setitem__(2, None),
     "face 0: detector_box value None is not a number"),
])
def test_read_json_names_the_file_and_the_problem(tmp_path, edit, problem):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_broken(_record(PHOTOS[0]), edit)))
    with pytest.raises(PipelineError) as e:
        read_photo_json(path)
    assert str(e.value) == f"{path}: {problem}"


def test_read_json_not_json(tmp_path):
    for text, problem in (("{", "not a readable JSON file (JSONDecodeError)"), ("[1]", "expected a JSON object, got list")):
        (tmp_path / "a.json").write_text(text)
        with pytest.raises(PipelineError) as e:
            read_photo_json(tmp_path / "a.json")
        assert str(e.value) == f"{tmp_path / 'a.json'}: {problem}"
