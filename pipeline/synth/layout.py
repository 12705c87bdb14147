"""The embedded demo data set: rendered faces (pipeline/synth/face.py) written in exactly the
competition layout.

    out_dir/images/train/<photo>_<n>.jpg       out_dir/images/test/<photo>_<n>.jpg
    out_dir/labels_ibug_300W_train.xml         (boxes + 68 parts, integers, like the real file)
    out_dir/labels_ibug_300W_test_parsed.xml   (boxes only)
    out_dir/solution.csv                       (truth of the test faces, `Id,Predicted`)
    out_dir/demo.json                          (how it was made; marks the folder as ours)

Each face is an OpenCV drawing (skin polygon, jaw line, brows, eyes with irises, nose,
lips) of a 3-D template whose 68 points follow the iBUG semantics, so that
`IBUG68.flip_perm` is exactly its mirror symmetry. Faces get random identity and
expression, yaw/pitch foreshortening, in-plane rotation, scale and position on a
cluttered background, lighting gradients, colour or grayscale, blur, noise and
occluders; the boxes imitate a face detector (keypoint extent stretched up to the
brow, each edge jittered). Some photos hold two faces, written as `<photo>_1.jpg` /
`<photo>_2.jpg` (as 300-W does) or as one image with two boxes, to exercise grouping.

`layout="300w"` (params `demo.layout: 300w`) writes dlib's ibug_300W_large_face_landmark_dataset
layout instead: subset folders `afw/`, `helen/trainset/`, `lfpw/trainset/`, `ibug/` (test:
`helen/testset/`, `lfpw/testset/`), their naming (`afw/<id>_<n>.jpg`,
`lfpw/trainset/image_0001.png`, `ibug/image_092_01.jpg`), multi-face photos as one file
per face, and a left-right mirrored copy `<name>_mirror.jpg` of every training image beside
it with mirrored box and keypoints (x -> W - 1 - x, points renumbered by the flip
permutation), as the full set has them. demo.json then also maps each image to the photo
it shows (`photos`), the truth for grouping tests.

The same seed gives byte-identical XML and CSV: every photo draws from its own
`SeedSequence([seed, split, photo])` stream, whatever the worker count."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import cv2
import numpy as np
from joblib import Parallel, delayed

from pipeline.core.errors import PipelineError
from pipeline.core.io import staging_dir
from pipeline.core.params_schema import DEFAULTS
from pipeline.formats.annotations import xml_text
from pipeline.formats.submission import format_submission
from pipeline.keypoints.flip import flip_coords
from pipeline.keypoints.schema import IBUG68
from pipeline.synth.face import SPLITS, render_photo

log = logging.getLogger(__name__)

# the competition's file names, as params `data` expects them
TRAIN_XML = DEFAULTS.data.train_xml
TEST_XML = DEFAULTS.data.test_xml
SOLUTION = DEFAULTS.data.solution
MARKER = "demo.json"  # how the set was made; marks the folder as ours to replace
COMMENT = "Synthetic demo faces (pipeline demo-data); 68-point iBUG landmarks; boxes imitate a face detector."
SOLUTION_FORMAT = "{:.3f}"  # the truth at the precision of the rendering, not the submission's 6 digits


def _plan(seed: int, split: int, n: int, allow_multi_box: bool) -> list[tuple[int, int, bool]]:
    """(photo, n_faces, multi_box) per photo so that the face count is exactly n."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, split, 1 << 30]))
    plan, total, photo = [], 0, 0
    while total < n:
        nf = 2 if (n - total >= 2 and rng.random() < 0.12) else 1
        multi = bool(nf == 2 and allow_multi_box and rng.random() < 0.35)
        plan.append((photo, nf, multi))
        total += nf
        photo += 1
    return plan


# --------------------------------------------------------------------------------------
# the 300-W layout

LAYOUTS = ("flat", "300w")
_SUBSETS = {"train": ("afw", "helen", "lfpw", "ibug"), "test": ("helen", "lfpw")}
_SUBSET_P = {"train": (0.1, 0.6, 0.25, 0.05), "test": (0.6, 0.4)}


def _names_300w(seed: int, split: str, photo: int, n_faces: int) -> list[str]:
    """300-W file names of one photo's faces (one file per face)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, SPLITS[split], photo, 300]))
    subset = str(rng.choice(_SUBSETS[split], p=_SUBSET_P[split]))
    if subset == "lfpw" and n_faces > 1:  # LFPW names carry no face number: one face a photo
        subset = "helen"
    part = "trainset" if split == "train" else "testset"
    if subset == "afw":
        return [f"afw/{1000000000 + 7919 * photo}_{j + 1}.jpg" for j in range(n_faces)]
    if subset == "helen":
        return [f"helen/{part}/{100000000 + 104729 * photo}_{j + 1}.jpg" for j in range(n_faces)]
    if subset == "lfpw":
        return [f"lfpw/{part}/image_{photo + 1:04d}.png"]
    return [f"ibug/image_{photo + 1:03d}_{j + 1:02d}.jpg" for j in range(n_faces)]


def _mirror_entry(name: str, data: bytes, boxes: list) -> tuple[str, bytes, list]:
    """The mirrored copy of one file: `<stem>_mirror.jpg`, image flipped left-right, boxes
    and keypoints mirrored (x -> W - 1 - x for pixel centres, box left -> W - left - width)
    and the points renumbered by the flip permutation."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert img is not None  # bytes this module encoded
    w = img.shape[1]
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(img[:, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    out = []
    for (left, top, bw, bh), kp in boxes:
        # a box is edge coordinates: its mirrored left edge is W - (left + width)
        out.append(((w - left - bw, top, bw, bh), flip_coords(kp, w, IBUG68.flip_perm)))
    stem = name.rsplit(".", 1)[0]
    return f"{stem}_mirror.jpg", buf.tobytes(), out


def _to_300w(seed: int, split: str, plan: list, photos: list[dict]) -> tuple[dict, list, dict]:
    """Rename the rendered photos to the 300-W layout and add the mirrors (train only):
    (files {path: bytes}, entries [(path, boxes)], photo of each path)."""
    files, entries, mirrors, photo_of = {}, [], [], {}
    for (p, nf, _), ph in zip(plan, photos):
        names = _names_300w(seed, split, p, nf)
        for (old, boxes), new in zip(ph["entries"], names):
            data = ph["files"][old]
            if new.endswith(".png"):
                img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
                assert img is not None  # bytes this module encoded
                ok, buf = cv2.imencode(".png", img)
                assert ok
                data = buf.tobytes()
            files[new] = data
            entries.append((new, boxes))
            photo_of[new] = f"{split}/{p}"
            if split == "train":
                m_name, m_data, m_boxes = _mirror_entry(new, data, boxes)
                files[m_name] = m_data
                mirrors.append((m_name, m_boxes))
                photo_of[m_name] = f"{split}/{p}"
    return files, entries + mirrors, photo_of


def _integers(entries: list) -> list:
    """Entries with their keypoints truncated to integers, as the real train XML has them."""
    return [(file, [(box, kp.astype(np.int64)) for box, kp in boxes]) for file, boxes in entries]


def _boxes_only(entries: list) -> list:
    return [(file, [(box, None) for box, _ in boxes]) for file, boxes in entries]


def generate_demo(out_dir: str | os.PathLike, n_train: int = 400, n_test: int = 60, seed: int = 0,
                  n_jobs: int = 1, layout: str = "flat") -> Path:
    """Write the demo data set to `out_dir` (replaced as a whole: built in a temp folder,
    then renamed into place). Returns out_dir. layout "300w": the full set's folders,
    names and mirrored copies (n_train counts the mirrors, so it must be even)."""
    if n_train < 1 or n_test < 1:
        raise PipelineError("demo-data", f"need at least one face per split, got n_train={n_train} n_test={n_test}")
    if layout not in LAYOUTS:
        raise PipelineError("demo-data", f"demo.layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == "300w" and n_train % 2:
        raise PipelineError("demo-data", f"demo.n_train must be even with layout 300w (every training face "
                                         f"has its mirror), got {n_train}")
    out = Path(out_dir)
    t0 = time.perf_counter()
    with staging_dir(out, marker=MARKER) as tmp:
        test_kps, photo_of = [], {}
        for split, n in (("train", n_train), ("test", n_test)):
            sid = SPLITS[split]
            real = layout == "300w"
            n_drawn = n // 2 if real and split == "train" else n
            plan = _plan(seed, sid, n_drawn, allow_multi_box=split == "train" and not real)
            if n_jobs == 1:
                photos = [render_photo(seed, sid, p, nf, mb) for p, nf, mb in plan]
            else:
                photos = Parallel(n_jobs=n_jobs, prefer="threads")(
                    delayed(render_photo)(seed, sid, p, nf, mb) for p, nf, mb in plan)
            if real:
                files, entries, names = _to_300w(seed, split, plan, photos)
                photo_of.update(names)
                for rel, data in files.items():
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / rel).write_bytes(data)
            else:
                folder = tmp / "images" / split
                folder.mkdir(parents=True)
                entries = []
                for ph in photos:
                    for fname, data in ph["files"].items():
                        (folder / fname).write_bytes(data)
                    entries += [(f"images/{split}/{f}", boxes) for f, boxes in ph["entries"]]
            if split == "train":
                (tmp / TRAIN_XML).write_text(xml_text(_integers(entries), "Training faces", COMMENT), encoding="ascii")
            else:
                (tmp / TEST_XML).write_text(xml_text(_boxes_only(entries), "Test faces", COMMENT), encoding="ascii")
                test_kps = [kp for _, boxes in entries for _, kp in boxes]
        (tmp / SOLUTION).write_text(format_submission(np.stack(test_kps), SOLUTION_FORMAT), encoding="ascii")
        made = {"generator": "pipeline demo-data", "n_train": n_train, "n_test": n_test, "seed": seed}
        if real:
            made.update(layout=layout, photos=photo_of)
        (tmp / MARKER).write_text(json.dumps(made, indent=2) + "\n")
    dt = time.perf_counter() - t0
    log.info("demo data: %d train + %d test faces in %.1f s (%.0f faces/s) -> %s",
             n_train, n_test, dt, (n_train + n_test) / max(dt, 1e-9), out)
    return out
