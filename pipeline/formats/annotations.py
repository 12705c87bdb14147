"""The competition's annotation files: reader and writer, and the faces' pixels.

dlib/imglab XML (`labels_ibug_300W_train.xml`: <image file> / <box top left width height>
/ <part name x y>; `labels_ibug_300W_test_parsed.xml`: boxes only).
Image paths are relative to the annotation file's folder and may not leave it."""

from __future__ import annotations

import math
import os
import re
import struct
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import cv2
import numpy as np
from joblib import Parallel, delayed
from tqdm import tqdm

from pipeline.core.config import params_source
from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file
from pipeline.core.params_schema import DEFAULTS
from pipeline.keypoints.geometry import check_box, crop_face
from pipeline.keypoints.schema import KeypointSchema


@dataclass
class Face:
    image: str  # image path relative to the dataset folder, as written in the XML
    box: tuple[float, float, float, float]  # left, top, width, height (original pixels)
    keypoints: np.ndarray | None  # (K, 2) float64 original pixels, None when unlabelled
    face_id: str  # unique: image path without extension, '#j' for the j-th box of an image
    group: str  # photo id: faces of one photo share it and stay in one fold


# The 300-W naming (dlib's ibug_300W_large_face_landmark_dataset), path without extension:
#   afw/1130084326_2, helen/trainset/100032540_1   <photo>_<face>     (face 1..2 digits)
#   lfpw/trainset/image_0854                        the whole stem is the photo
#   ibug/image_092_01                               photo image_092, face 01
#   <any of these>_mirror                           the left-right mirrored copy
# `photo` is everything before an optional 1-2 digit face number and an optional _mirror:
# a face, the other faces of its photo and its mirror get one group. `folds.group_regex`
# (params) sets another rule for other data sets.
GROUP_REGEX: str = DEFAULTS.folds.group_regex
_DEFAULT_GROUP_RX = re.compile(GROUP_REGEX)


def photo_group(image: str, rule: "str | re.Pattern[str] | None" = None) -> str:
    """Photo group of an image path, e.g. 'afw/1130084326_2.jpg' -> 'afw/1130084326',
    'helen/trainset/100032540_1_mirror.jpg' -> 'helen/trainset/100032540',
    'ibug/image_092_01.jpg' -> 'ibug/image_092', 'lfpw/trainset/image_0001.png' ->
    'lfpw/trainset/image_0001'. `rule` (default GROUP_REGEX) is matched against the path
    without its extension; a path it does not match is its own group."""
    rx = _DEFAULT_GROUP_RX if rule is None else (re.compile(rule) if isinstance(rule, str) else rule)
    p = PurePosixPath(image.replace("\\", "/"))
    stem = str(p.with_suffix("")) if p.suffix else str(p)
    m = rx.match(stem)
    return m.group("photo") if m and m.group("photo") else stem


def safe_image_path(root: Path, rel: str, source: str | os.PathLike) -> Path:
    """root/rel, refusing absolute paths and '..' that would leave the dataset folder."""
    if not rel:
        raise PipelineError(source, "image with an empty file attribute")
    p = PurePosixPath(rel.replace("\\", "/"))
    if p.is_absolute() or re.match(r"^[A-Za-z]:", rel) or ".." in p.parts:
        raise PipelineError(source, f"image path '{rel}' leaves the dataset folder (absolute or '..')")
    return root / Path(*p.parts)


def _number(value: str | None, source, where: str, attr: str) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PipelineError(source, f"{attr}={value!r} is not a number", where) from None
    if not math.isfinite(v):
        raise PipelineError(source, f"{attr}={value!r} is not finite", where)
    return v


def _select(points: np.ndarray, schema: KeypointSchema, source, where: str) -> np.ndarray:
    """The schema's points out of what the file holds (all of them, or a subset such as
    nose1's index 30 of 68)."""
    n = len(points)
    if n == schema.k:
        return points
    if schema.source_indices is not None and n == schema.source_k:
        return points[list(schema.source_indices)]
    expected = f"{schema.k}" + (f" or {schema.source_k}" if schema.source_k else "")
    raise PipelineError(source, f"{n} parts, schema '{schema.name}' expects {expected}", where)


def load_xml(path: str | os.PathLike, schema: KeypointSchema, require_parts: bool | None = None) -> list[Face]:
    """Faces of an imglab XML. require_parts: True = every box must have parts, False =
    parts are ignored (test file), None = all boxes have parts or none do."""
    path = input_file(path, "annotation file not found", "an imglab XML file")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise PipelineError(path, f"malformed XML ({e})") from None
    except (UnicodeError, ValueError) as e:
        raise PipelineError(path, f"malformed XML ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise PipelineError(path, f"cannot read ({e.strerror or e})") from None
    images = root.find("images")
    if images is None:
        raise PipelineError(path, "no <images> element (not an imglab dataset file)")
    folder = path.parent
    faces: list[Face] = []
    seen_ids: set[str] = set()
    for image in images.findall("image"):
        rel = image.get("file", "")
        img_path = safe_image_path(folder, rel, path)
        if not img_path.exists():
            raise PipelineError(path, f"image file not found: {img_path}", f"image {rel}")
        if img_path.is_dir():
            raise PipelineError(path, f"is a directory, expected an image file: {img_path}", f"image {rel}")
        if img_path.stat().st_size == 0:
            raise PipelineError(path, f"image file is empty (0 bytes): {img_path}", f"image {rel}")
        boxes = image.findall("box")
        for j, box in enumerate(boxes):
            where = f"image {rel} box {j}"
            left, top, width, height = (_number(box.get(a), path, where, a)
                                        for a in ("left", "top", "width", "height"))
            if width <= 0 or height <= 0:
                raise PipelineError(path, f"box has non-positive size {width:g}x{height:g}", where)
            parts = box.findall("part")
            kp = None
            if parts and require_parts is not False:
                names = [p.get("name", "").strip() for p in parts]
                try:  # '00'..'67': order by the number ('7' and '07' are the same part)
                    keys: list = [int(n) for n in names]
                except ValueError:
                    keys = names  # non-numeric names: keep file order
                if len(set(keys)) != len(keys):
                    dup = next(n for n, k in zip(names, keys) if keys.count(k) > 1)
                    raise PipelineError(path, f"duplicate part name '{dup}'", where)
                pts = []
                for p in parts:
                    pw = f"{where} part {p.get('name')}"
                    pts.append((_number(p.get("x"), path, pw, "x"), _number(p.get("y"), path, pw, "y")))
                if isinstance(keys[0], int):
                    order = np.argsort(keys, kind="stable")
                    kp = _select(np.asarray(pts, dtype=np.float64)[order], schema, path, where)
                    if sorted(keys) != list(range(len(keys))):
                        bad = sorted(set(keys) - set(range(len(keys))))[0]
                        raise PipelineError(path, f"part name '{bad}' out of range: {len(keys)} parts must be "
                                                  f"named 00..{len(keys) - 1:02d}", where)
                else:
                    kp = _select(np.asarray(pts, dtype=np.float64), schema, path, where)
            elif require_parts:
                raise PipelineError(path, "box has no <part> elements", where)
            stem = str(PurePosixPath(rel).with_suffix(""))
            face_id = stem if len(boxes) == 1 else f"{stem}#{j}"
            if face_id in seen_ids:
                face_id = f"{stem}#{j}@{len(faces)}"  # the same image listed twice
            seen_ids.add(face_id)
            faces.append(Face(rel, (left, top, width, height), kp, face_id, photo_group(rel)))
    if not faces:
        raise PipelineError(path, "no faces (<image><box>) in the file")
    labelled = [f.keypoints is not None for f in faces]
    if require_parts is None and any(labelled) and not all(labelled):
        missing = faces[labelled.index(False)]
        raise PipelineError(path, "some boxes have parts and some do not", f"image {missing.image}")
    return faces


MAX_IMAGE_PIXELS = 100_000_000  # 10000 x 10000: no photo of a face is larger


def declared_size(data: np.ndarray) -> tuple[int, int] | None:
    """(width, height) a PNG or JPEG header declares, read without decoding; None for
    other formats or a header too short to tell."""
    b = bytes(data[:65536])
    if b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR" and len(b) >= 24:
        return struct.unpack(">II", b[16:24])
    if b[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 <= len(b) and b[i] == 0xFF:
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame
            h, w = struct.unpack(">HH", b[i + 5:i + 9])
            return w, h
        i += 2 + struct.unpack(">H", b[i + 2:i + 4])[0]
    return None


def read_image(path: str | os.PathLike) -> np.ndarray:
    """(H, W, 3) uint8 RGB. Grayscale is replicated, alpha dropped, 16-bit scaled to 8-bit;
    EXIF orientation is ignored, as the competition's coordinates are in stored pixels."""
    path = input_file(path, "image file not found", "an image file")
    if path.stat().st_size == 0:
        raise PipelineError(path, "image file is empty (0 bytes)")
    data = np.fromfile(path, dtype=np.uint8)
    wh = declared_size(data)
    if wh is not None and (wh[0] < 1 or wh[1] < 1 or wh[0] * wh[1] > MAX_IMAGE_PIXELS):
        raise PipelineError(path, f"image header declares an impossible size {wh[0]}x{wh[1]} px "
                                  f"(at most {MAX_IMAGE_PIXELS:.0e} pixels, in a {len(data)}-byte file)")
    try:
        img = cv2.imdecode(data, cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as e:  # e.g. OpenCV's own pixel limit
        raise PipelineError(path, f"cannot decode image ({str(e).strip().splitlines()[-1][:120]})") from None
    if img is None or img.size == 0:
        raise PipelineError(path, "cannot decode image (corrupt or unsupported format)")
    if img.dtype == np.uint16:
        img = (img / 257.0).round().astype(np.uint8)
    elif img.dtype != np.uint8:
        # dst=None allocates the output; cv2's stubs want an array there
        img = cv2.normalize(img, None, 0, 255, cv2.NORM_MINMAX).astype(np.uint8)  # type: ignore[call-overload]
    if img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    if img.shape[2] == 4:
        return cv2.cvtColor(img, cv2.COLOR_BGRA2RGB)
    if img.shape[2] in (1, 2):  # gray, gray + alpha
        return cv2.cvtColor(np.ascontiguousarray(img[:, :, 0]), cv2.COLOR_GRAY2RGB)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def xml_comment(path: str | os.PathLike) -> str | None:
    """The <comment> of an imglab XML that `load_xml` has read (what its maker says of it,
    such as where its boxes came from), or None."""
    text = ET.parse(path).getroot().findtext("comment")
    return " ".join(text.split()) if text and text.strip() else None


def xml_text(entries: list, name: str | None = None, comment: str | None = None) -> str:
    """imglab XML for entries [(image file, [(box (left, top, width, height), parts), ...])];
    parts: None (a box only), a (K, 2) array (points named 00, 01, ...; written as its values
    are: integers or floats) or a list of (name, x, y) with raw attribute strings."""
    lines = ["<?xml version='1.0' encoding='ISO-8859-1'?>",
             "<?xml-stylesheet type='text/xsl' href='image_metadata_stylesheet.xsl'?>", "<dataset>"]
    lines += [f"<name>{name}</name>"] * (name is not None) + [f"<comment>{comment}</comment>"] * (comment is not None)
    lines.append("<images>")
    for file, boxes in entries:
        lines.append(f"  <image file='{file}'>")
        for box, parts in boxes:
            attrs = "top='{1}' left='{0}' width='{2}' height='{3}'".format(*box)
            if parts is None:
                lines.append(f"    <box {attrs}/>")
                continue
            lines.append(f"    <box {attrs}>")
            if not isinstance(parts, list):
                parts = [(f"{i:02d}", x, y) for i, (x, y) in enumerate(np.asarray(parts).tolist())]
            lines += [f"      <part name='{n}' x='{x}' y='{y}'/>" for n, x, y in parts]
            lines.append("    </box>")
        lines.append("  </image>")
    lines += ["</images>", "</dataset>"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the faces' pixels

def _crop_image(path: str, boxes: list, expand: float, size: int, rel: str = ""):
    """Worker: one photo's crops. PipelineError does not survive joblib's pickling, so it
    comes back as a value and is raised again in the parent (path None: the annotation
    file is at fault, not the image)."""
    try:
        image = read_image(path)
    except PipelineError as e:
        return ("error", e.path, e.problem, e.where)
    for j, box in enumerate(boxes):
        bad = check_box(box, image.shape[1], image.shape[0])
        if bad:
            return ("error", None, bad, f"image {rel or path} box {j}")
    return ("ok", [crop_face(image, box, expand, size) for box in boxes], image.shape[1], image.shape[0])


def crop_faces(faces: list[Face], root: str | os.PathLike, size: int, expand: float, n_jobs: int = 1,
               source: str | os.PathLike = "", progress: bool = False, return_sizes: bool = False):
    """(faces uint8 (N, size, size, 3), crop_to_orig float64 (N, 2, 3)) in face order, plus
    image (width, height) (N, 2) with return_sizes. Each photo is decoded once for all of
    its boxes; photos are spread over `n_jobs` joblib workers (1 = in this process)."""
    if size < 1 or expand <= 0:
        raise PipelineError(params_source("crop.side", "crop.expand"),
                            f"crop.side must be >= 1 and crop.expand > 0, got {size}, {expand}")
    root = Path(root)
    by_image: dict[str, list[int]] = {}
    for i, f in enumerate(faces):
        by_image.setdefault(f.image, []).append(i)
    jobs = list(by_image.items())
    paths = [str(safe_image_path(root, rel, source or root)) for rel, _ in jobs]
    tasks = (delayed(_crop_image)(p, [faces[i].box for i in idx], expand, size, rel)
             for p, (rel, idx) in zip(paths, jobs))
    n_jobs = max(1, min(int(n_jobs), len(jobs))) if n_jobs > 0 else n_jobs
    results = Parallel(n_jobs=n_jobs, batch_size=8, return_as="generator")(tasks)
    arr = np.zeros((len(faces), size, size, 3), dtype=np.uint8)
    a = np.zeros((len(faces), 2, 3))
    wh = np.zeros((len(faces), 2), dtype=np.int64)
    # the bar only on a terminal (disable=None): logs and CI output stay clean
    bar = tqdm(results, total=len(jobs), desc=f"crop {Path(source).name}".strip(), unit="img",
               disable=None if progress else True, leave=False)
    for (_rel, idx), res in zip(jobs, bar):
        if res[0] == "error":
            _, path, problem, where = res
            with warnings.catch_warnings():  # joblib warns about the photos it now drops
                warnings.simplefilter("ignore")
                bar.close()
                results.close()
            if path is None:  # a bad box: the annotation file is at fault
                raise PipelineError(source or root, problem, where)
            raise PipelineError(path, problem, where or (f"listed in {source}" if source else None))
        _, crops, w, h = res
        for i, (crop, m) in zip(idx, crops):
            arr[i], a[i], wh[i] = crop, m, (w, h)
    return (arr, a, wh) if return_sizes else (arr, a)
