"""Predict: flip TTA, fold ensemble, out-of-fold predictions, all mapped back to
original-image pixels through each face's stored crop transform."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import click
import numpy as np
import torch
import torch.nn.functional as F

from pipeline.cli import config_options
from pipeline.config import params_source
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


_RESIZE: dict[tuple, torch.Tensor] = {}


def _resize_rows(src: int, dst: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(dst, src) matrix R of the 1-D antialiased bilinear resize src -> dst: the filter is
    separable, so resizing an image X is R @ X @ R.T. Built once per size from
    F.interpolate itself (each row of the identity resized), so it is that filter."""
    key = (src, dst, device, dtype)
    if key not in _RESIZE:
        # src one-row images, each an impulse; resized along W (a height-1 image resized
        # along H comes out wrong in torch 2.14's antialias kernel, along W it is exact)
        eye = torch.eye(src, dtype=torch.float64).view(src, 1, 1, src)
        rows = F.interpolate(eye, size=(1, dst), mode="bilinear", align_corners=False, antialias=True)
        _RESIZE[key] = rows.view(src, dst).T.contiguous().to(device=device, dtype=dtype)
    return _RESIZE[key]


def _resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """Float (B, C, S, S) -> (B, C, size, size). Bilinear with align_corners=False maps
    pixel centres as x' = (x + 0.5) * size / S - 0.5, the convention of input_to_crop;
    antialiased as F.interpolate(antialias=True), as two small matmuls (R @ X @ R.T):
    at batch 1 that is a third of the cost of the interpolate kernel."""
    if images.shape[-1] == size:
        return images
    r = _resize_rows(images.shape[-1], size, images.device, images.dtype)  # (size, S)
    return torch.matmul(torch.matmul(r, images), r.T)  # (B, C, size, S) -> (B, C, size, size)


@torch.inference_mode()
def predict_crops(model, faces: np.ndarray, *, input_size: int, in_chans: int,
                  flip_perm: Sequence[int] | None, batch_size: int = 64,
                  device: torch.device = torch.device("cpu"), amp: torch.dtype | None = None,
                  channels_last: bool = False, progress: bool = False) -> dict[str, np.ndarray]:
    """Keypoints in crop pixels for uint8 faces (N, S, S, 3). `model` is a torch model or
    any callable of the same contract (pipeline.backend: onnxruntime).

    Returns {"plain": (N, K, 2)} and, when flip_perm is given, also {"flip": ..., "tta": ...}:
    the prediction on the mirrored face, un-mirrored (x -> W-1-x, left/right indices swapped
    back), and the mean of the two. The faces and their mirrors go through the model as one
    batch of 2B: one call instead of two, which at batch 1 (one face at a time) is most of
    the TTA cost saved."""
    from pipeline.augment import input_to_crop
    from pipeline.data import faces_to_chw, normalize_batch
    from pipeline.device import autocast
    from pipeline.flip import flip_images, unflip_coords

    model.eval()
    cache_size = faces.shape[1]
    outs: dict[str, list[np.ndarray]] = {"plain": []}
    if flip_perm is not None:
        outs["flip"] = []
    starts = range(0, len(faces), batch_size)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="predict", unit="batch", leave=False)
    for s in starts:
        x = faces_to_chw(faces[s:s + batch_size], in_chans).to(device, non_blocking=True)  # (B, C, S, S) uint8
        x = _resize_batch(normalize_batch(x, channels_last), input_size)  # (B, C, H, W) float
        b = x.shape[0]
        with autocast(device, amp):
            if flip_perm is None:
                outs["plain"].append(model(x).float().cpu().numpy())  # (B, K, 2) input px
            else:
                both = model(torch.cat([x, flip_images(x)])).float()  # (2B, K, 2) input px
                outs["plain"].append(both[:b].cpu().numpy())
                outs["flip"].append(unflip_coords(both[b:], input_size, flip_perm).cpu().numpy())
    res = {k: input_to_crop(np.concatenate(v).astype(np.float64), cache_size, input_size)
           for k, v in outs.items()}
    if flip_perm is not None:
        res["tta"] = (res["plain"] + res["flip"]) / 2
    return res


def predict_original(model, ckpt: dict, faces: np.ndarray, crop_to_orig: np.ndarray, tta: str,
                     batch_size: int, device: torch.device, progress: bool = False) -> dict[str, np.ndarray]:
    """predict_crops for a checkpoint's model, mapped to original-image pixels."""
    from pipeline.checkpoint import checkpoint_label_origin
    from pipeline.crop import to_original
    from pipeline.device import amp_dtype

    if tta not in ("none", "flip"):
        raise PipelineError(params_source("predict.tta"), f"predict.tta must be none|flip, got '{tta}'")
    cfg = ckpt["model_config"]
    crops = predict_crops(model, faces, input_size=cfg["input_size"], in_chans=cfg["in_chans"],
                          flip_perm=ckpt["schema"]["flip"] if tta == "flip" else None,
                          batch_size=batch_size, device=device,
                          amp=amp_dtype("auto", device), progress=progress)
    # back to the labels' pixel grid (data.label_origin of the cache the model trained on)
    origin = checkpoint_label_origin(ckpt)
    out = {k: to_original(v, crop_to_orig) + origin for k, v in crops.items()}
    out["final"] = out["tta"] if tta == "flip" else out["plain"]
    return out


def check_crop_geometry(path, ckpt: dict, cache) -> None:
    """A checkpoint predicts only faces cropped as in its training (crop side, expand)."""
    from pipeline.checkpoint import checkpoint_crop

    have = (int(cache.info["size"]), float(cache.info["expand"]))
    want = checkpoint_crop(ckpt, path)
    if want != have:
        raise PipelineError(path, f"trained on {want[0]} px crops with expand {want[1]:g}, but the cache "
                                  f"{cache.path} holds {have[0]} px crops with expand {have[1]:g} "
                                  "(rerun `pipeline crop` with the training's crop params, or retrain)")


def fold_checkpoints(models_dir: str | os.PathLike, k: int, name: str) -> dict[int, Path]:
    """Existing models/fold{i}/<name> for i < k."""
    found = {i: Path(models_dir) / f"fold{i}" / name for i in range(k)}
    return {i: p for i, p in found.items() if p.exists()}


def run_predict(cfg: dict, cache_dir: str, folds_path: str, models_dir: str, out_dir: str,
                backend: str = "torch") -> None:
    from pipeline.backend import load_predictor
    from pipeline.calibrate import keypoint_bias, should_calibrate
    from pipeline.config import write_resolved
    from pipeline.crop import check_same_run, load_cache
    from pipeline.device import resolve_device
    from pipeline.folds import read_folds
    from pipeline.io import atomic_path

    pcfg = cfg["predict"]  # predict.calibrate is one of calibrate.CALIBRATE_MODES (config RANGES)
    device = resolve_device(pcfg["device"])
    train, test = load_cache(Path(cache_dir) / "train"), load_cache(Path(cache_dir) / "test")
    check_same_run(train, test)
    fold_of = read_folds(folds_path, train.meta, Path(cache_dir) / "train")  # rows must be the cache's faces
    ckpts = fold_checkpoints(models_dir, int(fold_of.max()) + 1, pcfg["checkpoint"])
    if not ckpts:
        raise PipelineError(models_dir, f"no fold checkpoints named {pcfg['checkpoint']} found")
    K = train.schema.k
    oof = {"tta": np.full((len(train), K, 2), np.nan), "plain": np.full((len(train), K, 2), np.nan)}
    per_fold = []
    for fold, path in sorted(ckpts.items()):
        model, ckpt = load_predictor(path, backend, device, schema=test.schema)
        check_crop_geometry(path, ckpt, test)
        log.info("fold %d: %s (epoch %d, %s)", fold, path, ckpt["epoch"], backend)
        test_pred = predict_original(model, ckpt, test.faces, test.crop_to_orig, pcfg["tta"],
                                     pcfg["batch_size"], device, progress=True)
        per_fold.append(test_pred["final"])
        val = np.flatnonzero(fold_of == fold)
        if len(val):
            val_pred = predict_original(model, ckpt, train.faces[val], train.crop_to_orig[val], "flip",
                                        pcfg["batch_size"], device)
            oof["tta"][val], oof["plain"][val] = val_pred["tta"], val_pred["plain"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stack = np.stack(per_fold)  # (F, N, K, 2)
    # OOF bias calibration: the per-keypoint mean OOF residual of the predictions of the
    # kind the test set gets (with or without flip TTA)
    oof_kind = oof["tta"] if pcfg["tta"] == "flip" else oof["plain"]
    bias = keypoint_bias(oof_kind, train.keypoints_orig)  # (K, 2)
    calibrated = should_calibrate(pcfg["calibrate"], oof_kind, train.keypoints_orig)
    log.info("OOF bias: mean |x| %.3f px, |y| %.3f px (mean x %+.3f, y %+.3f); calibrate=%s -> %s",
             *np.abs(bias).mean(0), *bias.mean(0), pcfg["calibrate"], "applied" if calibrated else "not applied")
    raw = stack.mean(0)  # (N, K, 2)
    ensemble = raw - bias if calibrated else raw
    # np.savez to an open file: given a path it appends '.npz' to the temp name ('.npz.tmp'),
    # writes there, and the empty temp would be renamed onto the output
    with atomic_path(out / "test.npz", suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, ensemble=ensemble, ensemble_raw=raw, per_fold=stack, folds=np.array(sorted(ckpts)),
                 bias=bias, calibrated=np.array(calibrated))
    with atomic_path(out / "oof.npz", suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, tta=oof["tta"], plain=oof["plain"], fold=fold_of)
    write_resolved(cfg, out, ["predict"])
    log.info("predicted %d test faces with %d fold(s), tta=%s -> %s", len(test), len(ckpts), pcfg["tta"], out)


def predict_xml(xml_path: str | os.PathLike, checkpoints: Sequence[str | os.PathLike],
                predict_cfg: dict, data_cfg: dict, crop_cfg: dict, backend: str = "torch") -> np.ndarray:
    """Predict any test XML with any checkpoints: (N, K, 2) original pixels, fold-averaged."""
    from pipeline.backend import load_predictor
    from pipeline.checkpoint import checkpoint_crop
    from pipeline.crop import crop_faces
    from pipeline.dataset import load_xml
    from pipeline.device import resolve_device
    from pipeline.schema import get_schema

    if not checkpoints:
        raise PipelineError(xml_path, "no checkpoints given")
    schema = get_schema(data_cfg)
    faces = load_xml(xml_path, schema, require_parts=False)
    device = resolve_device(predict_cfg["device"])
    crops_by_geometry: dict[tuple, tuple] = {}  # each checkpoint's faces cropped as in its training
    preds = []
    for path in checkpoints:
        model, ckpt = load_predictor(path, backend, device, schema=schema)
        key = checkpoint_crop(ckpt, path)
        if key not in crops_by_geometry:
            crops_by_geometry[key] = crop_faces(faces, Path(xml_path).parent, key[0], key[1], crop_cfg["n_jobs"])
        crops, crop_to_orig = crops_by_geometry[key]
        preds.append(predict_original(model, ckpt, crops, crop_to_orig, predict_cfg["tta"],
                                      predict_cfg["batch_size"], device)["final"])
    return np.mean(preds, axis=0)


@click.command("predict")
@click.option("--cache", default="data/cache", show_default=True, help="face cache folder (from `crop`)")
@click.option("--folds", "folds_path", default="folds/folds.csv", show_default=True)
@click.option("--models", "models_dir", default="models", show_default=True, help="folder of fold{K}/ checkpoints")
@click.option("--out", "out_dir", default="predictions", show_default=True)
@click.option("--backend", type=click.Choice(["torch", "onnx"]), default="torch", show_default=True,
              help="onnx: onnxruntime on the CPU (each fold's <name>.onnx if exported from it, else exported in memory)")
@config_options
def predict_cmd(cache, folds_path, models_dir, out_dir, backend, cfg):
    """Test predictions (fold ensemble, flip TTA) and out-of-fold predictions."""
    run_predict(cfg, cache, folds_path, models_dir, out_dir, backend)
