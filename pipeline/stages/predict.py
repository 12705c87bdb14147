"""Predict: the fold checkpoints as one `Landmarker` (flip TTA, fold ensemble, OOF
calibration) on the test faces, and each fold's model on its own validation faces (out of
fold), all mapped back to original-image pixels through each face's stored crop transform."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click
import numpy as np

from pipeline.core.config import config_options, params_source, result_params, write_resolved
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.params_schema import Config
from pipeline.core.paths import CACHE_DIR, FOLDS_FILE, MODELS_DIR, PREDICTIONS_DIR
from pipeline.formats.cache import check_same_run, load_cache
from pipeline.formats.checkpoint import model_identity
from pipeline.formats.folds import read_folds
from pipeline.formats.predictions import write_oof_predictions, write_test_predictions
from pipeline.inference.landmarker import Landmarker, check_tta
from pipeline.inference.options import backend_option
from pipeline.inference.predictor import model_runtime
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
    pcfg = cfg.predict  # predict.calibrate: one of calibrate.CALIBRATE_MODES (the config's choices)
    tta, jitter, calibrate = pcfg.tta, pcfg.tta_jitter, pcfg.calibrate
    check_tta(tta, jitter, params_source("predict.tta_jitter", "predict.tta"), prefix="predict.")
    train, test = load_cache(Path(cache_dir) / "train"), load_cache(Path(cache_dir) / "test")
    check_same_run(train, test)
    fold_of = read_folds(folds_path, train.meta, Path(cache_dir) / "train")  # rows must be the cache's faces
    ckpts = fold_checkpoints(models_dir, int(fold_of.max()) + 1, pcfg.checkpoint)
    if not ckpts:
        raise PipelineError(models_dir, f"no fold checkpoints named {pcfg.checkpoint} found")
    folds = sorted(ckpts)
    # every checkpoint is loaded and checked before the first prediction
    landmarker = Landmarker.from_checkpoints([ckpts[f] for f in folds], backend=backend, device=pcfg.device, tta=tta,
                                             jitter=jitter, batch_size=pcfg.batch_size, amp=pcfg.amp,
                                             schema=test.schema)
    landmarker.check_crops(test.info["size"], test.info["expand"], test.path)
    K = train.schema.k
    oof = {"tta": np.full((len(train), K, 2), np.nan), "plain": np.full((len(train), K, 2), np.nan)}
    for i, fold in enumerate(folds):
        log.info("fold %d: %s (epoch %d, %s)", fold, ckpts[fold], landmarker.metas[i]["epoch"], backend)
    stack = landmarker.predict_cached(test.faces, test.crop_to_orig, progress=True)["final"]  # (F, N, K, 2)
    for i, fold in enumerate(folds):
        val = np.flatnonzero(fold_of == fold)
        if len(val):  # with flip whatever predict.tta is: oof.npz keeps both kinds
            val_pred = landmarker.predict_cached(train.faces[val], train.crop_to_orig[val], models=[i], tta="flip")
            oof["tta"][val], oof["plain"][val] = val_pred["tta"][0], val_pred["plain"][0]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # OOF bias calibration: the per-keypoint mean OOF residual of the predictions of the
    # kind the test set gets (with or without flip TTA)
    oof_kind = "tta" if tta == "flip" else "plain"
    truth = train.keypoints_orig  # (N, K, 2): crop requires the train split's keypoints
    assert truth is not None
    bias = keypoint_bias(oof[oof_kind], truth)  # (K, 2)
    calibrated = should_calibrate(calibrate, oof[oof_kind], truth)
    raw = landmarker.ensemble(stack, raw=True)  # (N, K, 2)
    landmarker.calibration = bias if calibrated else None
    ensemble = landmarker.ensemble(stack)
    names = train.schema.names
    # what made the bias: `submit --xml` applies it only to these very models, run the same
    # way (backend, precision), under the same params
    identities = [model_identity(ckpts[f], meta) for f, meta in zip(folds, landmarker.metas)]
    runtime = [model_runtime(meta, landmarker.amp, landmarker.device) for meta in landmarker.metas]
    write_test_predictions(out / "test.npz", ensemble=ensemble, ensemble_raw=raw, per_fold=stack,
                           folds=folds, bias=bias, calibrated=calibrated, oof_kind=oof_kind,
                           face_id=test.meta["face_id"], keypoint_names=names, checkpoint_identity=identities,
                           runtime=runtime, predict_params=result_params(cfg, ["predict"])["predict"])
    write_oof_predictions(out / "oof.npz", tta=oof["tta"], plain=oof["plain"], fold=fold_of,
                          face_id=train.meta["face_id"], keypoint_names=names)
    write_resolved(cfg, out, ["predict"])
    log.info("OOF bias: mean |x| %.3f px, |y| %.3f px (mean x %+.3f, y %+.3f); calibrate=%s -> %s",
             *np.abs(bias).mean(0), *bias.mean(0), calibrate, "applied" if calibrated else "not applied")
    log.info("predicted %d test faces with %d fold(s), tta=%s -> %s", len(test), len(ckpts), tta, out)


@click.command("predict")
@click.option("--cache", default=CACHE_DIR, show_default=True, help="face cache folder (from `crop`)")
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@click.option("--models", "models_dir", default=MODELS_DIR, show_default=True, help="folder of fold{K}/ checkpoints")
@click.option("--out", "out_dir", default=PREDICTIONS_DIR, show_default=True)
@backend_option("onnx: onnxruntime on the CPU (each fold's <name>.onnx if exported from it, else exported in memory)")
@config_options
def predict_cmd(cache, folds_path, models_dir, out_dir, backend, cfg):
    """Test predictions (fold ensemble, flip TTA) and out-of-fold predictions."""
    run_predict(cfg, cache, folds_path, models_dir, out_dir, backend)
