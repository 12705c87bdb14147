"""Faces across video frames, one track and one never-reused id per face. The detector runs
every `detect_every` frames, and sooner while a track is lost or nothing is tracked, but then
at most every `retry_every` frames, so its cost stays bounded whatever the model does; in
between, a face's next box is the box of its keypoints on this frame (`points_to_box`, in the
training boxes' convention). A track whose keypoints leave its face (a fast head turn) sends
the detector to that same frame to find it nearby, once per loss. A track closes when its face
leaves the picture, goes undetected on more than `max_missed` detection frames in a row, is
lost and not found again (a face found near it soon after takes its id back), duplicates an
older track, or (given a `threshold`) still scores below the face-presence keep threshold
(`keep_threshold`, default the threshold, which a detection needs to start a track) after the
detector's next run.

The detector and the predictor are injected (`detect(image) -> boxes (M, 4)`, `predict(image,
boxes) -> points (M, K, 2)` or `(points, scores (M,))`), so tests drive the tracker with
synthetic sequences and pipeline/inference/live.py with any backend. The rules and their
params: docs/video.md, "Tracking"."""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

import numpy as np

from pipeline.core.params_schema import VideoParams
from pipeline.detection.boxes import iou, overlap_of_smaller
from pipeline.detection.matching import greedy_pairs, match
from pipeline.formats.annotations import load_xml
from pipeline.keypoints.schema import IBUG68
from pipeline.keypoints.smoothing import OneEuroFilter

# A detection matched to a track (IoU >= video.match_iou) keeps the track's id; its box is
# the track's own (from 68 keypoints, closer to the training boxes than a converted
# detector box: Haar's has median IoU 0.78 with them) unless the two disagree below this
# IoU, in which case the track has drifted and restarts from the detector's box.
REANCHOR_IOU = 0.5
# ... and only when the detection's side (the square root of its area) is at least this share
# of the track's box side. Between the detector firing on the same face at another scale (down
# to half its side, which must still re-anchor a drifted track) and a false hit on a part of
# the face (an eye, the mouth: a third of its side or less), which would shrink the track to
# it until the next detector run. A larger detection always may: a weak model's keypoints
# collapse towards the crop's centre, and a shrunken track is what re-anchoring is for.
REANCHOR_MIN_SIDE = 0.4
# Two boxes of which this share of the smaller one lies inside the other are one face (the
# detector's boxes of one face at two scales, or two tracks that converged): a detection
# like that never starts a track, and of two tracks like that the younger is closed. Two
# real faces side by side overlap far less (heads do not interpenetrate by half).
SAME_FACE_OVERLAP = 0.5
MIN_BOX_PX = 8.0  # a tracked box smaller than this is lost (the face is gone or the points collapsed)
# A fast head turn moves the face further in one frame than IoU can follow (an IoU under 0.3
# between equal boxes is a shift of over half a side): a lost track takes the nearest detection
# of a comparable size (REANCHOR_MIN_SIDE) whose centre lies within this many sides of its box's
# centre, and a track closed as lost is continued, under its id, by a new face found that near
# within REVIVE_RUNS detector runs' worth of frames (REVIVE_RUNS * retry_every).
REFIND_REACH = 1.5
REVIVE_RUNS = 2


def points_to_box(points: np.ndarray, c: dict) -> np.ndarray:
    """Keypoints (K, 2) or (M, K, 2) -> boxes (M, 4) [left, top, w, h] in the training
    convention: width = w_scale * (keypoint x extent), height = h_scale * (y extent), centre
    = the extent's centre + (dx * x extent, dy * y extent). `c` holds the four constants
    (params video.box_*; `measure_points_to_box` derives them from a labelled XML)."""
    p = np.asarray(points, dtype=np.float64)
    p = p[None] if p.ndim == 2 else p
    lo, hi = p.min(axis=1), p.max(axis=1)  # (M, 2)
    ext = hi - lo
    cx = (lo[:, 0] + hi[:, 0]) / 2 + c["dx"] * ext[:, 0]
    cy = (lo[:, 1] + hi[:, 1]) / 2 + c["dy"] * ext[:, 1]
    w, h = c["w_scale"] * ext[:, 0], c["h_scale"] * ext[:, 1]
    return np.stack([cx - w / 2, cy - h / 2, w, h], axis=1)


def box_constants(video_cfg: VideoParams) -> dict:
    return {"w_scale": video_cfg.box_w_scale, "h_scale": video_cfg.box_h_scale,
            "dx": video_cfg.box_dx, "dy": video_cfg.box_dy}


def measure_points_to_box(xml_path: str | os.PathLike) -> dict:
    """The `points_to_box` constants of a labelled XML: medians over its faces of box width
    / keypoint x extent, box height / y extent, and the box centre's offset from the
    extent's centre in extents."""
    faces = load_xml(xml_path, IBUG68, require_parts=True)
    kp = np.stack([f.keypoints for f in faces])  # type: ignore[misc]  # require_parts=True: all have keypoints
    box = np.array([f.box for f in faces], dtype=np.float64)
    lo, hi = kp.min(axis=1), kp.max(axis=1)
    ext = np.maximum(hi - lo, 1e-9)
    mid = (lo + hi) / 2
    c = {"w_scale": np.median(box[:, 2] / ext[:, 0]), "h_scale": np.median(box[:, 3] / ext[:, 1]),
         "dx": np.median((box[:, 0] + box[:, 2] / 2 - mid[:, 0]) / ext[:, 0]),
         "dy": np.median((box[:, 1] + box[:, 3] / 2 - mid[:, 1]) / ext[:, 1])}
    return {"faces": len(faces), **{k: float(v) for k, v in c.items()}}


def visible_fraction(box: np.ndarray, width: int, height: int) -> float:
    """Share of the box's area inside the picture [0, width] x [0, height]."""
    left, top, w, h = (float(v) for v in box)
    iw = max(0.0, min(left + w, width) - max(left, 0.0))
    ih = max(0.0, min(top + h, height) - max(top, 0.0))
    return iw * ih / max(w * h, 1e-9)


def near_pairs(track_boxes: list[np.ndarray], boxes: np.ndarray, used: set[int]) -> list[tuple[int, int]]:
    """Greedy one-to-one pairs (track, detection), nearest first, of a track's box and a
    detection (not in `used`) of a comparable size (either side at least REANCHOR_MIN_SIDE of
    the other's) whose centre lies within REFIND_REACH sides (the track box's larger) of it."""
    free = [d for d in range(len(boxes)) if d not in used]
    if not track_boxes or not free:
        return []
    t, d = np.stack(track_boxes)[:, None], boxes[free][None]  # (T, 1, 4), (1, D, 4)
    side = np.maximum(t[..., 2], t[..., 3])
    dist = np.linalg.norm(d[..., :2] + d[..., 2:] / 2 - t[..., :2] - t[..., 2:] / 2, axis=-1) / side  # (T, D)
    ratio = np.sqrt(d[..., 2] * d[..., 3] / (t[..., 2] * t[..., 3]))
    comparable = (ratio >= REANCHOR_MIN_SIDE) & (ratio <= 1 / REANCHOR_MIN_SIDE)
    nearness = np.where(comparable, -dist, -np.inf)  # greedy_pairs takes the highest first
    return [(ti, free[di]) for ti, di, _ in greedy_pairs(nearness, -REFIND_REACH)]


class TrackState(Enum):
    """Where a track stands. FaceTracker moves a track only by `_move`, along MOVES."""

    CANDIDATE = "candidate"  # a detection not yet scored on this frame: no id, not shown
    TRACKED = "tracked"  # shown; its next box is the box of its keypoints
    LOST = "lost"  # its keypoints left the face: shown from its last good box until the detector finds it
    HIDDEN = "hidden"  # its face scored below the keep threshold: not shown, its box kept, until the detector looks again


CANDIDATE, TRACKED, LOST, HIDDEN = TrackState
# The moves a track makes (besides staying): a candidate whose face scored becomes a track; a
# track's keypoints leave the face, and come back to it or the detector re-anchors it; its face
# scores below the keep threshold, then above it again. A candidate that scores low is dropped,
# and a track of any state can close.
MOVES = {(CANDIDATE, TRACKED), (TRACKED, LOST), (LOST, TRACKED), (TRACKED, HIDDEN), (LOST, HIDDEN),
         (HIDDEN, TRACKED)}


@dataclass
class Track:
    first_frame: int
    box: np.ndarray  # this frame's input box (training convention)
    id: int | None = None  # None while a candidate; never reused
    state: TrackState = CANDIDATE
    points: np.ndarray | None = None  # raw keypoints of the last frame (K, 2)
    smoothed: np.ndarray | None = None
    last_frame: int = -1
    missed: int = 0  # detection frames in a row without a matching detection
    filter: OneEuroFilter | None = None
    end: str = ""  # why the track was closed
    score: float = float("nan")  # the face-presence score of its last prediction
    hidden_at: int = 0  # the detector's runs when it was hidden: a later run has looked again


Predict = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def unscored(predict: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Predict:
    """A predictor of keypoints only as a FaceTracker predictor: NaN scores (no score, a face)."""

    def scored(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return predict(image, boxes), np.full(len(boxes), np.nan)

    return scored


class FaceTracker:
    """`tracker.step(index, t, image)` -> the tracks shown after this frame (each with
    `points`, `smoothed`, `box`, `score`); `tracker.closed` lists closed tracks in closing
    order; `tracker.rejected` counts the detections that scored below `threshold` (None: no
    gate) and started no track; a track is kept while it scores at least `keep_threshold`
    (default: `threshold`). `detect(image) -> boxes (M, 4)`; `predict(image, boxes) ->
    (points (M, K, 2), scores (M,))`, NaN scores for a model without them (`unscored`)."""

    def __init__(self, detect: Callable[[np.ndarray], np.ndarray], predict: Predict, *, box_from_points: dict,
                 detect_every: int = 10, match_iou: float = 0.3, min_visible: float = 0.5, max_missed: int = 1,
                 max_faces: int = 0, retry_every: int = 5, smoother: Callable[[], Any] | None = None,
                 threshold: float | None = None, keep_threshold: float | None = None):
        self.detect, self.predict, self.box_from_points = detect, predict, box_from_points
        self.detect_every, self.match_iou = max(1, int(detect_every)), match_iou
        self.min_visible, self.max_missed, self.max_faces = min_visible, max_missed, max_faces
        self.retry_every = max(1, int(retry_every))
        self.smoother = smoother
        self.threshold = threshold
        self.keep_threshold = threshold if threshold is None or keep_threshold is None else \
            min(keep_threshold, threshold)
        self.rejected = 0  # detections that scored below the threshold
        self.active: list[Track] = []
        self.closed: list[Track] = []
        self.next_id = 0
        self.last_detect: int | None = None
        self.wanted = False  # a track was lost or left, or nothing is tracked, since the last run
        self.detections = 0  # frames the detector ran on

    def _move(self, track: Track, state: TrackState) -> None:
        """The one place a track changes state (MOVES)."""
        if state is track.state:
            return
        assert (track.state, state) in MOVES, f"a track cannot go from {track.state.value} to {state.value}"
        if state is HIDDEN:
            track.hidden_at = self.detections
        track.state = state

    def _checked(self, track: Track) -> bool:
        """The detector has run since the track was hidden."""
        return self.detections > track.hidden_at

    def _close(self, track: Track, why: str) -> None:
        track.end = why
        self.closed.append(track)

    def close_all(self, why: str = "end of video") -> None:
        for t in self.active:
            self._close(t, why)
        self.active = []

    def _off_face(self, points: np.ndarray, box: np.ndarray) -> bool:
        """Keypoints predicted from `box` that left its face: their box is tiny, or overlaps
        `box` below match_iou."""
        cand = points_to_box(points, self.box_from_points)[0]
        return min(cand[2], cand[3]) < MIN_BOX_PX or iou(cand[None], box[None])[0, 0] < self.match_iou

    def _match_detections(self, index: int, image: np.ndarray) -> None:
        boxes = np.asarray(self.detect(image), dtype=np.float64).reshape(-1, 4)
        self.detections += 1
        self.last_detect, self.wanted = index, False
        tracked = np.array([t.box for t in self.active]).reshape(-1, 4)
        pairs = match(tracked, boxes, self.match_iou)
        used = {di for _, di, _ in pairs}
        for ti, di, overlap in pairs:  # match's overlap is the IoU of the track's box and the detection
            self._found(self.active[ti], boxes[di], overlap)
        matched = {ti for ti, _, _ in pairs}
        # The same face at another scale (IoU below match_iou, half of the smaller box inside
        # the other) also continues its track: unmatched, the track would count a miss and
        # close while this very detection started a new id for the same face. Its box
        # follows the same rule as an IoU match.
        for ti, di in self._same_face_pairs(boxes, matched, used):
            self._found(self.active[ti], boxes[di], iou(self.active[ti].box[None], boxes[di][None])[0, 0])
            matched.add(ti)
            used.add(di)
        free = [i for i, t in enumerate(self.active) if i not in matched and t.state in (LOST, HIDDEN)]
        for ti, di in near_pairs([self.active[i].box for i in free], boxes, used):
            self._found(self.active[free[ti]], boxes[di], 0.0)
            matched.add(free[ti])
            used.add(di)
        keep = []
        for i, t in enumerate(self.active):
            if i not in matched:
                if t.state in (LOST, HIDDEN):
                    self._close(t, "lost (keypoints off the face, not found by the detector)")
                    continue
                t.missed += 1
                if t.missed > self.max_missed:
                    self._close(t, "not detected")
                    continue
            keep.append(t)
        self.active = keep
        gated = self.threshold is not None
        for di in range(len(boxes)):  # largest first (the detectors sort them)
            # with a gate, a false detection must not take the place of a face: every
            # candidate is scored, and max_faces applies to those that pass (step)
            if di in used or (self.max_faces and not gated and len(self.active) >= self.max_faces):
                continue
            # a face already tracked, found again (at another scale, or a part of it); with a
            # gate, only the tracks count: two candidates of one face are both scored, and the
            # younger of two that pass is a duplicate (step)
            taken = np.array([t.box for t in self.active if t.state is not CANDIDATE or not gated]).reshape(-1, 4)
            if len(taken) and overlap_of_smaller(boxes[di], taken).max() >= SAME_FACE_OVERLAP:
                continue
            self.active.append(Track(first_frame=index, box=boxes[di].copy(),
                                     filter=self.smoother() if self.smoother else None))

    def _found(self, track: Track, box: np.ndarray, overlap: float) -> None:
        """A detection `box` (IoU `overlap` with the track's box) of this track's face: no miss;
        the track restarts from it when lost or drifted (overlap below REANCHOR_IOU), unless
        the detection is far smaller than the track's box (REANCHOR_MIN_SIDE: a lost track
        then stays lost, and the detector tries again within retry_every frames). A hidden
        track stays hidden until its face scores again."""
        track.missed = 0
        comparable = box[2] * box[3] >= REANCHOR_MIN_SIDE ** 2 * track.box[2] * track.box[3]
        if (track.state in (LOST, HIDDEN) or overlap < REANCHOR_IOU) and comparable:
            track.box = box.copy()
            if track.state is LOST:
                self._move(track, TRACKED)

    def _same_face_pairs(self, boxes: np.ndarray, matched: set[int], used: set[int]) -> list[tuple[int, int]]:
        """Greedy one-to-one pairs (track, detection) among the unmatched ones whose boxes are
        one face (overlap of the smaller >= SAME_FACE_OVERLAP), highest overlap first."""
        free_t = [i for i in range(len(self.active)) if i not in matched]
        free_d = [d for d in range(len(boxes)) if d not in used]
        if not free_t or not free_d:
            return []
        m = overlap_of_smaller(np.stack([self.active[i].box for i in free_t]), boxes[free_d])  # (T, D)
        return [(free_t[a], free_d[b]) for a, b, _ in greedy_pairs(m, SAME_FACE_OVERLAP)]

    def step(self, index: int, t: float, image: np.ndarray) -> list[Track]:
        """One frame: each track's box from its last keypoints; the detector when due, or
        (at most every retry_every frames) when a track's face left the picture, nothing is
        tracked, or a track is lost or hidden; then keypoints for every track in one batch,
        searched for on this same frame where they lost a face that was tracked (`_search`);
        then the presence gate, and the shown tracks smoothed."""
        h, w = image.shape[:2]
        owed = False
        keep = []
        for tr in self.active:
            if tr.state is not HIDDEN:  # a hidden track keeps its last good box
                if self._off_face(tr.points, tr.box):  # type: ignore[arg-type]  # a track has points
                    self._move(tr, LOST)  # keeps its last good box, for the detector to find it again
                else:
                    tr.box = points_to_box(tr.points, self.box_from_points)[0]  # type: ignore[arg-type]
                    self._move(tr, TRACKED)
            if visible_fraction(tr.box, w, h) < self.min_visible:
                self._close(tr, "left the picture")
                owed = True
                continue
            keep.append(tr)
            owed = owed or tr.state is not TRACKED
        self.active = keep
        self.wanted = self.wanted or owed or not self.active  # the detector is owed a run
        since = None if self.last_detect is None else index - self.last_detect
        if since is None or since >= self.detect_every or (self.wanted and since >= self.retry_every):
            self._match_detections(index, image)
        if not self.active:
            return []
        points, scores = self._predict(image)
        if self._search(index, image, points, scores):
            if not self.active:
                return []
            points, scores = self._predict(image)
        keep = []
        for tr, p, score in zip(self.active, points, scores):
            tr.score = float(score)
            gate = self.threshold if tr.state is CANDIDATE else self.keep_threshold  # start a track, keep one
            if gate is None or not score < gate:  # NaN: no score, a face
                tr.points = p
                self._move(tr, TRACKED)
            elif tr.state is CANDIDATE:  # a detection that is no face starts no track
                self.rejected += 1
                continue
            elif tr.state is HIDDEN and self._checked(tr):  # still no face after the detector's fresh look
                self._close(tr, "not a face (presence score below the threshold)")
                continue
            else:  # hidden until the detector has had a look (at most retry_every frames)
                self._move(tr, HIDDEN)
                self.wanted = True
            keep.append(tr)
        self.active = keep
        self._drop_duplicates()
        shown = []
        for tr in self.active:
            if tr.state is HIDDEN:
                continue
            if tr.id is None:  # a candidate that passed: a track now, while max_faces allows
                if self.max_faces and sum(t.id is not None for t in self.active) >= self.max_faces:
                    continue
                self._assign_id(tr, index)
            side = float(max(tr.box[2], tr.box[3]))
            shown_points = tr.points  # this frame's: a shown track passed the gate above
            assert shown_points is not None
            tr.smoothed = tr.filter(shown_points, t, side) if tr.filter is not None else shown_points
            tr.last_frame = index
            shown.append(tr)
        self.active = [tr for tr in self.active if tr.id is not None]  # candidates max_faces left out go
        return shown

    def _search(self, index: int, image: np.ndarray, points: np.ndarray, scores: np.ndarray) -> bool:
        """The same-frame search: a track followed on the last frame whose face this frame's
        prediction lost (its keypoints' box is tiny or overlaps the track's box below
        match_iou, or the face scored below the keep threshold: a fast head turn outruns a box
        taken from the last keypoints) is lost now, and the detector looks at this very frame
        (unless it already has), where the face's detection continues it, near its box
        (REFIND_REACH) if no longer on it. Once per failure: a lost track waits for the
        detector's regular runs, so a model that keeps failing costs no more runs. True if the
        detector ran."""
        if self.last_detect == index:
            return False
        failing = [tr for tr, p, score in zip(self.active, points, scores) if tr.state is TRACKED and (
            self._off_face(p, tr.box) or (self.keep_threshold is not None and score < self.keep_threshold))]
        for tr in failing:
            self._move(tr, LOST)
        if failing:
            self._match_detections(index, image)
        return bool(failing)

    def _assign_id(self, track: Track, index: int) -> None:
        """A candidate that passed becomes a track: under the id of a track closed as lost in the
        last REVIVE_RUNS * retry_every frames near it (the same face, found again), else a new id."""
        # its face was lost on the frame after the last one it was shown on
        since = index - REVIVE_RUNS * self.retry_every
        recent = [t for t in self.closed if t.end.startswith("lost") and t.last_frame + 1 >= since]
        pairs = near_pairs([t.box for t in recent], track.box[None], set())
        if pairs:
            old = recent[pairs[0][0]]
            self.closed.remove(old)
            track.id, track.first_frame = old.id, old.first_frame
            return
        track.id = self.next_id
        self.next_id += 1

    def _predict(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(points (M, K, 2), scores (M,)) of the active tracks' boxes, in one batch."""
        points, scores = self.predict(image, np.stack([tr.box for tr in self.active]))
        return np.asarray(points, dtype=np.float64), np.asarray(scores, dtype=np.float64).reshape(-1)

    def _drop_duplicates(self) -> None:
        """Of two shown tracks whose keypoint boxes are one face, the younger goes (a candidate,
        always younger than the tracks, starts none). Hidden tracks' points are old: the
        detector settles them."""
        shown = [t for t in self.active if t.state is not HIDDEN]
        if len(shown) < 2:
            return
        # step() has predicted the points of every shown track
        boxes = points_to_box(np.stack([t.points for t in shown]), self.box_from_points)  # type: ignore[misc]
        m = overlap_of_smaller(boxes, boxes)
        keep: list[int] = []
        gone = set()
        for i, t in enumerate(shown):  # oldest first: a later track that overlaps an earlier one goes
            if any(m[i, j] >= SAME_FACE_OVERLAP for j in keep):
                if t.id is not None:
                    self._close(t, "duplicate of another track")
                gone.add(id(t))
                continue
            keep.append(i)
        self.active = [t for t in self.active if id(t) not in gone]
