"""`pipeline calibrate-presence`: the face-presence threshold of each checkpoint
(pipeline/inference/presence.py), chosen on faces its model never trained on, and written
into the checkpoint (`presence`: threshold, radius and what was measured), where every
backend reads it (`pipeline export` copies it into the ONNX model's JSON).

Faces: the held-out fold of the checkpoint (its `fold`, or --fold) in the face cache and
folds file it was trained with, cropped again from their photos. Non-faces: crops of the
same photos (pipeline/inference/presence.py `non_face_boxes`): the face's box moved by 0.6
of its side in four directions, a part of the face, the face small in a wide box, and
background patches away from every labelled face. The threshold maximises faces kept plus
non-faces dropped (Youden's J), the middle of the tied range."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import click
import numpy as np

from pipeline.core.config import Config, config_options
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.paths import CACHE_DIR, FOLDS_FILE
from pipeline.formats.annotations import read_image, safe_image_path
from pipeline.formats.cache import META_COLUMNS, dataset_root, read_meta
from pipeline.formats.checkpoint import PRESENCE_RADIUS, presence_stamp, save_checkpoint
from pipeline.formats.folds import read_folds
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.predictor import load_predictor
from pipeline.inference.presence import choose_threshold, non_face_boxes, roc_auc
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
                         root: Path, fold: int | None = None, seed: int = 0,
                         device: str = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """The presence calibration of one checkpoint: its stamp (`presence_stamp`: threshold,
    radius, auc, faces, non_faces, ...) and the scores by kind of crop; and the checkpoint as
    loaded (the torch backend's meta is the checkpoint dict), for the stamp to go into."""
    dev = resolve_device(device)
    model, ckpt = load_predictor(path, "torch", dev)
    if fold is None:
        if not isinstance(ckpt.get("fold"), int):
            raise PipelineError(path, "the checkpoint names no fold: give --fold (its held-out fold)")
        fold = int(ckpt["fold"])
    items, skipped = held_out_boxes(cache_dir, folds_path, fold, root, seed)
    # the score at the default radius, whatever the checkpoint held before (a bad stamp too)
    landmarker = Landmarker([(model, {**ckpt, "presence": presence_stamp(0.0, PRESENCE_RADIUS)})], tta="flip",
                            device=dev, paths=[path])

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

    if not hasattr(model, "forward_maps"):
        raise PipelineError(path, "this model has no heatmaps: the presence score reads them")
    _, scores = landmarker.predict_faces_scored(crop)
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
    stamp = presence_stamp(chosen["threshold"], PRESENCE_RADIUS, auc=chosen["auc"], faces=int(len(pos)),
                           non_faces=int(len(neg)), faces_kept=chosen["faces_kept"],
                           non_faces_dropped=chosen["non_faces_dropped"], fold=fold, tta="flip", seed=seed)
    return {"checkpoint": str(path), "stamp": stamp, "by_kind": by_kind, "skipped": skipped}, ckpt


def run_calibrate_presence(cfg: Config, checkpoints: Sequence[str], cache_dir: str | os.PathLike = CACHE_DIR,
                           folds_path: str | os.PathLike = FOLDS_FILE, fold: int | None = None,
                           out: str | None = None, seed: int = 0, device: str = "cpu") -> list[dict]:
    """Calibrate every checkpoint on its held-out fold and write the result into it (or, for
    one checkpoint, into a copy at `out`); the photos are data.dir's."""
    if out is not None and len(checkpoints) != 1:
        raise PipelineError(out, "--out writes one checkpoint: give one")
    if out is not None:
        check_output(out)
    root = dataset_root(cfg.data)
    results = []
    for path in checkpoints:
        res, ckpt = calibrate_checkpoint(path, cache_dir, folds_path, root, fold, seed, device)
        if res["skipped"]:
            log.warning("%s: %d held-out faces skipped (photo not under %s)", path, res["skipped"], root)
        save_checkpoint(out or path, {**ckpt, "presence": res["stamp"]})
        s = res["stamp"]
        log.info("%s: fold %d, %d faces vs %d non-faces: ROC AUC %.4f, threshold %.3f (faces kept %.1f%%, "
                 "non-faces dropped %.1f%%) -> %s", path, s["fold"], s["faces"], s["non_faces"], s["auc"],
                 s["threshold"], 100 * s["faces_kept"], 100 * s["non_faces_dropped"], out or path)
        results.append(res)
    return results


@click.command("calibrate-presence")
@click.argument("checkpoints", nargs=-1, required=True)
@click.option("--cache", "cache_dir", default=CACHE_DIR, show_default=True, help="the face cache it was trained on")
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@click.option("--fold", default=None, type=click.IntRange(min=0),
              help="the held-out fold [the checkpoint's own]")
@click.option("--out", default=None, help="write a calibrated copy here instead (one checkpoint)")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="for the non-face boxes")
@click.option("--device", default="cpu", show_default=True)
@config_options
def calibrate_presence_cmd(checkpoints, cache_dir, folds_path, fold, out, seed, device, cfg):
    """The face-presence threshold of each CHECKPOINT: its held-out faces against non-face
    crops of the same photos (shifted and scaled boxes, parts of faces, background),
    written into the checkpoint (every backend and `pipeline export` read it there)."""
    for r in run_calibrate_presence(cfg, checkpoints, cache_dir, folds_path, fold, out, seed, device):
        s = r["stamp"]
        kinds = ", ".join(f"{k} {v['n']} (median {v['median']:.3f})" for k, v in r["by_kind"].items())
        click.echo(f"{r['checkpoint']}: ROC AUC {s['auc']:.4f}, threshold {s['threshold']:.3f}; faces kept "
                   f"{100 * s['faces_kept']:.1f}%, non-faces dropped {100 * s['non_faces_dropped']:.1f}%; {kinds}")
