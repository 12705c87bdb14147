"""Predict: flip TTA, fold ensemble, out-of-fold predictions, all mapped back to
original-image pixels through each face's stored crop transform."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click
import numpy as np

from pipeline.core.config import Config, config_options, write_resolved
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.paths import CACHE_DIR, FOLDS_FILE, MODELS_DIR, PREDICTIONS_DIR
from pipeline.formats.cache import check_same_run, load_cache
from pipeline.formats.folds import read_folds
from pipeline.formats.predictions import write_oof_predictions, write_test_predictions
from pipeline.inference.predictor import load_predictor
from pipeline.inference.tta import check_crop_geometry, predict_original
from pipeline.keypoints.calibrate import keypoint_bias, should_calibrate

log = logging.getLogger(__name__)


def fold_checkpoints(models_dir: str | os.PathLike, k: int, name: str) -> dict[int, Path]:
    """Existing models/fold{i}/<name> for i < k."""
    found = {i: Path(models_dir) / f"fold{i}" / name for i in range(k)}
    return {i: p for i, p in found.items() if p.exists()}


def run_predict(cfg: Config, cache_dir: str, folds_path: str, models_dir: str, out_dir: str,
                backend: str = "torch") -> None:
    """The `predict` stage: every fold's model on the test faces (the ensemble, OOF-calibrated
    per predict.calibrate) and on its own validation faces (out of fold) -> out_dir."""
    check_output(out_dir, folder=True)
    pcfg = cfg.predict  # predict.calibrate is one of calibrate.CALIBRATE_MODES (a Switch of the config)
    device = resolve_device(pcfg.device)
    train, test = load_cache(Path(cache_dir) / "train"), load_cache(Path(cache_dir) / "test")
    check_same_run(train, test)
    fold_of = read_folds(folds_path, train.meta, Path(cache_dir) / "train")  # rows must be the cache's faces
    ckpts = fold_checkpoints(models_dir, int(fold_of.max()) + 1, pcfg.checkpoint)
    if not ckpts:
        raise PipelineError(models_dir, f"no fold checkpoints named {pcfg.checkpoint} found")
    K = train.schema.k
    oof = {"tta": np.full((len(train), K, 2), np.nan), "plain": np.full((len(train), K, 2), np.nan)}
    per_fold = []
    loaded = {}  # every checkpoint is checked before the first prediction (and its log line)
    for fold, path in sorted(ckpts.items()):
        loaded[fold] = load_predictor(path, backend, device, schema=test.schema)
        check_crop_geometry(path, loaded[fold][1], test)
    for fold, path in sorted(ckpts.items()):
        model, ckpt = loaded.pop(fold)
        log.info("fold %d: %s (epoch %d, %s)", fold, path, ckpt["epoch"], backend)
        test_pred = predict_original(model, ckpt, test.faces, test.crop_to_orig, pcfg.tta,
                                     pcfg.batch_size, device, progress=True, amp=pcfg.amp,
                                     jitter=pcfg.tta_jitter)
        per_fold.append(test_pred["final"])
        val = np.flatnonzero(fold_of == fold)
        if len(val):
            val_pred = predict_original(model, ckpt, train.faces[val], train.crop_to_orig[val], "flip",
                                        pcfg.batch_size, device, amp=pcfg.amp, jitter=pcfg.tta_jitter)
            oof["tta"][val], oof["plain"][val] = val_pred["tta"], val_pred["plain"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stack = np.stack(per_fold)  # (F, N, K, 2)
    # OOF bias calibration: the per-keypoint mean OOF residual of the predictions of the
    # kind the test set gets (with or without flip TTA)
    oof_kind = oof["tta"] if pcfg.tta == "flip" else oof["plain"]
    bias = keypoint_bias(oof_kind, train.keypoints_orig)  # (K, 2)
    calibrated = should_calibrate(pcfg.calibrate, oof_kind, train.keypoints_orig)
    raw = stack.mean(0)  # (N, K, 2)
    ensemble = raw - bias if calibrated else raw
    names = train.schema.names
    write_test_predictions(out / "test.npz", ensemble=ensemble, ensemble_raw=raw, per_fold=stack,
                           folds=sorted(ckpts), bias=bias, calibrated=calibrated,
                           oof_kind="tta" if pcfg.tta == "flip" else "plain",
                           face_id=test.meta["face_id"], keypoint_names=names)
    write_oof_predictions(out / "oof.npz", tta=oof["tta"], plain=oof["plain"], fold=fold_of,
                          face_id=train.meta["face_id"], keypoint_names=names)
    write_resolved(cfg, out, ["predict"])
    log.info("OOF bias: mean |x| %.3f px, |y| %.3f px (mean x %+.3f, y %+.3f); calibrate=%s -> %s",
             *np.abs(bias).mean(0), *bias.mean(0), pcfg.calibrate, "applied" if calibrated else "not applied")
    log.info("predicted %d test faces with %d fold(s), tta=%s -> %s", len(test), len(ckpts), pcfg.tta, out)


@click.command("predict")
@click.option("--cache", default=CACHE_DIR, show_default=True, help="face cache folder (from `crop`)")
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@click.option("--models", "models_dir", default=MODELS_DIR, show_default=True, help="folder of fold{K}/ checkpoints")
@click.option("--out", "out_dir", default=PREDICTIONS_DIR, show_default=True)
@click.option("--backend", type=click.Choice(["torch", "onnx"]), default="torch", show_default=True,
              help="onnx: onnxruntime on the CPU (each fold's <name>.onnx if exported from it, else exported in memory)")
@config_options
def predict_cmd(cache, folds_path, models_dir, out_dir, backend, cfg):
    """Test predictions (fold ensemble, flip TTA) and out-of-fold predictions."""
    run_predict(cfg, cache, folds_path, models_dir, out_dir, backend)
