"""Video files: reading frames and their time stamps (cv2.VideoCapture) and writing them
(cv2.VideoWriter) to a temp folder, published by a rename when complete, so a failed run
leaves no half video. Besides files, OpenCV's live capture sources: a camera index ("0")
or a stream URL ("rtsp://...", "http://...", "file:///..."), read through the same
interface (`open_capture`)."""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import cv2
import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import UMASK, input_file, write_error
from pipeline.keypoints.clock import FrameClock

log = logging.getLogger(__name__)

FALLBACK_FPS = 25.0  # for files that declare no frame rate


def open_video(path: str | os.PathLike) -> tuple[cv2.VideoCapture, float, int]:
    """(capture, frames per second, declared frame count (0 when unknown)) of a readable video."""
    path = input_file(path, "video file not found", "a video file")
    return _opened(cv2.VideoCapture(str(path)), path,
                   "cannot open as a video (not a video file, or a codec OpenCV cannot decode)")


def _opened(cap: cv2.VideoCapture, src, problem: str) -> tuple[cv2.VideoCapture, float, int]:
    """(cap, frames per second (FALLBACK_FPS when `src` declares none), declared frame count
    (0 when unknown)) of an opened capture; `problem` blamed on `src` when it did not open."""
    if not cap.isOpened():
        cap.release()
        raise PipelineError(src, problem)
    fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
    if not math.isfinite(fps) or fps <= 0:
        log.warning("%s declares no frame rate: assuming %g fps", src, FALLBACK_FPS)
        fps = FALLBACK_FPS
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
    return cap, fps, max(n, 0)


def capture_source(src: str | int | os.PathLike) -> int | str | None:
    """What cv2.VideoCapture should open for `src` when it is a live source: a camera index
    (an int, or digits that name no file) or a URL (it has "://"); None for a file path."""
    if isinstance(src, int):
        return src
    text = str(src)
    if text.isdigit() and not Path(text).exists():
        return int(text)
    if "://" in text:
        return text
    return None


def open_capture(src: str | int | os.PathLike) -> tuple[cv2.VideoCapture, float, int]:
    """`open_video` for a file, or a live capture source (`capture_source`): (capture, frames
    per second (FALLBACK_FPS when the source declares none), declared frame count (0 when
    unknown, as for a camera))."""
    live = capture_source(src)
    if live is None:
        return open_video(src)  # type: ignore[arg-type]  # not an int: capture_source returns ints
    what = f"camera {live}" if isinstance(live, int) else "the stream"
    return _opened(cv2.VideoCapture(live), str(src), f"cannot open {what} (OpenCV's capture found no such source)")


def frames_of(cap: cv2.VideoCapture) -> Iterator[np.ndarray]:
    """RGB uint8 frames until the stream ends."""
    while True:
        ok, bgr = cap.read()
        if not ok or bgr is None:
            return
        yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB) if bgr.ndim == 3 else cv2.cvtColor(bgr, cv2.COLOR_GRAY2RGB)


def timed_frames_of(cap: cv2.VideoCapture, fps: float) -> Iterator[tuple[float, np.ndarray]]:
    """(time in seconds from the first frame, RGB uint8 frame) until the stream ends. The time
    is the frame's own time stamp (variable frame rate clips exist, so i / fps can be wrong),
    repaired by pipeline/keypoints/clock.py's rule: a frame without a usable one (none, or not
    after the previous frame's) comes 1 / fps after the previous frame."""
    clock, origin = FrameClock(1 / fps), 0.0
    for i, frame in enumerate(frames_of(cap)):
        ms = float(cap.get(cv2.CAP_PROP_POS_MSEC))
        if i == 0:
            origin = ms if math.isfinite(ms) and ms >= 0 else 0.0
        t = clock(0.0 if i == 0 else (ms - origin) / 1000 if math.isfinite(ms) else None)
        yield t, frame


class AtomicVideoWriter:
    """cv2.VideoWriter (mp4v) into a temp folder beside `path`; `publish()` renames the file
    onto `path`, `discard()` (or leaving a `with` block by an exception) removes it."""

    def __init__(self, path: str | os.PathLike, fps: float):
        self.path, self.fps = Path(path), float(fps)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # VideoWriter picks the container by the file's extension: the temp file keeps .mp4
        self.dir = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}.tmp-"))
        self.tmp = self.dir / "video.mp4"
        self.vw: cv2.VideoWriter | None = None
        self.frames = 0

    def write(self, rgb: np.ndarray) -> None:
        if self.vw is None:
            h, w = rgb.shape[:2]
            self.vw = cv2.VideoWriter(str(self.tmp), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, (w, h))
            if not self.vw.isOpened():
                raise PipelineError(self.path, "cv2.VideoWriter cannot write mp4v "
                                               "(OpenCV built without a video backend?)")
        self.vw.write(cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR))
        self.frames += 1

    def publish(self) -> Path:
        if self.vw is None:
            raise PipelineError(self.path, "no frames to write")
        self.vw.release()
        try:
            os.chmod(self.tmp, 0o666 & ~UMASK)
            os.replace(self.tmp, self.path)
        except OSError as e:
            self.discard()
            raise write_error(self.path, e) from None
        self.discard()
        return self.path

    def discard(self) -> None:
        if self.vw is not None:
            self.vw.release()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "AtomicVideoWriter":
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            self.discard()


def write_mp4(path: str | os.PathLike, frames: Sequence[np.ndarray], fps: float) -> Path:
    """MP4 (mp4v) of RGB uint8 frames, published when complete."""
    with AtomicVideoWriter(path, fps) as vw:
        for f in frames:
            vw.write(f)
        return vw.publish()
