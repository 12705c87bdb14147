"""Pictures, all drawn with OpenCV and written as PNG (atomically):

- `pipeline show`: a contact sheet of test predictions on the original photos, and the
  worst out-of-fold faces with truth and prediction overlaid and the per-face error;
- `pipeline heatmaps`: the soft-argmax probability maps of chosen keypoints over a face;
- `pipeline filters`: the first conv layer's filters of a checkpoint.

Drawing is pipeline/keypoints/draw.py's kit; faces come from pipeline/inference/photos.py."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Sequence

import click
import cv2
import numpy as np
import torch
from torch import nn

from pipeline.core.config import config_options
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.params_schema import Config
from pipeline.core.paths import CACHE_DIR, PREDICTIONS_DIR
from pipeline.formats.cache import dataset_root, load_cache
from pipeline.formats.checkpoint import checkpoint_crop, load_model
from pipeline.formats.images import write_png
from pipeline.formats.predictions import read_predictions
from pipeline.inference.photos import PhotoReader, cache_face, face_in_photo, is_index, meta_box
from pipeline.inference.predictor import load_predictor
from pipeline.keypoints.draw import (
    PRED_COLOR,
    TRUTH_COLOR,
    contact_sheet,
    draw_box,
    draw_lines,
    draw_points,
    point_colors,
    put_label,
)
from pipeline.keypoints.geometry import box_corners, crop_face, to_crop
from pipeline.keypoints.metrics import per_face_mae
from pipeline.keypoints.preprocess import faces_to_chw, normalize_batch, resize_batch
from pipeline.keypoints.schema import schema_from_dict

log = logging.getLogger(__name__)


# iBUG 68: eye outer corners, nose tip, mouth corners (the reference recipe's interpretability figure)
DEFAULT_HEATMAP_POINTS = (36, 45, 30, 48, 54)


# --------------------------------------------------------------------------------------
# drawing helpers


TILE_EXPAND = 1.35  # a sheet's tile: the face box and some of its surroundings


def to_tile(points: np.ndarray, a: np.ndarray) -> np.ndarray:
    """(K, 2) photo pixels -> tile pixels through the tile->photo affine `a`."""
    return to_crop(np.asarray(points, dtype=np.float64)[None], np.asarray(a)[None])[0]


# --------------------------------------------------------------------------------------
# show: test predictions and worst out-of-fold faces


def predictions_sheet(cache, pred: np.ndarray, photos: PhotoReader, n: int, tile: int) -> np.ndarray:
    """Predictions of n test faces (evenly spread over the split) on their photos."""
    n = min(n, len(cache))
    idx = np.unique(np.linspace(0, len(cache) - 1, n).round().astype(int))
    colors = point_colors(cache.schema)
    radius = max(1.0, tile / 80)
    tiles = []
    for i in idx:
        row = cache.meta.iloc[i]
        t, a = crop_face(photos(row.image), meta_box(row), TILE_EXPAND, tile)
        draw_box(t, to_tile(box_corners(meta_box(row)), a))
        draw_points(t, to_tile(pred[i], a), colors, radius)
        put_label(t, f"{i}")
        tiles.append(t)
    return contact_sheet(tiles, title=f"test predictions ({len(tiles)} of {len(cache)})")


def worst_sheet(cache, pred: np.ndarray, photos: PhotoReader, n: int, tile: int) -> np.ndarray | None:
    """The n out-of-fold faces with the largest per-face MAE: truth (green) and prediction
    (red) on the photo, joined by lines, the error written on each. None: no OOF faces."""
    err = per_face_mae(pred, cache.keypoints_orig)
    ok = np.flatnonzero(np.isfinite(err))
    if not len(ok):
        return None
    worst = ok[np.argsort(-err[ok], kind="stable")[:n]]
    radius = max(1.0, tile / 96)
    tiles = []
    for i in worst:
        row = cache.meta.iloc[i]
        t, a = crop_face(photos(row.image), meta_box(row), TILE_EXPAND, tile)
        truth, p = to_tile(cache.keypoints_orig[i], a), to_tile(pred[i], a)
        draw_lines(t, truth, p, (255, 255, 0))
        draw_points(t, truth, TRUTH_COLOR, radius)
        draw_points(t, p, PRED_COLOR, radius)
        put_label(t, f"{i}: {err[i]:.1f}px")
        tiles.append(t)
    return contact_sheet(tiles, title=f"worst {len(tiles)} OOF faces (MAE): green truth, red prediction")


def run_show(cfg: Config, cache_dir: str, predictions: str, data_dir: str | None, out_dir: str, n: int,
             worst: int, tile: int) -> dict[str, Path]:
    if tile < 16:
        raise PipelineError(None, f"--tile must be >= 16 px, got {tile}")
    root = dataset_root(cfg.data, data_dir)
    out = Path(out_dir)
    written: dict[str, Path] = {}
    if n > 0:
        test = load_cache(Path(cache_dir) / "test")
        ens = read_predictions(Path(predictions) / "test.npz", ["ensemble"])["ensemble"]
        if ens.shape != (len(test), test.schema.k, 2):
            raise PipelineError(Path(predictions) / "test.npz", f"ensemble has shape {ens.shape}, the test cache "
                                                                f"needs {(len(test), test.schema.k, 2)}")
        photos = PhotoReader(root, Path(test.info.get("xml", root)))
        written["test"] = write_png(out / "test_sheet.png", predictions_sheet(test, ens, photos, n, tile))
    if worst > 0:
        train = load_cache(Path(cache_dir) / "train")
        tta = read_predictions(Path(predictions) / "oof.npz", ["tta"])["tta"]
        if train.keypoints_orig is None or tta.shape != train.keypoints_orig.shape:
            raise PipelineError(Path(predictions) / "oof.npz", f"tta has shape {tta.shape}, the train cache "
                                                               f"needs {(len(train), train.schema.k, 2)}")
        photos = PhotoReader(root, Path(train.info.get("xml", root)))
        sheet = worst_sheet(train, tta, photos, worst, tile)
        if sheet is None:
            log.warning("%s: no out-of-fold predictions (no trained fold has validation faces); "
                        "worst_oof.png not written", Path(predictions) / "oof.npz")
        else:
            written["worst"] = write_png(out / "worst_oof.png", sheet)
    for p in written.values():
        log.info("wrote %s", p)
    return written


@click.command("show")
@click.option("--cache", default=CACHE_DIR, show_default=True, help="face cache folder (from `crop`)")
@click.option("--predictions", default=PREDICTIONS_DIR, show_default=True, help="folder with test.npz and oof.npz")
@click.option("--data-dir", default=None, help="dataset folder with the photos [default: params data.dir]")
@click.option("--out", "out_dir", default="plots/show", show_default=True)
@click.option("--n", "n", default=16, show_default=True, help="test faces on the sheet (0: no test sheet)")
@click.option("--worst", default=16, show_default=True, help="worst OOF faces (0: no worst sheet)")
@click.option("--tile", default=96, show_default=True, help="tile side in pixels")
@config_options
def show_cmd(cache, predictions, data_dir, out_dir, n, worst, tile, cfg):
    """Contact sheets: test predictions on the photos, and the worst out-of-fold faces."""
    check_output(out_dir, folder=True)
    for p in run_show(cfg, cache, predictions, data_dir, out_dir, n, worst, tile).values():
        click.echo(str(p))


# --------------------------------------------------------------------------------------
# heatmaps


def parse_points(text: str | None, schema) -> list[int]:
    if text is None:
        if schema.k == 68:
            return list(DEFAULT_HEATMAP_POINTS)
        return list(range(min(schema.k, 5)))
    try:
        pts = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise PipelineError(None, f"--points must be comma-separated integers, got '{text}'") from None
    bad = [p for p in pts if not 0 <= p < schema.k]
    if not pts or bad:
        raise PipelineError(None, f"--points must be indices 0..{schema.k - 1}, got '{text}'")
    return pts


def face_from_source(source: str, ckpt: dict, cache_dir: str, split: str = "test"):
    """The network's view of a face: (crop RGB uint8 (S, S, 3), description). `source` is an
    integer index into the cache split (its cached crop), or a photo path (the largest
    detected face, cropped with the checkpoint's stamped crop geometry)."""
    if is_index(source):
        cache, i = cache_face(cache_dir, split, int(source))
        return np.array(cache.faces[i]), f"{split} face {i} ({cache.meta.iloc[i].face_id})"
    image, box = face_in_photo(source)
    size, expand = checkpoint_crop(ckpt)
    return crop_face(image, box, expand, size)[0], f"{Path(source).name}"


def probability_maps(model, face: np.ndarray, in_chans: int, input_size: int):
    """(coords (K, 2) input px, probs (K, H, W), network-input face RGB (H, W, 3))."""

    x = faces_to_chw(face[None], in_chans)
    with torch.no_grad():
        coords, probs = model.forward_maps(resize_batch(normalize_batch(x), input_size))
    view = cv2.resize(face, (input_size, input_size), interpolation=cv2.INTER_AREA
                      if face.shape[0] > input_size else cv2.INTER_LINEAR)
    return coords[0].float().numpy(), probs[0].float().numpy(), view


def overlay_map(face: np.ndarray, prob: np.ndarray, tile: int, alpha: float = 0.65) -> np.ndarray:
    """A probability map (H, W) as a colormap over the (grayed) face, both resized to tile."""
    base = cv2.resize(face, (tile, tile), interpolation=cv2.INTER_LINEAR)
    gray = cv2.cvtColor(cv2.cvtColor(base, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB).astype(np.float32) * 0.8
    p: np.ndarray = cv2.resize(prob.astype(np.float32), (tile, tile), interpolation=cv2.INTER_LINEAR)
    p = p / max(float(p.max()), 1e-12)
    heat = cv2.cvtColor(cv2.applyColorMap((p * 255).astype(np.uint8), cv2.COLORMAP_JET), cv2.COLOR_BGR2RGB)
    a = (alpha * np.sqrt(np.clip(p, 0, 1)))[..., None]
    return (gray * (1 - a) + heat.astype(np.float32) * a).round().clip(0, 255).astype(np.uint8)


def heatmap_figure(model, ckpt: dict, face: np.ndarray, points: Sequence[int], tile: int,
                   alpha: float = 0.65) -> np.ndarray:
    """One row: the face with the chosen points, then one map panel per point."""
    if not hasattr(model, "forward_maps"):
        raise PipelineError(None, f"model '{ckpt['model_config'].get('preset')}' regresses coordinates "
                                  "directly and has no heatmaps (forward_maps); use a heatmap model (resunet-*)")
    model_config = ckpt["model_config"]
    schema = schema_from_dict(ckpt["schema"])
    coords, probs, view = probability_maps(model, face, model_config["in_chans"], model_config["input_size"])
    s = tile / model_config["input_size"]
    pts_tile = (coords + 0.5) * s - 0.5  # input px -> tile px (pixel centres at integers)
    colors = point_colors(schema)
    face_panel = cv2.resize(view, (tile, tile), interpolation=cv2.INTER_LINEAR)
    draw_points(face_panel, pts_tile[list(points)], [colors[p] for p in points], max(1.5, tile / 64))
    put_label(face_panel, "face")
    panels = [face_panel]
    for p in points:
        panel = overlay_map(view, probs[p], tile, alpha)
        x, y = pts_tile[p]
        cv2.drawMarker(panel, (int(round(x)), int(round(y))), (255, 255, 255), cv2.MARKER_CROSS,
                       max(5, tile // 16), 1, cv2.LINE_AA)
        put_label(panel, f"{p} {schema.names[p]}")
        panels.append(panel)
    return contact_sheet(panels, cols=len(panels))


def run_heatmaps(source: str, checkpoint: str, cache: str, split: str, points: str | None, tile: int,
                 alpha: float, out: str) -> Path:
    """The heatmap figure of a face (cache index or photo) for a heatmap model -> PNG."""
    if tile < 16:
        raise PipelineError(None, f"--tile must be >= 16 px, got {tile}")
    model, ckpt = load_predictor(checkpoint, None, "cpu")  # one face: the CPU is enough
    if not hasattr(model, "forward_maps"):
        raise PipelineError(checkpoint, f"model '{ckpt['model_config'].get('preset')}' regresses coordinates "
                                        "directly and has no heatmaps (forward_maps); use a heatmap model "
                                        "(resunet-*)")
    pts = parse_points(points, schema_from_dict(ckpt["schema"]))
    face, what = face_from_source(source, ckpt, cache, split)
    path = write_png(out, heatmap_figure(model, ckpt, face, pts, tile, alpha))
    log.info("heatmaps of %s, points %s -> %s", what, pts, path)
    return path


@click.command("heatmaps")
@click.argument("image_or_index")
@click.option("--checkpoint", required=True, help="heatmap model checkpoint (e.g. models/fold0/best.pt) or exported .onnx")
@click.option("--cache", default=CACHE_DIR, show_default=True, help="face cache, for an integer IMAGE_OR_INDEX")
@click.option("--split", type=click.Choice(["test", "train"]), default="test", show_default=True)
@click.option("--points", default=None, help="keypoint indices [default: 36,45,30,48,54 (eye corners, "
                                             "nose tip, mouth corners) for iBUG 68]")
@click.option("--tile", default=128, show_default=True, help="panel side in pixels")
@click.option("--alpha", default=0.65, show_default=True, help="heatmap opacity at its peak")
@click.option("--out", default="heatmaps.png", show_default=True)
def heatmaps_cmd(image_or_index, checkpoint, cache, split, points, tile, alpha, out):
    """Soft-argmax probability maps of chosen keypoints over a face (cache index or photo)."""
    check_output(out)
    click.echo(str(run_heatmaps(image_or_index, checkpoint, cache, split, points, tile, alpha, out)))


# --------------------------------------------------------------------------------------
# filters


def first_conv(model):
    """(qualified name, nn.Conv2d) of the first 2-D convolution in module order."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            return name, m
    raise PipelineError(None, "the model has no Conv2d layer")


def filter_grid(weight: np.ndarray, tile: int = 32, cols: int | None = None) -> np.ndarray:
    """(O, C, kh, kw) filters -> RGB grid: each filter min-max normalised to 0..255 on its
    own, shown in colour for 3 input channels (RGB order) and gray otherwise (channel mean),
    upscaled with nearest-neighbour to a tile of about `tile` px."""
    w = np.asarray(weight, dtype=np.float64)
    o, c, kh, kw = w.shape
    scale = max(1, tile // max(kh, kw))
    tiles = []
    for f in w:
        img = f.transpose(1, 2, 0) if c == 3 else np.repeat(f.mean(0)[..., None], 3, axis=2)  # (kh, kw, 3)
        lo, hi = img.min(), img.max()
        img = (img - lo) / (hi - lo) * 255 if hi > lo else np.full_like(img, 128)
        img = img.round().astype(np.uint8)
        tiles.append(cv2.resize(img, (kw * scale, kh * scale), interpolation=cv2.INTER_NEAREST))
    return contact_sheet(tiles, cols=cols or math.ceil(math.sqrt(o)))


def run_filters(checkpoint: str, out: str, tile: int, cols: int) -> Path:
    """The first conv layer's filters of a checkpoint as an image grid -> PNG."""
    model, ckpt = load_model(checkpoint, "cpu")
    name, conv = first_conv(model)
    weight = conv.weight.detach().float().cpu().numpy()
    path = write_png(out, filter_grid(weight, max(1, tile), cols or None))
    log.info("%s: %d filters %dx%d over %d channel(s) -> %s", name, *weight.shape[:1], *weight.shape[2:],
             weight.shape[1], path)
    return path


@click.command("filters")
@click.option("--checkpoint", required=True, help="model checkpoint")
@click.option("--out", default="filters.png", show_default=True)
@click.option("--tile", default=32, show_default=True, help="about this many pixels per filter")
@click.option("--cols", default=0, show_default=True, help="filters per row (0: square grid)")
def filters_cmd(checkpoint, out, tile, cols):
    """The first conv layer's filters of a checkpoint, as an image grid."""
    check_output(out)
    click.echo(str(run_filters(checkpoint, out, tile, cols)))
