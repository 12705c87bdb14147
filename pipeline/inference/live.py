"""The per-frame face tracker for live sources (a webcam, a stream, a game engine) driven from
the caller's own loop: `Tracker.update(frame, t)` runs tracking.py's `FaceTracker` with the
Landmarker's scored predictions, gated by the models' face-presence threshold, and smooths
causally (One Euro) by default, since a live view cannot look ahead. `pipeline predict-video`
is a loop over it. Usage: docs/video.md, "Live sources"."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, cast

import numpy as np

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import VideoParams
from pipeline.detection.detectors import get_detector
from pipeline.inference.tracking import FaceTracker, box_constants, unscored
from pipeline.keypoints.clock import FrameClock
from pipeline.keypoints.smoothing import OneEuroFilter

SMOOTHING = ("one_euro", "none")


@dataclass(frozen=True)
class TrackedFace:
    """One face on one frame: its track id (stable while tracked, never reused), the box the
    model was given (4,) [left, top, width, height] in the training convention, the keypoints
    (K, 2) in frame pixels (smoothed; raw with smoothing none), the model's raw keypoints, and
    the face-presence score (NaN for a model without heatmaps)."""

    id: int
    box: np.ndarray
    points: np.ndarray
    raw: np.ndarray
    score: float


class Tracker:
    """`update(frame, t)` -> [TrackedFace] on each frame; see the module docstring.

    landmarker: a `pipeline.inference.landmarker.Landmarker` (`landmarker.tracker()` makes
    this), or any predictor with `predict(image, boxes) -> points (M, K, 2)` (unscored: no
    gate), or with `predict(image, boxes, scores=True) -> (points, scores)` and
    `presence_threshold` (and `presence_keep`, the lower score that keeps a track); video: the
    tracking params (default: the `video` section of the working directory's params.yaml, as
    predict-video reads it); smoothing: one_euro | none; detect: `detect(image) -> boxes (M, 4)`
    (default: the video.detector; without `video`, the landmarker's unless it is auto);
    presence: gate tracks by the models' threshold (default: video.presence)."""

    def __init__(self, landmarker: Any, video: VideoParams | None = None, *, smoothing: str = "one_euro",
                 detect: Callable[[np.ndarray], np.ndarray] | None = None, presence: bool | None = None):
        if smoothing not in SMOOTHING:
            raise PipelineError(None, f"smoothing must be one of {', '.join(SMOOTHING)}, got '{smoothing}'")
        # predict-video's params: the working directory's params.yaml (the defaults without one)
        v = video or load_config().video
        if detect is None:
            chosen = getattr(landmarker, "detector", "auto")  # a Landmarker's own choice wins over params' auto
            found = get_detector(v.detector if video is not None or chosen == "auto" else chosen)

            def detect(image: np.ndarray) -> np.ndarray:
                return found(image, 0)[0]

        scored = hasattr(landmarker, "presence_threshold")
        gate = scored and ((v.presence == "on") if presence is None else bool(presence))
        smoother = (lambda: OneEuroFilter(v.min_cutoff, v.beta, v.d_cutoff)) if smoothing == "one_euro" else None
        self.landmarker = landmarker
        # a face starts a track at `threshold` and keeps it down to `keep_threshold` (None: no gate)
        self.threshold: float | None = landmarker.presence_threshold if gate else None
        self.keep_threshold: float | None = getattr(landmarker, "presence_keep", None) if gate else None
        predict = partial(landmarker.predict, scores=True) if scored else unscored(landmarker.predict)
        self._tracker = FaceTracker(detect, predict, box_from_points=box_constants(v),
                                    detect_every=v.detect_every, match_iou=v.match_iou, min_visible=v.min_visible,
                                    max_missed=v.max_missed, max_faces=v.max_faces, retry_every=v.retry_every,
                                    smoother=smoother, threshold=self.threshold, keep_threshold=self.keep_threshold)
        self.frames = 0
        self._clock = FrameClock()

    def update(self, frame: np.ndarray, t: float | None = None) -> list[TrackedFace]:
        """The faces of the next frame (RGB uint8 (H, W, 3)) at time t in seconds (None: by the
        monotonic clock). Times that repeat or jump back are repaired, a non-finite one is an
        error: pipeline/keypoints/clock.py."""
        image = np.asarray(frame)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or not image.size:
            raise PipelineError(None, f"a frame must be RGB uint8 (H, W, 3), got {image.dtype} {image.shape}")
        t = self._clock(t)
        tracks = self._tracker.step(self.frames, float(t), image)
        self.frames += 1
        # shown and closed tracks have ids (only a candidate has none)
        return [TrackedFace(cast(int, tr.id), tr.box.copy(), np.array(tr.smoothed, dtype=np.float64),
                            np.array(tr.points, dtype=np.float64), float(tr.score)) for tr in tracks]

    def close(self) -> list[dict]:
        """End the stream: every open track closes; returns `tracks`."""
        self._tracker.close_all()
        return self.tracks

    @property
    def tracks(self) -> list[dict]:
        """The closed tracks, by id: {id, first_frame, last_frame, end}."""
        return [{"id": t.id, "first_frame": t.first_frame, "last_frame": t.last_frame, "end": t.end}
                for t in sorted(self._tracker.closed, key=lambda t: cast(int, t.id))]

    @property
    def open_ids(self) -> set[int]:
        """The ids of the open tracks, shown on the last frame or hidden (their face scored below
        the threshold, and the detector has yet to look again)."""
        return {t.id for t in self._tracker.active if t.id is not None}

    @property
    def detections(self) -> int:
        """Frames the detector ran on."""
        return self._tracker.detections

    @property
    def rejected(self) -> int:
        """Detections that were no face (scored below the threshold) and started no track."""
        return self._tracker.rejected
