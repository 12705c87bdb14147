"""Faces in motion: `pipeline predict-video` (keypoints on every frame of a video, with face
tracking, pipeline/inference/tracking.py, and smoothing over time, `video.filter`: a centred
local quadratic by default, or One Euro, pipeline/keypoints/smoothing.py), `pipeline video-stats`
(jitter, lag and frame rates without ground truth), `pipeline make-test-video` (the test video
with exact truth of pipeline/synth/moving_face.py), and the measurements behind the smoothing
defaults (`score_video`, `measure_smoothing` for `pipeline bench`'s video section, and
`tune_one_euro` for the One Euro table of docs/video.md). Video files are read and written by pipeline/formats/video.py."""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence, cast

import click
import cv2
import numpy as np
from tqdm import tqdm

from pipeline.core.config import config_options
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, write_csv
from pipeline.core.params_schema import Config, VideoParams
from pipeline.detection.detectors import get_detector
from pipeline.formats.images import write_png
from pipeline.formats.video import AtomicVideoWriter, capture_source, open_capture, open_video, timed_frames_of
from pipeline.formats.video_csv import read_video_csv, write_video_csv
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.live import TrackedFace, Tracker
from pipeline.inference.options import model_options
from pipeline.keypoints.draw import contact_sheet, draw_faces, put_label
from pipeline.keypoints.geometry import crop_face
from pipeline.keypoints.smoothing import WINDOW_TOLERANCE_S, OneEuroFilter, local_poly_in_time, window_counts
from pipeline.keypoints.temporal import (
    lag,
    lag_along_motion,
    per_second_rate,
    second_difference_jitter,
    track_summary,
)
from pipeline.synth.moving_face import TEST_PHOTO, make_test_video

log = logging.getLogger(__name__)

# A least-squares quadratic through 3 frames passes through all of them: the poly window
# smooths a frame only when it holds at least this many.
POLY_MIN_FRAMES = 4


# ------------------------------------------------------------------------------ tracking a video

def draw_frame(frame: np.ndarray, tracks: list[tuple[int, np.ndarray, np.ndarray]], schema) -> np.ndarray:
    """The frame with each face's box, keypoints (coloured by part) and id."""
    return draw_faces(frame, tracks, schema)


def _face_tile(image: np.ndarray, box: np.ndarray | None, side: int = 144) -> np.ndarray:
    """A side x side tile: the square around the box (1.6x its longer side), else the frame."""
    if box is None:
        return cv2.resize(image, (side, side), interpolation=cv2.INTER_AREA)
    return crop_face(image, box, 1.6, side)[0]


@dataclass
class VideoRows:
    """One row per face per frame, in frame order: the columns `track_video` returns. A row's
    smoothed points are None until its smoothing window is complete (`WindowSmoother`)."""

    frame: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    face: list[int] = field(default_factory=list)
    raw: list[np.ndarray] = field(default_factory=list)
    smoothed: list[np.ndarray | None] = field(default_factory=list)
    side: list[float] = field(default_factory=list)
    box: list[np.ndarray] = field(default_factory=list)
    score: list[float] = field(default_factory=list)

    def add(self, index: int, t: float, face: TrackedFace, smoothed: bool) -> int:
        """Append `face` on frame `index` at time t (its smoothed points too, if `smoothed`);
        returns its row."""
        self.frame.append(index)
        self.time.append(t)
        self.face.append(face.id)
        self.raw.append(face.raw)
        self.smoothed.append(face.points if smoothed else None)
        self.side.append(float(max(face.box[2], face.box[3])))
        self.box.append(face.box)
        self.score.append(face.score)
        return len(self.frame) - 1

    def arrays(self, k: int) -> dict[str, np.ndarray]:
        return {"frame": np.asarray(self.frame, dtype=np.int64), "time": np.asarray(self.time, dtype=np.float64),
                "face": np.asarray(self.face, dtype=np.int64),
                "raw": np.asarray(self.raw, dtype=np.float64).reshape(-1, k, 2),
                "smoothed": np.asarray(self.smoothed, dtype=np.float64).reshape(-1, k, 2),
                "side": np.asarray(self.side, dtype=np.float64),
                "box": np.asarray(self.box, dtype=np.float64).reshape(-1, 4),
                "score": np.asarray(self.score, dtype=np.float64)}


class WindowSmoother:
    """video.filter poly: a centred local quadratic in time over each track's rows within
    +-half_s of a row's time stamp (no lag, half_s of latency). A row is smoothed once a frame
    later than `reach` past it has been seen, or its track has closed; its window is sliced as
    wide, and local_poly_in_time keeps the frames within half_s of it."""

    def __init__(self, rows: VideoRows, half_s: float):
        self.rows, self.half_s = rows, half_s
        self.reach = half_s + 2 * WINDOW_TOLERANCE_S
        self.track_rows: dict[int, list[int]] = {}  # face id -> its rows, in frame order (open tracks)
        self.done: dict[int, int] = {}  # face id -> how many of its rows are smoothed

    def add(self, row: int) -> None:
        self.track_rows.setdefault(self.rows.face[row], []).append(row)

    def settle(self, now: float, open_ids: set[int]) -> None:
        """Smooth every row whose window is complete at time `now`, with the tracks `open_ids` still open."""
        times, raw = self.rows.time, self.rows.raw
        for fid in list(self.track_rows):
            rs, j = self.track_rows[fid], self.done.get(fid, 0)  # rs in frame order: their times increase
            while j < len(rs) and (fid not in open_ids or times[rs[j]] + self.reach < now):
                t = times[rs[j]]
                lo = bisect.bisect_left(rs, t - self.reach, key=times.__getitem__)
                hi = bisect.bisect_right(rs, t + self.reach, key=times.__getitem__)
                window = np.asarray([raw[r] for r in rs[lo:hi]])
                self.rows.smoothed[rs[j]] = local_poly_in_time(window, np.asarray([times[r] for r in rs[lo:hi]]),
                                                               j - lo, self.half_s)
                j += 1
            self.done[fid] = j
            if fid not in open_ids:
                del self.track_rows[fid]  # closed, every row smoothed


class FrameDrawer:
    """Draws each frame once all its rows are smoothed, in frame order: into `writer` (None:
    no video), with the smoothed points (`smooth`) or the raw ones; the frames numbered in
    `keep` also as tiles {frame: (raw, smoothed)} in `kept`."""

    def __init__(self, rows: VideoRows, schema, writer: AtomicVideoWriter | None, keep: Sequence[int],
                 smooth: bool):
        self.rows, self.schema, self.writer, self.smooth = rows, schema, writer, smooth
        self.keep = set(keep)
        self.kept: dict[int, tuple[np.ndarray, ...]] = {}
        self.pending: deque[tuple[int, np.ndarray, list[int]]] = deque()  # (frame, image, its rows)

    def add(self, index: int, image: np.ndarray, rows: list[int]) -> None:
        self.pending.append((index, image, rows))
        self.flush()

    def flush(self) -> None:
        r = self.rows
        while self.pending and all(r.smoothed[i] is not None for i in self.pending[0][2]):
            j, image, rs = self.pending.popleft()
            # every row of this frame is smoothed now: both columns hold points
            raw, smoothed = r.raw, cast(list[np.ndarray], r.smoothed)
            if self.writer is not None:
                points = smoothed if self.smooth else raw
                self.writer.write(draw_frame(image, [(r.face[i], r.box[i], points[i]) for i in rs], self.schema))
            if j in self.keep:
                self.kept[j] = tuple(_face_tile(draw_frame(image, [(r.face[i], r.box[i], column[i]) for i in rs],
                                                           self.schema), r.box[rs[0]] if rs else None)
                                     for column in (raw, smoothed))


def track_video(src: str | int | os.PathLike, landmarker: Landmarker, vcfg: VideoParams, *,
                out_mp4: str | os.PathLike | None = None, smooth: bool = True, progress: bool = True,
                detect=None, keep: Sequence[int] = (), max_frames: int = 0) -> dict[str, Any]:
    """Keypoints of every face on every frame of `src` (a file, or a camera index or stream URL:
    pipeline/formats/video.py `open_capture`): a loop over the per-frame tracker
    (`landmarker.tracker()`: pipeline/inference/live.py) whose faces go into `VideoRows`, the
    centred smoothing (`WindowSmoother`, video.filter poly; One Euro is the tracker's own) and
    the drawing into `out_mp4` (`FrameDrawer`).
    Returns rows (frame, time, face, raw points, smoothed points, box side, box, presence
    score) as arrays, the video's fps and frame count, closed tracks, the number of detector
    runs and of detections rejected as no face, and the seconds spent end to end (decode,
    detect, predict, draw, encode). The frames numbered in `keep` come back drawn both ways:
    {"kept": {i: (raw, smoothed)}}. max_frames: stop after this many (0: at the end; a live
    source also ends at Ctrl-C)."""
    schema = landmarker.schema
    is_live = capture_source(src) is not None
    causal = vcfg.filter == "one_euro"
    tracker = Tracker(landmarker, vcfg, smoothing="one_euro" if causal else "none", detect=detect)
    cap, fps, declared = open_capture(src)
    rows = VideoRows()
    smoother = None if causal else WindowSmoother(rows, vcfg.half_window_s)
    writer = AtomicVideoWriter(out_mp4, fps) if out_mp4 is not None else None
    drawer = FrameDrawer(rows, schema, writer, keep, smooth)
    t0 = time.perf_counter()
    n = 0
    times: list[float] = []  # every frame's, for the warning on clips too slow to smooth
    spent_on: list[float] = []  # seconds per frame, end to end (decode of the next frame included)
    last = t0
    try:
        frames: Iterable[tuple[float, np.ndarray]] = timed_frames_of(cap, fps)
        if max_frames:
            frames = itertools.islice(frames, max_frames)
        if progress:
            total = min(declared, max_frames) if declared and max_frames else declared or max_frames
            frames = tqdm(frames, total=total or None, desc="predict-video", unit="frame")
        try:
            for i, (t, frame) in enumerate(frames):
                times.append(t)
                these = [rows.add(i, t, face, smoothed=causal) for face in tracker.update(frame, t)]
                if smoother is not None:
                    for r in these:
                        smoother.add(r)
                    smoother.settle(t, tracker.open_ids)
                drawer.add(i, frame, these)
                n = i + 1
                now = time.perf_counter()
                spent_on.append(now - last)
                last = now
        except KeyboardInterrupt:
            if not is_live or n == 0:
                raise
            log.info("%s: stopped after %d frames", src, n)  # a camera has no end: Ctrl-C is one
        if n == 0:
            raise PipelineError(str(src), "no frame could be decoded")
        tracker.close()
        if smoother is not None:
            smoother.settle(float("inf"), set())
        drawer.flush()
        if writer is not None:
            writer.publish()
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    finally:
        cap.release()
    if smoother is not None and vcfg.half_window_s > 0:
        warn_if_too_slow(src, np.asarray(times), vcfg.half_window_s)
    return {"fps": fps, "frames": n, "seconds": time.perf_counter() - t0, "detections": tracker.detections,
            "kept": drawer.kept, "rejected": tracker.rejected, "presence_threshold": tracker.threshold,
            "frame_seconds": np.asarray(spent_on), "eyes": schema.eyes, "tracks": tracker.tracks,
            **rows.arrays(schema.k)}


def warn_if_too_slow(src: str | int | os.PathLike, times: np.ndarray, half_s: float) -> None:
    """One warning when most frames' poly window (+-half_s around them) holds fewer than
    POLY_MIN_FRAMES frames: their keypoints come out as raw as they went in."""
    if len(times) < 2:
        return
    short = int((window_counts(times, half_s) < POLY_MIN_FRAMES).sum())
    if 2 * short > len(times):
        gap = float(np.median(np.diff(times)))
        log.warning("%s: frames %.3g s apart: on %d of %d frames +-%g s (video.half_window_s) holds fewer than the "
                    "%d frames a local quadratic needs to smooth, so their keypoints stay raw; set "
                    "video.half_window_s to %.3g or more to smooth this clip", src, gap, short, len(times), half_s,
                    POLY_MIN_FRAMES, 2 * gap)


def run_predict_video(cfg: Config, src: str, checkpoints: Sequence[str], out: str | None = None,
                      csv_path: str | None = None, smooth: str | None = None, device_name: str = "auto",
                      backend: str = "torch", tta: str | None = None, strip: str | None = None,
                      strip_frames: int = 4, max_frames: int = 0) -> dict[str, Any]:
    """`pipeline predict-video`: the annotated mp4, the CSV with `csv_path`, and with `strip`
    a PNG of strip_frames evenly spaced frames, raw predictions above, smoothed below. `src`:
    a video file, or a live capture source (a camera index, a stream URL); max_frames: stop
    after this many frames (0: at the stream's end)."""
    vcfg = cfg.video if smooth is None else cfg.video.model_copy(update={"smooth": smooth})
    live = capture_source(src)
    cap, _, declared = open_capture(src)  # a bad input fails before the models load
    cap.release()
    if max_frames:
        declared = min(declared, max_frames) if declared else max_frames
    src_path = Path(str(src))
    stem = src_path.stem if live is None else (f"camera{live}" if isinstance(live, int) else "stream")
    out_path = Path(out) if out else Path("out") / f"{stem}_keypoints.mp4"
    if out_path.suffix.lower() != ".mp4":
        raise PipelineError(out_path, "--out must end in .mp4")
    for p in (out_path, csv_path, strip):
        if p is not None and live is None and Path(p).resolve() == src_path.resolve():
            raise PipelineError(p, "would overwrite the input video")
        if p is not None:
            check_output(p)
    get_detector(vcfg.detector)  # a missing detector fails before the models load
    landmarker = Landmarker.from_checkpoints(checkpoints, backend=backend, device=resolve_device(device_name),
                                             tta=tta or cfg.predict.tta)
    keep = sorted({int(round(v)) for v in np.linspace(0, max(declared - 1, 0), strip_frames)}) if strip else []
    res = track_video(src_path if live is None else live, landmarker, vcfg, out_mp4=out_path,
                      smooth=vcfg.smooth == "on", keep=keep, max_frames=max_frames)
    pts = res["smoothed"] if vcfg.smooth == "on" else res["raw"]
    if csv_path:
        write_video_csv(csv_path, res["frame"], res["time"], res["face"], pts, res["score"])
    if strip and res["kept"]:
        frames = sorted(res["kept"])
        tiles = [put_label(res["kept"][i][row].copy(), f"frame {i} {name}")
                 for row, name in ((0, "raw"), (1, "smoothed")) for i in frames]
        how = (f"local quadratic over +-{vcfg.half_window_s:g} s" if vcfg.filter == "poly" else
               f"One Euro, min_cutoff {vcfg.min_cutoff:g}, beta {vcfg.beta:g}")
        write_png(strip, contact_sheet(tiles, cols=len(frames), title=f"{src_path.name}: raw (top) vs smoothed ({how})"))
    res.update(out=str(out_path), csv=str(csv_path) if csv_path else None, smooth=vcfg.smooth)
    res["stats"] = clip_stats(res, expected_faces=vcfg.max_faces)
    log.info("%s -> %s", format_clip_stats(str(src), res["stats"]), out_path)
    return res


# ------------------------------------------------------------------------------ measuring

def clip_stats(res: dict, smoothed: np.ndarray | None = None, expected_faces: int = 0) -> dict[str, Any]:
    """What a `track_video` run on footage without truth can say about itself: tracks, id
    switches and frames with more faces than expected (pipeline/keypoints/temporal.py),
    frames/s per second of the clip (median, slowest), and jitter raw vs smoothed and the
    smoothing's lag in eye distances: its mean distance from the raw points and best delay,
    and its signed offset along the motion (`smoothed`: other smoothed rows than the run's)."""
    sm = res["smoothed"] if smoothed is None else smoothed
    scores = np.asarray(res.get("score", []), dtype=np.float64)
    scores = scores[np.isfinite(scores)]
    out: dict[str, Any] = {"frames": res["frames"], "detections": res["detections"],
                           "rejected": res.get("rejected", 0),
                           "score_min": float(scores.min()) if len(scores) else float("nan"),
                           **track_summary(res["frame"], res["face"], res["frames"], expected_faces),
                           "frames_per_s": per_second_rate(res["frame_seconds"], res["fps"])}
    eyes = res["eyes"]
    if eyes is None or not len(res["frame"]):
        return out
    raw_j = second_difference_jitter(res["frame"], res["face"], res["raw"], res["raw"], eyes)
    sm_j = second_difference_jitter(res["frame"], res["face"], sm, res["raw"], eyes)
    out.update(jitter_raw=raw_j, jitter_smoothed=sm_j, jitter_reduction=1 - sm_j / raw_j if raw_j > 0 else float("nan"),
               lag=lag(res["frame"], res["face"], sm, res["raw"], eyes),
               lag_along_motion=lag_along_motion(res["frame"], res["face"], sm, res["raw"], eyes))
    return out


def format_clip_stats(name: str, st: dict) -> str:
    """One log line of `clip_stats`."""
    r = st["frames_per_s"]
    line = (f"{name}: {st['frames']} frames, {st['tracks']} track(s), {st['id_switches']} id switch(es), "
            f"{st['extra_face_frames']} frame(s) with more than {st['expected_faces']} face(s), detector on "
            f"{st['detections']} frame(s), {st['rejected']} detection(s) rejected as no face, lowest presence "
            f"score shown {st['score_min']:.3f}; frames/s median {r['median']:.1f}, slowest second "
            f"{r['slowest_second']} at {r['slowest']:.1f} ({r['ratio']:.2f} x median)")
    if "jitter_raw" in st:
        line += (f"; jitter {100 * st['jitter_raw']:.3f}% -> {100 * st['jitter_smoothed']:.3f}% of the eye distance "
                 f"({-100 * st['jitter_reduction']:+.0f}%), lag {100 * st['lag']['offset']:.3f}%, "
                 f"{st['lag']['delay']:.0f} frame(s), along the motion {100 * st['lag_along_motion']:+.3f}%")
    return line


def _nearest_rows(pred: dict, truth: dict) -> dict[int, int]:
    """truth row -> the predicted row of the same frame nearest to it (mean point distance)."""
    by_frame: dict[int, list[int]] = {}
    for r, f in enumerate(pred["frame"]):
        by_frame.setdefault(int(f), []).append(r)
    out = {}
    for t, f in enumerate(truth["frame"]):
        cand = by_frame.get(int(f), [])
        if cand:
            d = [np.linalg.norm(pred["points"][r] - truth["points"][t], axis=-1).mean() for r in cand]
            out[t] = cand[int(np.argmin(d))]
    return out


def score_video(pred: dict, truth: dict, eyes: tuple[int, int] = (36, 45)) -> dict[str, float]:
    """NME (mean point error / the truth's outer-eye-corner distance, averaged over frames
    with truth and a prediction), jitter (mean over consecutive frames of one track of the
    keypoints' frame-to-frame motion less the truth's motion, px; on a still face simply
    their motion) and the share of truth frames without a prediction.
    `pred` and `truth` as pipeline.formats.video_csv.read_video_csv returns them."""
    near = _nearest_rows(pred, truth)
    nme = []
    for t, r in near.items():
        g, p = truth["points"][t], pred["points"][r]
        nme.append(np.linalg.norm(p - g, axis=-1).mean() / np.linalg.norm(g[eyes[0]] - g[eyes[1]]))
    jit = []
    for t in range(1, len(truth["frame"])):
        if t in near and t - 1 in near and truth["frame"][t] == truth["frame"][t - 1] + 1:
            a, b = near[t - 1], near[t]
            if pred["face"][a] == pred["face"][b]:
                dp = pred["points"][b] - pred["points"][a]
                dg = truth["points"][t] - truth["points"][t - 1]
                jit.append(np.linalg.norm(dp - dg, axis=-1).mean())
    return {"nme": float(np.mean(nme)) if nme else float("nan"),
            "jitter_px": float(np.mean(jit)) if jit else float("nan"),
            "missed": 1.0 - len(near) / max(len(truth["frame"]), 1)}


def resmooth(res: dict, min_cutoff: float, beta: float, d_cutoff: float) -> np.ndarray:
    """The raw rows of a `track_video` result smoothed again with other One Euro params (the
    boxes come from the raw points, so this equals a rerun with those params)."""
    out = np.empty_like(res["raw"])
    filters: dict[int, OneEuroFilter] = {}
    for r in range(len(res["frame"])):
        f = filters.setdefault(int(res["face"][r]), OneEuroFilter(min_cutoff, beta, d_cutoff))
        out[r] = f(res["raw"][r], float(res["time"][r]), float(res["side"][r]))
    return out


def _as_pred(res: dict, points: np.ndarray) -> dict:
    return {"frame": res["frame"], "face": res["face"], "points": points}


def tune_one_euro(still: dict, still_truth: dict, moving: dict, moving_truth: dict,
                  min_cutoffs: Sequence[float] = (0.1, 0.3, 1.0, 2.0, 4.0),
                  betas: Sequence[float] = (0.0, 10.0, 30.0, 100.0, 300.0, 1000.0),
                  d_cutoffs: Sequence[float] = (1.0, 3.0, 10.0), max_nme_ratio: float = 1.03) -> dict[str, Any]:
    """Grid over (min_cutoff, beta, d_cutoff) on `track_video` results of a still and a moving
    test video: the setting with the lowest still-face jitter among those whose NME on the moving
    video is at most max_nme_ratio x the raw NME; every row of the grid comes back too."""
    raw_still = score_video(_as_pred(still, still["raw"]), still_truth)
    raw_moving = score_video(_as_pred(moving, moving["raw"]), moving_truth)
    grid = []
    for mc, b, dc in itertools.product(min_cutoffs, betas, d_cutoffs):
        s = score_video(_as_pred(still, resmooth(still, mc, b, dc)), still_truth)
        m = score_video(_as_pred(moving, resmooth(moving, mc, b, dc)), moving_truth)
        grid.append({"min_cutoff": mc, "beta": b, "d_cutoff": dc, "still_jitter": s["jitter_px"],
                     "still_nme": s["nme"], "moving_jitter": m["jitter_px"], "moving_nme": m["nme"]})
    ok = [g for g in grid if g["moving_nme"] <= max_nme_ratio * raw_moving["nme"]]
    best = min(ok, key=lambda g: (g["still_jitter"], g["moving_jitter"])) if ok else None
    return {"raw_still": raw_still, "raw_moving": raw_moving, "grid": grid, "best": best,
            "criterion": f"lowest still-face jitter with moving NME <= {max_nme_ratio} x raw"}


def measure_smoothing(landmarker: Landmarker, vcfg: VideoParams, workdir: str | os.PathLike, n_frames: int = 60,
                      detect=None) -> dict[str, Any]:
    """Jitter and NME, raw vs smoothed (the params' `video.filter`), on a still and a moving test
    video made in `workdir`, and frames/s end to end on the moving one (annotated mp4 written)."""
    out: dict[str, Any] = {"frames": n_frames}
    for kind in ("still", "moving"):
        mp4, truth_csv = make_test_video(Path(workdir) / f"{kind}.mp4", n_frames, moving=kind == "moving")
        truth = read_video_csv(truth_csv)
        res = track_video(mp4, landmarker, vcfg, progress=False, detect=detect,
                          out_mp4=Path(workdir) / f"{kind}_keypoints.mp4")
        out[kind] = {"raw": score_video(_as_pred(res, res["raw"]), truth),
                     "smoothed": score_video(_as_pred(res, res["smoothed"]), truth),
                     "tracks": len(res["tracks"]), "detections": res["detections"], "stats": clip_stats(res),
                     "frames_per_s": res["frames"] / max(res["seconds"], 1e-9)}
    out["frames_per_s"] = out["moving"]["frames_per_s"]
    out["one_euro"] = {k: getattr(vcfg, k) for k in ("min_cutoff", "beta", "d_cutoff")}
    out["filter"] = (f"local quadratic over +-{vcfg.half_window_s:g} s" if vcfg.filter == "poly" else
                     f"One Euro min_cutoff {vcfg.min_cutoff:g} beta {vcfg.beta:g}")
    return out


# ------------------------------------------------------------------------------ commands

@click.command("predict-video")
@click.argument("src", metavar="IN")
@model_options
@click.option("--out", default=None, help="annotated video (.mp4) [out/<IN stem>_keypoints.mp4]")
@click.option("--csv", "csv_path", default=None, help="also write one row per frame and face to this CSV")
@click.option("--smooth", type=click.Choice(["on", "off"]), default=None,
              help="smoothing over time (video.filter); off: raw predictions [params video.smooth]")
@click.option("--tta", type=click.Choice(["flip", "none"]), default=None, help="[params predict.tta]")
@click.option("--strip", default=None, help="also write a PNG of 4 frames (around the first face), raw above smoothed")
@click.option("--max-frames", default=0, show_default=True, type=click.IntRange(min=0),
              help="stop after N frames (0: at the end of the video; a camera also stops at Ctrl-C)")
@config_options
def predict_video_cmd(src, checkpoints, out, csv_path, smooth, tta, strip, device, backend, max_frames, cfg):
    """Keypoints on every frame of a video: faces detected every video.detect_every frames
    and tracked in between (only what the model scores as a face: video.presence), smoothed
    over time, drawn into an mp4. IN: a video file, or an OpenCV capture source: a camera
    index (0) or a stream URL (rtsp://..., http://...)."""
    res = run_predict_video(cfg, src, checkpoints, out, csv_path, smooth, device, backend, tta, strip,
                            max_frames=max_frames)
    rejected = f", {res['rejected']} detection(s) rejected as no face" if res["rejected"] else ""
    click.echo(f"{src}: {res['frames']} frames, {len(res['tracks'])} face track(s){rejected} -> {res['out']}"
               + (f", {res['csv']}" if res["csv"] else ""))


@click.command("make-test-video")
@click.argument("out", default="data/video/moving.mp4")
@click.option("--frames", "n_frames", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--fps", default=25.0, show_default=True, type=click.FloatRange(min=1))
@click.option("--still", is_flag=True, help="no motion (for jitter): only the noise and JPEG round trip change")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="demo seed and noise seed")
@click.option("--photo", default=TEST_PHOTO, show_default=True, type=click.IntRange(min=0),
              help="demo test photo number (rendered in memory)")
@click.option("--xml", default=None, help="use a labelled face of this XML instead of a demo face")
@click.option("--face", default=0, show_default=True, type=click.IntRange(min=0), help="face number in --xml")
def make_test_video_cmd(out, n_frames, fps, still, seed, photo, xml, face):
    """A face moved along a known smooth path (shift, scale, roll) with noise and JPEG
    re-encoding: OUT (.mp4) and OUT's stem + _truth.csv, the exact keypoints of every frame."""
    mp4, truth = make_test_video(out, n_frames, fps, not still, seed, photo, xml, face)
    click.echo(f"wrote {mp4} and {truth}")



STATS_COLUMNS = ("clip", "frames", "tracks", "id_switches", "extra_face_frames", "detections", "rejected",
                 "score_min", "fps_median", "fps_slowest", "slowest_second", "jitter_raw_pct", "jitter_smoothed_pct",
                 "jitter_reduction_pct", "lag_offset_pct", "lag_delay_frames", "lag_along_motion_pct")


def stats_row(clip: str, st: dict) -> list:
    r = st["frames_per_s"]
    return [clip, st["frames"], st["tracks"], st["id_switches"], st["extra_face_frames"], st["detections"],
            st["rejected"], round(st["score_min"], 4), round(r["median"], 2), round(r["slowest"], 2), r["slowest_second"],
            *(round(100 * st.get(k, float("nan")), 4) for k in ("jitter_raw", "jitter_smoothed", "jitter_reduction")),
            round(100 * st.get("lag", {}).get("offset", float("nan")), 4), st.get("lag", {}).get("delay", float("nan")),
            round(100 * st.get("lag_along_motion", float("nan")), 4)]


@click.command("video-stats")
@click.argument("clips", nargs=-1, required=True)
@model_options
@click.option("--csv", "csv_path", default=None, help="also write the table (one row per clip) to this CSV")
@config_options
def video_stats_cmd(clips, checkpoints, csv_path, device, backend, cfg):
    """Footage without ground truth, measured: per clip, face tracks, id switches, frames with
    more faces than expected, frames/s (median and slowest second), jitter (mean second
    difference, % of the eye distance) raw vs smoothed, and the smoothing's lag."""
    vcfg = cfg.video
    for c in clips:
        open_video(c)[0].release()  # a bad clip fails before the models load
    if csv_path:
        check_output(csv_path)
    get_detector(vcfg.detector)
    landmarker = Landmarker.from_checkpoints(checkpoints, backend=backend, device=resolve_device(device),
                                             tta=cfg.predict.tta)
    table = [list(STATS_COLUMNS)]
    for c in clips:
        res = track_video(c, landmarker, vcfg, progress=False)
        st = clip_stats(res, expected_faces=vcfg.max_faces)
        log.info("%s", format_clip_stats(c, st))
        table.append(stats_row(Path(c).name, st))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(STATS_COLUMNS))]
    for row in table:
        click.echo(" ".join(f"{v!s:>{w}}" for v, w in zip(row, widths)))
    if csv_path:
        write_csv(csv_path, table)
