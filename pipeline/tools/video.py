"""Faces in motion: `pipeline predict-video` (keypoints on every frame of a video, with face
tracking, pipeline/inference/tracking.py, and One Euro smoothing, pipeline/keypoints/smoothing.py),
`pipeline make-test-video` (the test video with exact truth of pipeline/synth/moving_face.py),
and the measurements behind the smoothing defaults (`score_video`, `tune_one_euro`, used by
`pipeline bench`'s video section). Video files are read and written by pipeline/formats/video.py."""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import click
import cv2
import numpy as np
from tqdm import tqdm

from pipeline.core.config import Config, VideoParams, config_options
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.detection.detectors import get_detector
from pipeline.formats.images import write_png
from pipeline.formats.video import AtomicVideoWriter, frames_of, open_video
from pipeline.formats.video_csv import read_video_csv, write_video_csv
from pipeline.inference.predictor import load_models
from pipeline.inference.tracking import FaceTracker, box_constants
from pipeline.inference.tta import predict_boxes
from pipeline.keypoints.draw import contact_sheet, draw_faces, put_label
from pipeline.keypoints.schema import schema_from_dict
from pipeline.keypoints.smoothing import OneEuroFilter
from pipeline.synth.moving_face import TEST_PHOTO, make_test_video
from pipeline.tools.viz import face_tile

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ tracking a video

def draw_frame(frame: np.ndarray, tracks: list[tuple[int, np.ndarray, np.ndarray]], schema) -> np.ndarray:
    """The frame with each face's box, keypoints (coloured by part) and id."""
    return draw_faces(frame, tracks, schema)


def _face_tile(image: np.ndarray, box: np.ndarray | None, side: int = 144) -> np.ndarray:
    """A side x side tile: the square around the box (1.6x its longer side), else the frame."""
    if box is None:
        return cv2.resize(image, (side, side), interpolation=cv2.INTER_AREA)
    return face_tile(image, box, side, expand=1.6)[0]


def track_video(src: str | os.PathLike, models: Sequence[tuple], vcfg: VideoParams, *, tta: str = "flip", device=None,
                out_mp4: str | os.PathLike | None = None, smooth: bool = True, progress: bool = True,
                detect=None, keep: Sequence[int] = ()) -> dict[str, Any]:
    """Keypoints of every face on every frame of `src` (tracked, see pipeline/inference/tracking.py),
    optionally drawn into `out_mp4`. Returns rows (frame, time, face, raw points, smoothed
    points, box side) as arrays, the video's fps and frame count, closed tracks, the number
    of detector runs and the seconds spent end to end (decode, detect, predict, draw, encode).
    The frames numbered in `keep` come back drawn both ways: {"kept": {i: (raw, smoothed)}}."""
    schema = schema_from_dict(models[0][1]["schema"])
    if detect is None:
        found = get_detector(vcfg.detector)

        def detect(image):
            return found(image, 0)[0]

    def predict(image, boxes):
        return predict_boxes(image, boxes, models, tta, device)

    smoother = (lambda: OneEuroFilter(vcfg.min_cutoff, vcfg.beta, vcfg.d_cutoff))
    tracker = FaceTracker(detect, predict, box_from_points=box_constants(vcfg), detect_every=vcfg.detect_every,
                          match_iou=vcfg.match_iou, min_visible=vcfg.min_visible,
                          max_missed=vcfg.max_missed, max_faces=vcfg.max_faces, smoother=smoother)
    cap, fps, declared = open_video(src)
    rows: dict[str, list] = {"frame": [], "time": [], "face": [], "raw": [], "smoothed": [], "side": [], "box": []}
    writer = AtomicVideoWriter(out_mp4, fps) if out_mp4 is not None else None
    kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    keep = set(keep)
    t0 = time.perf_counter()
    n = 0
    try:
        frames = frames_of(cap)
        if progress:
            frames = tqdm(frames, total=declared or None, desc="predict-video", unit="frame")
        for i, frame in enumerate(frames):
            t = i / fps
            active = tracker.step(i, t, frame)
            for tr in active:
                rows["frame"].append(i)
                rows["time"].append(t)
                rows["face"].append(tr.id)
                rows["raw"].append(tr.points)
                rows["smoothed"].append(tr.smoothed)
                rows["side"].append(float(max(tr.box[2], tr.box[3])))
                rows["box"].append(tr.box.copy())
            if writer is not None:
                shown = [(tr.id, tr.box, tr.smoothed if smooth else tr.points) for tr in active]
                writer.write(draw_frame(frame, shown, schema))
            if i in keep:
                kept[i] = tuple(_face_tile(draw_frame(frame, [(tr.id, tr.box, getattr(tr, a)) for tr in active],
                                                      schema), active[0].box if active else None)
                                for a in ("points", "smoothed"))
            n = i + 1
        if n == 0:
            raise PipelineError(src, "no frame could be decoded")
        tracker.close_all()
        if writer is not None:
            writer.publish()
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    finally:
        cap.release()
    spent = time.perf_counter() - t0
    k = schema.k
    out = {"fps": fps, "frames": n, "seconds": spent, "detections": tracker.detections, "kept": kept,
           "tracks": [{"id": t.id, "first_frame": t.first_frame, "last_frame": t.last_frame, "end": t.end}
                      for t in sorted(tracker.closed, key=lambda t: t.id)]}
    out["frame"] = np.asarray(rows["frame"], dtype=np.int64)
    out["time"] = np.asarray(rows["time"], dtype=np.float64)
    out["face"] = np.asarray(rows["face"], dtype=np.int64)
    out["raw"] = np.asarray(rows["raw"], dtype=np.float64).reshape(-1, k, 2)
    out["smoothed"] = np.asarray(rows["smoothed"], dtype=np.float64).reshape(-1, k, 2)
    out["side"] = np.asarray(rows["side"], dtype=np.float64)
    out["box"] = np.asarray(rows["box"], dtype=np.float64).reshape(-1, 4)
    return out


def run_predict_video(cfg: Config, src: str, checkpoints: Sequence[str], out: str | None = None,
                      csv_path: str | None = None, smooth: str | None = None, device_name: str = "auto",
                      backend: str = "torch", tta: str | None = None, strip: str | None = None,
                      strip_frames: int = 4) -> dict[str, Any]:
    """`pipeline predict-video`: the annotated mp4, the CSV with `csv_path`, and with `strip`
    a PNG of strip_frames evenly spaced frames, raw predictions above, smoothed below."""
    vcfg = cfg.video if smooth is None else cfg.video.model_copy(update={"smooth": smooth})
    src_path = Path(src)
    cap, _, declared = open_video(src_path)  # a bad input fails before the models load
    cap.release()
    out_path = Path(out) if out else Path("out") / f"{src_path.stem}_keypoints.mp4"
    if out_path.suffix.lower() != ".mp4":
        raise PipelineError(out_path, "--out must end in .mp4")
    for p in (out_path, csv_path, strip):
        if p is not None and Path(p).resolve() == src_path.resolve():
            raise PipelineError(p, "would overwrite the input video")
        if p is not None:
            check_output(p)
    get_detector(vcfg.detector)  # a missing detector fails before the models load
    device = resolve_device(device_name)
    models = load_models(checkpoints, device, backend)
    keep = sorted({int(round(v)) for v in np.linspace(0, max(declared - 1, 0), strip_frames)}) if strip else []
    res = track_video(src_path, models, vcfg, tta=tta or cfg.predict.tta, device=device, out_mp4=out_path,
                      smooth=vcfg.smooth == "on", keep=keep)
    pts = res["smoothed"] if vcfg.smooth == "on" else res["raw"]
    if csv_path:
        write_video_csv(csv_path, res["frame"], res["time"], res["face"], pts)
    if strip and res["kept"]:
        frames = sorted(res["kept"])
        tiles = [put_label(res["kept"][i][row].copy(), f"frame {i} {name}")
                 for row, name in ((0, "raw"), (1, "smoothed")) for i in frames]
        write_png(strip, contact_sheet(tiles, cols=len(frames), title=f"{src_path.name}: raw (top) vs smoothed "
                                       f"(One Euro, min_cutoff {vcfg.min_cutoff:g}, beta {vcfg.beta:g})"))
    res.update(out=str(out_path), csv=str(csv_path) if csv_path else None, smooth=vcfg.smooth)
    log.info("%s: %d frames, %d track(s), detector on %d frame(s), %.1f frames/s end to end -> %s",
             src, res["frames"], len(res["tracks"]), res["detections"], res["frames"] / max(res["seconds"], 1e-9),
             out_path)
    return res


# ------------------------------------------------------------------------------ measuring

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


def measure_smoothing(models: Sequence[tuple], vcfg: VideoParams, workdir: str | os.PathLike, n_frames: int = 60,
                      tta: str = "flip", device=None, detect=None) -> dict[str, Any]:
    """Jitter and NME, raw vs smoothed (the params' One Euro), on a still and a moving test
    video made in `workdir`, and frames/s end to end on the moving one (annotated mp4 written)."""
    out: dict[str, Any] = {"frames": n_frames}
    for kind in ("still", "moving"):
        mp4, truth_csv = make_test_video(Path(workdir) / f"{kind}.mp4", n_frames, moving=kind == "moving")
        truth = read_video_csv(truth_csv)
        res = track_video(mp4, models, vcfg, tta=tta, device=device, progress=False, detect=detect,
                          out_mp4=Path(workdir) / f"{kind}_keypoints.mp4")
        out[kind] = {"raw": score_video(_as_pred(res, res["raw"]), truth),
                     "smoothed": score_video(_as_pred(res, res["smoothed"]), truth),
                     "tracks": len(res["tracks"]), "detections": res["detections"],
                     "frames_per_s": res["frames"] / max(res["seconds"], 1e-9)}
    out["frames_per_s"] = out["moving"]["frames_per_s"]
    out["one_euro"] = {k: getattr(vcfg, k) for k in ("min_cutoff", "beta", "d_cutoff")}
    return out


# ------------------------------------------------------------------------------ commands

@click.command("predict-video")
@click.argument("src", metavar="IN")
@click.option("--checkpoint", "checkpoints", multiple=True, required=True,
              help="model checkpoint or exported .onnx (repeatable: predictions are averaged)")
@click.option("--out", default=None, help="annotated video (.mp4) [out/<IN stem>_keypoints.mp4]")
@click.option("--csv", "csv_path", default=None, help="also write one row per frame and face to this CSV")
@click.option("--smooth", type=click.Choice(["on", "off"]), default=None,
              help="One Euro smoothing; off: raw predictions [params video.smooth]")
@click.option("--tta", type=click.Choice(["flip", "none"]), default=None, help="[params predict.tta]")
@click.option("--strip", default=None, help="also write a PNG of 4 frames (around the first face), raw above smoothed")
@click.option("--device", default="auto", show_default=True)
@click.option("--backend", type=click.Choice(["torch", "onnx"]), default="torch", show_default=True)
@config_options
def predict_video_cmd(src, checkpoints, out, csv_path, smooth, tta, strip, device, backend, cfg):
    """Keypoints on every frame of a video: faces detected every video.detect_every frames
    and tracked in between, smoothed over time, drawn into an mp4."""
    res = run_predict_video(cfg, src, checkpoints, out, csv_path, smooth, device, backend, tta, strip)
    click.echo(f"{src}: {res['frames']} frames, {len(res['tracks'])} face track(s) -> {res['out']}"
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

