"""A test video with exact truth: a face photo (a synthetic face by default, or a labelled real
one) moved along a known smooth path (shift, scale, small rotation) with noise and JPEG
re-encoding; every frame's keypoints are the photo's keypoints through the same affine."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.formats.annotations import load_xml, read_image, safe_image_path
from pipeline.formats.video import AtomicVideoWriter
from pipeline.formats.video_csv import write_video_csv
from pipeline.keypoints.schema import IBUG68
from pipeline.synth.face import SPLITS, render_photo

PATH_PERIOD_S = 4.0  # one lap of the test video's path
# make-test-video's default face: test photo 8 of the demo set with seed 0 (one frontal face
# that OpenCV's Haar cascade, the detector every install has, finds at IoU > 0.7)
TEST_PHOTO = 8


def source_face(seed: int = 0, photo: int = TEST_PHOTO, xml: str | os.PathLike | None = None,
                face: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(photo RGB, its face box (4,), keypoints (68, 2)): a demo test photo rendered in memory
    (seed, photo), or face number `face` of a labelled XML (e.g. a real train XML)."""
    if xml is not None:
        faces = load_xml(xml, IBUG68, require_parts=True)
        if not 0 <= face < len(faces):
            raise PipelineError(xml, f"face index {face} out of range (0..{len(faces) - 1})")
        f = faces[face]
        image = read_image(safe_image_path(Path(xml).parent, f.image, xml))
        return image, np.asarray(f.box, dtype=np.float64), np.asarray(f.keypoints, dtype=np.float64)

    ph = render_photo(seed, SPLITS["test"], photo, 1, False)
    (name, [(box, kp)]), = ph["entries"]
    bgr = cv2.imdecode(np.frombuffer(ph["files"][name], np.uint8), cv2.IMREAD_COLOR)
    assert bgr is not None  # bytes render_photo encoded
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), np.asarray(box, dtype=np.float64), np.asarray(kp, dtype=np.float64)


def path_affine(t: float, width: int, height: int, moving: bool) -> np.ndarray:
    """(2, 3) canvas -> canvas similarity at time t (s): the face's shift, scale and roll along
    a smooth closed path about the canvas centre, one lap every PATH_PERIOD_S seconds
    whatever the video's length (identity when not moving): peak speeds 0.25 canvas widths
    (0.9 face widths) per second sideways and 0.25 heights per second up and down, scale
    +-15 %, roll +-8 degrees."""
    if not moving:
        return np.array([[1.0, 0, 0], [0, 1.0, 0]])
    u = 2 * math.pi * t / PATH_PERIOD_S
    tx, ty = 0.16 * width * math.sin(u), 0.08 * height * math.sin(2 * u)
    scale = 1.0 + 0.15 * math.sin(u + 1.0)
    roll = math.radians(8.0) * math.sin(1.5 * u)
    c, s = scale * math.cos(roll), scale * math.sin(roll)
    cx, cy = (width - 1) / 2, (height - 1) / 2  # pixel centres at integers
    return np.array([[c, -s, cx + tx - c * cx + s * cy], [s, c, cy + ty - s * cx - c * cy]])


def _compose(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a after b, both (2, 3)."""
    return (np.vstack([a, [0, 0, 1]]) @ np.vstack([b, [0, 0, 1]]))[:2]


def synthetic_frames(image: np.ndarray, box: np.ndarray, points: np.ndarray, n_frames: int, moving: bool,
                     width: int = 320, height: int = 240, face_frac: float = 0.38, noise: float = 4.0,
                     jpeg_quality: int = 75, seed: int = 0,
                     fps: float = 25.0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(frame RGB, exact keypoints (68, 2)) for every frame: the photo placed so the face box
    is face_frac of the canvas height wide, centred, then moved by `path_affine`, with
    Gaussian pixel noise (sigma `noise`, fresh each frame) and a JPEG round trip."""
    k = face_frac * height / max(float(box[2]), 1.0)
    bc = np.array([box[0] + box[2] / 2 - 0.5, box[1] + box[3] / 2 - 0.5])  # box centre, pixel-centre coordinates
    place = np.array([[k, 0, (width - 1) / 2 - k * bc[0]], [0, k, (height - 1) / 2 - k * bc[1]]])
    rng = np.random.default_rng(seed)
    for i in range(n_frames):
        a = _compose(path_affine(i / fps, width, height, moving), place)
        frame = cv2.warpAffine(image, a, (width, height), flags=cv2.INTER_AREA if k < 1 else cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_REPLICATE)
        f = frame.astype(np.float32) + np.asarray(rng.normal(0, noise, frame.shape), dtype=np.float32)
        frame = np.clip(f, 0, 255).astype(np.uint8)
        ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality)])
        assert ok
        decoded = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
        assert decoded is not None
        truth = points @ a[:, :2].T + a[:, 2]
        yield decoded, truth


def make_test_video(out: str | os.PathLike, n_frames: int = 100, fps: float = 25.0, moving: bool = True,
                    seed: int = 0, photo: int = TEST_PHOTO, xml: str | os.PathLike | None = None, face: int = 0,
                    width: int = 320, height: int = 240, noise: float = 4.0,
                    jpeg_quality: int = 75) -> tuple[Path, Path]:
    """Write OUT (mp4) and its exact truth OUT stem + `_truth.csv` (pipeline/formats/video_csv.py,
    face id 0). Returns both paths."""
    check_output(out)
    if n_frames < 1:
        raise PipelineError("make-test-video", f"--frames must be >= 1, got {n_frames}")
    out = Path(out)
    if out.suffix.lower() != ".mp4":
        raise PipelineError(out, "the test video is written as .mp4")
    image, box, points = source_face(seed, photo, xml, face)
    truth = []
    with AtomicVideoWriter(out, fps) as vw:
        for frame, kp in synthetic_frames(image, box, points, n_frames, moving, width, height, noise=noise,
                                           jpeg_quality=jpeg_quality, seed=seed, fps=fps):
            vw.write(frame)
            truth.append(kp)
        truth_path = out.with_name(out.stem + "_truth.csv")
        idx = np.arange(n_frames)
        write_video_csv(truth_path, idx, idx / fps, np.zeros(n_frames, np.int64), np.stack(truth))
        vw.publish()
    return out, truth_path
