"""The `presence` stage: a fold's face-presence calibration (pipeline/inference/presence.py)
on faces its model never trained on, written beside its checkpoint as
models/foldK/presence.json (`checkpoint.write_presence_file`: the checkpoint, a train
output, stays as trained), where every backend and `pipeline export` read it.

Faces: the held-out fold of the checkpoint in the face cache and folds file it was trained
with, cropped again from their photos. Non-faces: crops of the same photos
(`presence.non_face_boxes`): the face's box moved by 0.6 of its side in four directions, a
part of the face, the face small in a wide box, and background patches away from every
labelled face. The threshold that starts a track (and makes a face) maximises faces kept
plus non-faces dropped (Youden's J), the middle of the tied range; the lower one that keeps
a track still drops presence.keep_drop of the non-faces. Where faces and non-faces do not
separate (ROC AUC under presence.min_auc) there is no threshold: the file says so and why,
and the model gates nothing. `pipeline calibrate-presence` (pipeline/tools) runs the same
calibration on any checkpoints."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import click
import numpy as np

from pipeline.core.config import config_options
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.params_schema import Config, PresenceParams
from pipeline.core.paths import CACHE_DIR, FOLDS_FILE, MODELS_DIR
from pipeline.formats.annotations import read_image, safe_image_path
from pipeline.formats.cache import META_COLUMNS, dataset_root, read_meta
from pipeline.formats.checkpoint import (
    PRESENCE_RADIUS,
    load_model,
    presence_file,
    presence_stamp,
    write_presence_file,
)
from pipeline.formats.folds import read_folds
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.predictor import prepare_torch
from pipeline.inference.presence import choose_threshold, keep_threshold, non_face_boxes, roc_auc
from pipeline.keypoints.geometry import crop_face

log = logging.getLogger(__name__)


def held_out_boxes(cache_dir: str | os.PathLike, folds_path: str | os.PathLike, fold: int, root: Path,
                   seed: int = 0) -> tuple[list[tuple[Path, np.ndarray, str]], int]:
    """[(photo, box, kind)] of fold `fold`'s faces ("face") and the non-face boxes made around
    each, photo by photo; and how many held-out faces were skipped because their photo is
    not under `root` (a cache that also holds faces of other folders)."""
    split = Path(cache_dir) / "train"
    meta = read_meta(split, META_COLUMNS)
    folds = read_folds(Path(folds_path), meta, split)
    held = np.flatnonzero(folds == fold)
    if not len(held):
        raise PipelineError(folds_path, f"no face in fold {fold}")
    rng = np.random.default_rng(seed)
    boxes = meta[["box_left", "box_top", "box_width", "box_height"]].to_numpy(np.float64)
    sizes = meta[["image_width", "image_height"]].to_numpy(np.int64)
    by_photo: dict[str, list[int]] = {}
    for i, image in enumerate(meta["image"]):
        by_photo.setdefault(image, []).append(i)
    out: list[tuple[Path, np.ndarray, str]] = []
    skipped = 0
    for i in map(int, held):
        image = meta["image"].iloc[i]
        photo = safe_image_path(root, image, split / "meta.csv")
        if not photo.is_file():
            skipped += 1
            continue
        out.append((photo, boxes[i], "face"))
        width, height = (int(v) for v in sizes[i])
        out += [(photo, b, kind) for kind, b in non_face_boxes(boxes[i], boxes[by_photo[image]], width, height, rng)]
    if not out:
        raise PipelineError(root, f"none of fold {fold}'s {len(held)} photos is here (set data.dir to the photos "
                                  "the cache was cropped from)")
    return out, skipped


def calibrate_checkpoint(path: str | os.PathLike, cache_dir: str | os.PathLike, folds_path: str | os.PathLike,
                         root: Path, pcfg: PresenceParams, fold: int | None = None,
                         device: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The presence calibration of one checkpoint on its held-out fold (its `fold`, or
    `fold`): {"checkpoint", "stamp" (`presence_stamp`: threshold and keep, None where faces
    and non-faces do not separate, radius, tta, auc, faces, non_faces, ...), "by_kind" (the
    scores by kind of crop), "skipped"}; and the checkpoint as loaded."""
    dev = resolve_device(device or pcfg.device)
    model, ckpt = load_model(path, dev)  # not load_predictor: the presence file it replaces is not read
    model = prepare_torch(model)
    own = ckpt.get("fold")
    if fold is None:
        if not isinstance(own, int):
            raise PipelineError(path, "the checkpoint names no fold: give --fold (its held-out fold)")
        fold = own
    elif isinstance(own, int) and own != fold:
        raise PipelineError(path, f"trained with fold {own} held out, not fold {fold}")
    if not hasattr(model, "forward_maps"):
        raise PipelineError(path, "this model has no heatmaps: the presence score reads them")
    items, skipped = held_out_boxes(cache_dir, folds_path, fold, root, pcfg.seed)
    # the score at the default radius on pcfg.tta's views, whatever the checkpoint held before
    landmarker = Landmarker([(model, {**ckpt, "presence": None})], tta=pcfg.tta, device=dev, paths=[path])

    def crop(size: int, expand: float) -> tuple[np.ndarray, np.ndarray]:
        crops, a = [], []
        images: dict[Path, np.ndarray] = {}
        for photo, box, _ in items:  # items come photo by photo: keep the current one
            if photo not in images:
                images = {photo: read_image(photo)}
            face, m = crop_face(images[photo], box, expand, size)
            crops.append(face)
            a.append(m)
        return np.stack(crops), np.stack(a)

    _, scores = landmarker.predict_faces(crop, scores=True)
    kinds = np.array([k for _, _, k in items])
    pos, neg = scores[kinds == "face"], scores[kinds != "face"]
    chosen = choose_threshold(pos, neg)
    by_kind = {}
    for k in dict.fromkeys(kinds):
        v = scores[kinds == k]
        # a face: how low faces go; a non-face: how well it separates from faces, how high it goes
        spread = ({"min": float(v.min()), "q01": float(np.quantile(v, 0.01))} if k == "face" else
                  {"auc": roc_auc(pos, v), "q99": float(np.quantile(v, 0.99)), "max": float(v.max())})
        by_kind[str(k)] = {"n": int(len(v)), "median": float(np.median(v)), **spread}
    measured = dict(auc=chosen["auc"], faces=int(len(pos)), non_faces=int(len(neg)), faces_kept=chosen["faces_kept"],
                    non_faces_dropped=chosen["non_faces_dropped"], fold=fold, seed=pcfg.seed, min_auc=pcfg.min_auc,
                    keep_drop=pcfg.keep_drop)
    if chosen["auc"] >= pcfg.min_auc:
        t = chosen["threshold"]
        stamp = presence_stamp(t, PRESENCE_RADIUS, keep=keep_threshold(neg, t, pcfg.keep_drop), tta=pcfg.tta,
                               **measured)
    else:
        stamp = presence_stamp(None, PRESENCE_RADIUS, tta=pcfg.tta, **measured,
                               why=f"faces and non-faces do not separate (ROC AUC {chosen['auc']:.3f} < "
                                   f"presence.min_auc {pcfg.min_auc:g}, fold {fold}: {len(pos)} faces, "
                                   f"{len(neg)} non-faces)")
    return {"checkpoint": str(path), "stamp": stamp, "by_kind": by_kind, "skipped": skipped}, ckpt


def describe(result: dict[str, Any]) -> str:
    """One line of a calibration: what was measured and the thresholds chosen."""
    s = result["stamp"]
    head = f"{result['checkpoint']}: fold {s['fold']}, {s['faces']} faces vs {s['non_faces']} non-faces"
    if s["threshold"] is None:
        return f"{head}: {s['why']}: no threshold, no face gate"
    return (f"{head}: ROC AUC {s['auc']:.4f}, threshold {s['threshold']:.3f} (keep {s['keep']:.3f}; faces kept "
            f"{100 * s['faces_kept']:.1f}%, non-faces dropped {100 * s['non_faces_dropped']:.1f}%)")


def run_presence(cfg: Config, fold: int, models_dir: str | os.PathLike = MODELS_DIR,
                 cache_dir: str | os.PathLike = CACHE_DIR, folds_path: str | os.PathLike = FOLDS_FILE) -> Path:
    """The `presence` stage: fold `fold`'s checkpoint (models_dir/fold{K}/predict.checkpoint)
    calibrated on its held-out faces (the photos of data.dir) -> its presence file."""
    path = Path(models_dir) / f"fold{fold}" / cfg.predict.checkpoint
    check_output(presence_file(path))
    res, ckpt = calibrate_checkpoint(path, cache_dir, folds_path, dataset_root(cfg.data), cfg.presence, fold)
    if res["skipped"]:
        log.warning("%s: %d held-out faces skipped (photo not under %s)", path, res["skipped"], dataset_root(cfg.data))
    out = write_presence_file(path, ckpt, res["stamp"], by_kind=res["by_kind"], skipped=res["skipped"])
    (log.info if res["stamp"]["threshold"] is not None else log.warning)("%s -> %s", describe(res), out)
    return out


@click.command("presence")
@click.option("--fold", required=True, type=click.IntRange(min=0), help="the fold whose checkpoint to calibrate")
@click.option("--models", "models_dir", default=MODELS_DIR, show_default=True, help="folder of fold{K}/ checkpoints")
@click.option("--cache", "cache_dir", default=CACHE_DIR, show_default=True, help="the face cache it was trained on")
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@config_options
def presence_cmd(fold, models_dir, cache_dir, folds_path, cfg):
    """Fold FOLD's face-presence thresholds on its held-out faces -> models/foldK/presence.json."""
    run_presence(cfg, fold, models_dir, cache_dir, folds_path)
