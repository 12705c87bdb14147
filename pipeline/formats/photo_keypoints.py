"""The keypoints of photos (written by `pipeline predict-image`), in photo pixels with pixel
centres at integers; boxes are [left, top, width, height] in the training box convention.

- `<stem>_keypoints.json`, one per photo: `image, width, height, detector, schema, names,
  checkpoints, tta, presence_threshold, n_faces, faces: [{box, detector_box, score, is_face,
  points}]`; boxes rounded to 0.01, points (K, 2) to 0.001, the face-presence score to
  0.0001 (null for a model without heatmaps); is_face: score >= presence_threshold (false
  only for the non-faces `--keep-all` keeps).
- `keypoints.csv` (`--csv`), one row per face of all photos, in photo order:

      image,face,box_left,box_top,box_width,box_height,score,is_face,x0,y0,x1,y1,...

  face: the face's index within its photo (0, 1, ...); box to 0.01 px, x/y to 0.001 px,
  score as in the JSON (empty when none), is_face 1 or 0. A run that found no face writes
  the header only. Files written before the score existed (no score and is_face columns)
  read as well."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file, read_csv_rows, write_bytes, write_csv
from pipeline.formats.video_csv import score_cell, score_value

FIXED = ("image", "face", "box_left", "box_top", "box_width", "box_height")
SCORED = ("score", "is_face")
JSON_KEYS = ("image", "width", "height", "detector", "schema", "names", "checkpoints", "tta", "n_faces", "faces")
FACE_KEYS = ("box", "detector_box", "points")


def header(k: int, scored: bool = True) -> list[str]:
    return [*FIXED, *(SCORED if scored else ()), *[f"{c}{i}" for i in range(k) for c in ("x", "y")]]


# ------------------------------------------------------------------ keypoints.csv

def write_photo_keypoints_csv(path: str | os.PathLike, photos: Iterable[tuple], k: int,
                              scored: bool = False) -> Path:
    """One row per face of photos [(image, boxes (F, 4), points (F, K, 2))], or with `scored`
    [(image, boxes, points, scores (F,), is_face (F,))] and the score and is_face columns,
    written atomically; `k` names the columns when no photo has a face."""
    rows: list[list] = [header(k, scored)]
    for image, boxes, points, *rest in photos:
        scores, face = rest if scored else ([None] * len(boxes), [True] * len(boxes))
        for j, (b, p, sc, f) in enumerate(zip(boxes, points, scores, face)):
            p = np.asarray(p).reshape(-1)
            if len(p) != 2 * k:
                raise ValueError(f"{image} face {j}: {len(p)} coordinates, expected {2 * k}")
            extra = [score_cell(sc), int(bool(f))] if scored else []
            rows.append([str(image), j, *[f"{v:.2f}" for v in b], *extra, *[f"{v:.3f}" for v in p]])
    return write_csv(path, rows)


def read_photo_keypoints_csv(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """{"image": (N,) str, "face": (N,) int, "box": (N, 4), "score": (N,) (NaN where none),
    "is_face": (N,) bool, "points": (N, K, 2)}."""
    path = input_file(path, "photo keypoint CSV not found", "a photo keypoint CSV file")
    rows = read_csv_rows(path)
    if not rows:
        raise PipelineError(path, "empty file (no header)")
    head = rows[0]
    missing = [c for c in FIXED if c not in head]
    if missing or head[:len(FIXED)] != list(FIXED):
        why = f"missing column(s) {', '.join(missing)}" if missing else "columns out of order"
        raise PipelineError(path, f"{why} (the header must start {','.join(FIXED)},x0,y0,...)")
    scored = tuple(head[len(FIXED):len(FIXED) + len(SCORED)]) == SCORED
    fixed = len(FIXED) + scored * len(SCORED)
    n_coords = len(head) - fixed
    if n_coords % 2:
        raise PipelineError(path, f"{n_coords} coordinate columns, expected an x and a y column per keypoint")
    k = n_coords // 2
    want = header(k, scored)
    bad = next((i for i, (a, b) in enumerate(zip(head, want)) if a != b), None)
    if bad is not None:
        raise PipelineError(path, f"column {bad + 1} is '{head[bad]}', expected '{want[bad]}'")
    images, faces, values, flags = [], [], [], []
    for line, r in enumerate(rows[1:], 2):
        where = f"line {line}"
        if len(r) != len(want):
            got = max(len(r) - fixed, 0)
            raise PipelineError(path, f"{got} coordinates, expected {2 * k} (x, y of {k} keypoints)", where)
        try:
            face = int(r[1])
        except ValueError:
            raise PipelineError(path, f"face={r[1]!r} is not a face number", where) from None
        if scored and r[len(FIXED) + 1] not in ("0", "1"):
            raise PipelineError(path, f"is_face={r[len(FIXED) + 1]!r} is not 0 or 1", where)
        nums = []
        for name, v in zip(want[2:], r[2:]):
            if name == "is_face" or (name == "score" and v == ""):
                nums.append(np.nan if name == "score" else 0.0)
                continue
            try:
                nums.append(float(v))
            except ValueError:
                raise PipelineError(path, f"{name}={v!r} is not a number", where) from None
        images.append(r[0])
        faces.append(face)
        values.append(nums)
        flags.append(not scored or r[len(FIXED) + 1] == "1")
    data = np.array(values, dtype=np.float64).reshape(-1, fixed - 2 + 2 * k)
    coords = data[:, fixed - 2:]
    return {"image": np.array(images, dtype=str), "face": np.array(faces, dtype=np.int64), "box": data[:, :4],
            "score": data[:, 4] if scored else np.full(len(data), np.nan), "is_face": np.array(flags, dtype=bool),
            "points": coords.reshape(-1, k, 2)}


# ------------------------------------------------------------------ <stem>_keypoints.json

def photo_record(image: str, width: int, height: int, *, detector: str, schema: str, names: Sequence[str],
                 checkpoints: Sequence[Any], tta: str, boxes, detector_boxes, points, scores=None, is_face=None,
                 presence_threshold: float | None = None) -> dict:
    """The JSON content of one photo: boxes (F, 4) and detector_boxes (F, 4) rounded to
    0.01 px, points (F, K, 2) to 0.001 px; with `scores` (F,) (NaN: none) also each face's
    score (0.0001) and is_face (F,) (None: all faces), and the presence_threshold."""
    faces = [{"box": [round(float(v), 2) for v in b], "detector_box": [round(float(v), 2) for v in h],
              "points": np.round(p, 3).tolist()} for b, h, p in zip(boxes, detector_boxes, points)]
    record = {"image": str(image), "width": int(width), "height": int(height), "detector": detector,
              "schema": schema, "names": list(names), "checkpoints": [str(c) for c in checkpoints], "tta": tta}
    if scores is not None:
        flags = [True] * len(faces) if is_face is None else is_face
        faces = [{**{k: v for k, v in f.items() if k != "points"}, "score": score_value(sc), "is_face": bool(ok),
                  "points": f["points"]} for f, sc, ok in zip(faces, scores, flags)]
        record["presence_threshold"] = score_value(presence_threshold)
    return {**record, "n_faces": len(faces), "faces": faces}


def write_photo_json(path: str | os.PathLike, record: dict) -> Path:
    """A `photo_record`, written atomically."""
    return write_bytes(path, (json.dumps(record, indent=1) + "\n").encode())


def _numbers(values, n: int, path: Path, where: str, what: str) -> None:
    if not isinstance(values, list) or len(values) != n:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise PipelineError(path, f"{what} has {got} values, expected {n}", where)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PipelineError(path, f"{what} value {v!r} is not a number", where)


def read_photo_json(path: str | os.PathLike) -> dict:
    """A photo's keypoints as `photo_record` made them, after checking its keys and shapes."""
    path = input_file(path, "photo keypoint JSON not found", "a photo keypoint JSON file")
    try:
        record = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PipelineError(path, f"not a readable JSON file ({type(e).__name__})") from None
    if not isinstance(record, dict):
        raise PipelineError(path, f"expected a JSON object, got {type(record).__name__}")
    missing = [key for key in JSON_KEYS if key not in record]
    if missing:
        raise PipelineError(path, f"missing key(s) {', '.join(missing)}")
    names, faces = record["names"], record["faces"]
    if not isinstance(names, list) or not isinstance(faces, list):
        raise PipelineError(path, "names and faces must be lists")
    if record["n_faces"] != len(faces):
        raise PipelineError(path, f"n_faces is {record['n_faces']!r} but {len(faces)} faces follow")
    for j, face in enumerate(faces):
        where = f"face {j}"
        if not isinstance(face, dict) or any(key not in face for key in FACE_KEYS):
            raise PipelineError(path, f"a face needs the keys {', '.join(FACE_KEYS)}", where)
        _numbers(face["box"], 4, path, where, "box")
        _numbers(face["detector_box"], 4, path, where, "detector_box")
        if face.get("score") is not None:
            _numbers([face["score"]], 1, path, where, "score")
        if not isinstance(face.get("is_face", True), bool):
            raise PipelineError(path, f"is_face is {face['is_face']!r}, expected true or false", where)
        points = face["points"]
        if not isinstance(points, list) or len(points) != len(names):
            got = len(points) if isinstance(points, list) else type(points).__name__
            raise PipelineError(path, f"{got} points, expected {len(names)} (one per name)", where)
        for i, pt in enumerate(points):
            _numbers(pt, 2, path, f"{where} point {i}", "point")
    return record
