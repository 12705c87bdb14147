"""`pipeline predict-image`: keypoints for any photo, no box given. Faces are found with
the best installed face detector (pipeline/detection/detectors.py: MTCNN, dlib HOG, or OpenCV's Haar
cascade, pipeline/detection/haar.py), each detector box is converted to the box convention the
models were trained with, and then the checkpoints' `Landmarker` (pipeline/inference/landmarker.py:
each checkpoint's stamped crop geometry, TTA, the ensemble) predicts the faces of several photos
in one batch. What the models score below their face-presence threshold
(pipeline/inference/presence.py) is no face: left out, or kept and marked with --keep-all.
Inputs may be files, folders or glob patterns."""

from __future__ import annotations

import glob
import logging
from pathlib import Path
from typing import Sequence

import click
import numpy as np
from tqdm import tqdm

from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.detection.detectors import get_detector
from pipeline.formats.annotations import read_image
from pipeline.formats.images import write_png
from pipeline.formats.photo_keypoints import photo_record, write_photo_json, write_photo_keypoints_csv
from pipeline.inference.landmarker import Faces, Landmarker
from pipeline.inference.options import model_options
from pipeline.keypoints.draw import draw_faces

log = logging.getLogger(__name__)


def annotate(image: np.ndarray, boxes: np.ndarray, points: np.ndarray, schema, ids=None) -> np.ndarray:
    """The photo with each face's box and keypoints (coloured by part), labelled with `ids`
    (default 0, 1, ...: the faces' numbers in the JSON and CSV)."""
    ids = range(len(boxes)) if ids is None else ids
    return draw_faces(image, [(j, box, pts) for j, box, pts in zip(ids, boxes, points)], schema)


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".pgm", ".ppm", ".pbm", ".jp2"}


def expand_inputs(args: Sequence[str]) -> list[Path]:
    """Photo paths from the command line: a file as given, a folder's image files (by
    suffix, sorted, not recursive), a glob pattern's matching files (sorted); duplicates once."""
    out: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                log.warning("%s: no image files in this folder", a)
        elif not p.exists() and glob.has_magic(str(a)):
            found = sorted(Path(f) for f in glob.glob(str(a)) if Path(f).is_file())
            if not found:
                log.warning("%s: matches no file", a)
        else:
            found = [p]
        out += found
    first: dict[Path, Path] = {}  # resolved -> the first path given for it
    for p in out:
        first.setdefault(p.resolve(), p)
    return list(first.values())


def run_predict_image(photos: Sequence[str], checkpoints: Sequence[str], out_dir: str, tta: str = "flip",
                      write_csv: bool = False, max_faces: int = 0, device_name: str = "auto",
                      backend: str = "torch", detector: str = "auto", batch_size: int = 64,
                      keep_all: bool = False) -> list[dict]:
    """Photos, folders or glob patterns -> keypoints of every face found. The faces of
    several photos go through the model together (batch_size faces); a photo that cannot be
    read is skipped with a warning, and the run fails only when none could be read. A
    detection the models score below their presence threshold is no face: left out, or with
    `keep_all` kept and marked (is_face false); max_faces counts faces only."""

    paths = expand_inputs(photos)
    if not paths:
        raise PipelineError(photos[0] if len(photos) == 1 else None, "no image files found")
    found = get_detector(detector)  # before the models load: a missing detector fails fast
    landmarker = Landmarker.from_checkpoints(checkpoints, backend=backend, device=resolve_device(device_name),
                                             tta=tta, batch_size=batch_size, detector=found.name)
    schema = landmarker.schema
    out = Path(out_dir)
    results, per_photo, stems, failed = [], [], set(), []
    pending: list[tuple[Path, np.ndarray, np.ndarray, np.ndarray]] = []

    threshold = landmarker.presence_threshold

    def flush() -> None:
        batch = landmarker.faces([image for _, image, _, _ in pending], [boxes for _, _, boxes, _ in pending],
                                 max_faces=max_faces, keep_all=keep_all,
                                 detector_boxes=[raw for _, _, _, raw in pending])
        for (photo, image, _, _), faces in zip(pending, batch):
            if faces.non_faces:
                log.info("%s: %d detection(s) scored below the presence threshold %.3f: not faces%s", photo,
                         faces.non_faces, threshold,
                         ", marked" if keep_all else " (left out; --keep-all keeps them, marked)")
            results.append(_write_photo(photo, image, faces))
        pending.clear()

    def _write_photo(photo: Path, image, faces: Faces) -> dict:
        stem = photo.stem
        if stem in stems:  # two photos of one name from different folders
            stem = next(f"{stem}-{i}" for i in range(2, len(paths) + 2) if f"{stem}-{i}" not in stems)
        stems.add(stem)
        boxes, pts, scores, face = faces.boxes, faces.points, faces.scores, faces.is_face
        write_png(out / f"{stem}_keypoints.png", annotate(image, boxes[face], pts[face], schema, np.flatnonzero(face)))
        res = photo_record(str(photo), image.shape[1], image.shape[0], detector=found.description,
                           schema=schema.name, names=schema.names, checkpoints=checkpoints, tta=tta,
                           boxes=boxes, detector_boxes=faces.detector_boxes, points=pts, scores=scores, is_face=face,
                           presence_threshold=threshold)
        write_photo_json(out / f"{stem}_keypoints.json", res)
        per_photo.append((str(photo), boxes, pts, scores, face))
        log.info("%s: %d face(s) -> %s", photo, res["n_faces"], out / f"{stem}_keypoints.png")
        return res

    for photo in tqdm(paths, desc="predict-image", unit="image", disable=len(paths) < 2):
        try:
            image = read_image(photo)
        except PipelineError as e:
            if len(paths) == 1:
                raise
            log.warning("%s (skipped)", e.format())
            failed.append(e)
            continue
        boxes, raw = landmarker.detect(image, 0)  # all: a non-face must not take a face's place
        if not len(boxes):
            log.warning("%s: no face found", photo)
        pending.append((photo, image, boxes, raw))
        if sum(len(p[2]) for p in pending) >= batch_size:
            flush()
    flush()
    if not results:
        raise PipelineError(None, f"none of the {len(paths)} images could be read (first: {failed[0].format()})")
    if failed:
        log.warning("%d of %d images could not be read and were skipped", len(failed), len(paths))
    if write_csv:
        write_photo_keypoints_csv(out / "keypoints.csv", per_photo, schema.k, scored=True)
    return results


@click.command("predict-image")
@click.argument("photos", nargs=-1, required=True)
@model_options
@click.option("--out-dir", default="out", show_default=True)
@click.option("--tta", type=click.Choice(["flip", "none"]), default="flip", show_default=True)
@click.option("--csv", "write_csv", is_flag=True, help="also write <out-dir>/keypoints.csv (one row per face)")
@click.option("--max-faces", default=0, show_default=True, help="keep the largest N faces per photo (0: all)")
@click.option("--detector", type=click.Choice(["auto", "mtcnn", "dlib", "haar"]), default="auto", show_default=True,
              help="face detector (auto: the first installed of mtcnn, dlib, haar)")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="faces per model call, across photos")
@click.option("--keep-all", is_flag=True,
              help="keep the detections the models score as no face, marked is_face false (not drawn)")
def predict_image_cmd(photos, checkpoints, out_dir, tta, write_csv, max_faces, device, backend, detector, batch_size,
                      keep_all):
    """Keypoints for any photo: face detection, then crop -> model -> photo pixels; what
    the models score as no face (their face-presence threshold) is left out.
    PHOTOS: image files, folders (their image files) or glob patterns ('faces/*.jpg').
    Writes <stem>_keypoints.png and <stem>_keypoints.json per photo (and with --csv one
    keypoints.csv for all), each face with its presence score; unreadable photos are
    skipped with a warning."""
    check_output(out_dir, folder=True)
    for r in run_predict_image(photos, checkpoints, out_dir, tta, write_csv, max_faces, device, backend, detector,
                               batch_size, keep_all):
        marked = sum(not f["is_face"] for f in r["faces"])
        click.echo(f"{r['image']}: {r['n_faces'] - marked} face(s)" + (f", {marked} marked no face" if marked else ""))
