"""The `submit` stage: the competition CSV (pipeline/formats/submission.py) from the test
predictions (pipeline/formats/predictions.py), or, standalone, from any test XML and checkpoints
(a `Landmarker`, with the OOF calibration `pipeline predict` fitted for that very ensemble: the
same checkpoints, compared by their weights and counted, run the same way, backend and
precision, under the same predict params; so the standalone CSV of the test XML is the stage's,
byte for byte). The coordinates are validated against the test cache's face and keypoint counts
before anything is written."""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Sequence

import click
import numpy as np

from pipeline.core.config import config_options, params_source
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, input_file
from pipeline.core.params_schema import Config, PredictParams
from pipeline.core.paths import CACHE_DIR, PREDICTIONS_DIR
from pipeline.formats.cache import face_count, split_schema
from pipeline.formats.predictions import read_predictions
from pipeline.formats.submission import validate_coords, write_submission
from pipeline.keypoints.schema import get_schema

log = logging.getLogger(__name__)


def submission_path(cfg: Config, out_dir: str | os.PathLike, out_path: str | os.PathLike | None) -> Path:
    """--out, else <out_dir>/<submit.name>.csv (submit.name must be a plain file name)."""
    name = cfg.submit.name
    if not name or "/" in name or "\\" in name or "\0" in name or name in (".", ".."):
        raise PipelineError(params_source("submit.name"), f"submit.name must be a plain file name, got {name!r}")
    return Path(out_path) if out_path else Path(out_dir) / f"{name}.csv"


def run_submit(predictions_path: str | os.PathLike, cache: str | os.PathLike, out: Path) -> np.ndarray:
    """The `submit` stage: test.npz's `ensemble` -> CSV; the test cache (when present)
    fixes how many faces and keypoints it must hold."""
    coords = read_predictions(predictions_path, ("ensemble",))["ensemble"]
    test_split = Path(cache) / "test"
    schema = split_schema(test_split)
    return _write(coords, predictions_path, out, face_count(test_split), None if schema is None else schema.k)


def project_predictions(checkpoints: Sequence[str | os.PathLike]) -> Path | None:
    """<project>/predictions/test.npz for checkpoints <project>/<models>/fold<K>/<name> (the
    layout `pipeline train` and `pipeline predict` write), else None."""
    paths = [Path(c).absolute() for c in checkpoints]
    if not all(re.fullmatch(r"fold\d+", p.parent.name) for p in paths) or len({p.parent.parent for p in paths}) != 1:
        return None
    return paths[0].parent.parent.parent / PREDICTIONS_DIR / "test.npz"


def _kinds(runtimes: Sequence[str]) -> str:
    """'torch fp32', 'onnx int8': the backends and precisions of `model_runtime` strings."""
    return ", ".join(sorted({" ".join(r.split()[:2]) for r in runtimes}))


def calibration_mismatch(test_npz: Path, predict_cfg: PredictParams, checkpoints: Sequence[str | os.PathLike],
                         metas: Sequence[dict], schema) -> str | None:
    """Why the OOF calibration in `test_npz` is not the one `pipeline predict` fitted for
    these checkpoints, run under these predict params (None: it is). The bias is for one
    ensemble: the same checkpoints by what they predict with (test.npz records each one's
    `checkpoint_identity`: weights and geometry), each as many times, each run the same way
    (its `runtime`: backend and precision), under the predict params test.npz records."""
    from pipeline.core.device import resolve_device  # torch: not on the DVC stage's path
    from pipeline.formats.checkpoint import model_identity
    from pipeline.inference.predictor import model_runtime

    z = read_predictions(test_npz, ("oof_kind", "keypoint_names"),
                         optional=("checkpoint_identity", "runtime", "predict_params"))
    if [str(n) for n in z["keypoint_names"]] != list(schema.names):
        return f"its keypoints are not those of schema '{schema.name}'"
    if any(k not in z for k in ("checkpoint_identity", "runtime", "predict_params")):
        return ("it does not record the models, how they ran and the predict params it was made with "
                "(rerun `pipeline predict`)")
    made = [str(h) for h in z["checkpoint_identity"].reshape(-1)]
    made_runs = [str(r) for r in z["runtime"].reshape(-1)]
    mine: list[str] = []
    for c, meta in zip(checkpoints, metas):
        # an exported .onnx model is no checkpoint: never one `pipeline predict` used
        identity = None if Path(c).suffix == ".onnx" else model_identity(c, meta)
        if identity is None or identity not in made:
            return f"made from other checkpoints than {c} (not the weights `pipeline predict` used)"
        mine.append(identity)
    if len(checkpoints) != len(made):
        return f"made from {len(made)} checkpoint(s), not these {len(checkpoints)}"
    device = resolve_device(predict_cfg.device)
    runs = [model_runtime(meta, predict_cfg.amp, device) for meta in metas]
    if Counter(runs) != Counter(made_runs):
        if _kinds(runs) == _kinds(made_runs):
            return f"made with other exported models ({_kinds(made_runs)}) than this run's"
        return f"its models ran as {_kinds(made_runs)}, this run's as {_kinds(runs)} (predict.amp, device, --backend)"
    if Counter(zip(mine, runs)) != Counter(zip(made, made_runs)):
        odd = [(c, h) for c, h in zip(checkpoints, mine) if mine.count(h) != made.count(h)]
        if not odd:
            return "its models ran otherwise, one by one, than this run's (backend and precision of each)"
        c, h = odd[0]
        return (f"made from another ensemble: {c} is given {mine.count(h)} time(s) here, {made.count(h)} there "
                "(a checkpoint given twice weighs twice in the mean)")
    want_kind = "tta" if predict_cfg.tta == "flip" else "plain"
    if str(z["oof_kind"]) != want_kind:
        return (f"fitted on '{z['oof_kind']}' OOF predictions, this run's predict.tta {predict_cfg.tta} "
                f"needs '{want_kind}'")
    try:
        theirs = json.loads(str(z["predict_params"]))
    except ValueError:
        theirs = None
    if not isinstance(theirs, dict):
        return "its predict_params are not readable (rerun `pipeline predict`)"
    for key in ("tta", "tta_jitter", "calibrate"):
        if theirs.get(key) != getattr(predict_cfg, key):
            return f"made with predict.{key} {theirs.get(key)}, this run has {getattr(predict_cfg, key)}"
    return None


def xml_calibration(choice: str, predict_cfg: PredictParams, checkpoints: Sequence[str | os.PathLike],
                    metas: Sequence[dict], schema) -> np.ndarray | None:
    """The OOF bias (K, 2) `submit --xml` subtracts, or None. choice: off; a predictions
    test.npz (its bias when it says it was applied; an error when it was made from other
    checkpoints, by their weights, or other predict params); auto: the same from the checkpoints'
    project (`project_predictions`) when it is there, one warning line saying why and no
    calibration when it does not fit."""
    if choice == "off" or predict_cfg.calibrate == "off":
        return None
    path = project_predictions(checkpoints) if choice == "auto" else Path(choice)
    if path is None or (choice == "auto" and not path.is_file()):
        log.info("no OOF calibration: no predictions/test.npz beside the checkpoints' models folder")
        return None
    input_file(path, "predictions not found", "a predictions test.npz")
    problem = calibration_mismatch(path, predict_cfg, checkpoints, metas, schema)
    if problem and choice == "auto":
        log.warning("%s: OOF calibration not applied: %s", path, problem)
        return None
    if problem:
        raise PipelineError(path, f"cannot calibrate with it: {problem}")
    z = read_predictions(path, ("bias", "calibrated"))
    if not bool(z["calibrated"]):
        log.info("%s: `pipeline predict` did not apply its OOF calibration: none applied", path)
        return None
    log.info("OOF calibration of %s applied (mean |bias| %.3f px)", path, float(np.abs(z["bias"]).mean()))
    return z["bias"].astype(np.float64)


def run_submit_xml(cfg: Config, xml_path: str | os.PathLike, checkpoints: Sequence[str], out: Path,
                   calibration: str = "auto") -> np.ndarray:
    """Standalone: predict any test XML with any checkpoints (their `Landmarker`) -> CSV."""
    # the one path of submit that runs a network: the DVC stage (from predictions/) starts
    # without torch's import
    from pipeline.inference.landmarker import Landmarker, check_tta

    input_file(xml_path, "test XML not found", "a test XML file")
    for c in checkpoints:  # all of them before the first one predicts
        input_file(c, "checkpoint not found", "a checkpoint file")
    pcfg = cfg.predict
    check_tta(pcfg.tta, pcfg.tta_jitter, params_source("predict.tta_jitter", "predict.tta"), prefix="predict.")
    schema = get_schema(cfg.data)
    landmarker = Landmarker.from_checkpoints(checkpoints, backend="torch", device=pcfg.device, tta=pcfg.tta,
                                             jitter=pcfg.tta_jitter, batch_size=pcfg.batch_size, amp=pcfg.amp,
                                             schema=schema)
    landmarker.calibration = xml_calibration(calibration, pcfg, checkpoints, landmarker.metas, schema)
    coords = landmarker.predict_xml(xml_path, cfg.crop.n_jobs)
    return _write(coords, xml_path, out, None, schema.k)


def _write(coords, source, out: Path, n_faces: int | None, k: int | None) -> np.ndarray:
    arr = validate_coords(coords, source, n_faces=n_faces, k=k)
    write_submission(out, arr)
    return arr


@click.command("submit")
@click.option("--predictions", "predictions_path", default="predictions/test.npz", show_default=True,
              help="test predictions from `pipeline predict` (its `ensemble` array is written)")
@click.option("--cache", default=CACHE_DIR, show_default=True,
              help="face cache; test/meta.csv gives the expected face count")
@click.option("--out-dir", default="submissions", show_default=True,
              help="folder of <submit.name>.csv")
@click.option("--xml", "xml_path", default=None,
              help="standalone mode: predict this test XML instead of reading --predictions")
@click.option("--checkpoints", multiple=True,
              help="standalone mode: checkpoint(s) to ensemble; more may follow as arguments")
@click.option("--out", "out_path", default=None,
              help="output CSV (default <out-dir>/<submit.name>.csv)")
@click.option("--calibration", default="auto", show_default=True,
              help="standalone mode: the OOF calibration to subtract: auto (what `pipeline predict` applied "
                   "for checkpoints <project>/models/fold*/..., from <project>/predictions/test.npz when "
                   "there), off, or a predictions test.npz")
@click.argument("more_checkpoints", nargs=-1)
@config_options
def submit_cmd(predictions_path, cache, out_dir, xml_path, checkpoints, out_path, calibration, more_checkpoints,
               cfg):
    """Write the competition CSV (Id,Predicted) from the test predictions.

    Standalone: `pipeline submit --xml TEST_XML --checkpoints a.pt [b.pt ...] [--out PATH]`
    predicts any test XML with any checkpoints (fold-averaged, OOF-calibrated as `pipeline
    predict` did for them: with the same predict params, the test XML gives the stage's CSV)."""
    out = check_output(submission_path(cfg, out_dir, out_path))
    ckpts = list(checkpoints) + list(more_checkpoints)
    if xml_path is None:
        if ckpts:
            raise click.UsageError("checkpoints are only used with --xml (standalone mode)")
        arr = run_submit(predictions_path, cache, out)
    else:
        if not ckpts:
            raise click.UsageError("--xml needs --checkpoints a.pt [b.pt ...]")
        arr = run_submit_xml(cfg, xml_path, ckpts, out, calibration)
    click.echo(f"wrote {out}: {arr.shape[0]} faces x {arr.shape[1]} keypoints = {arr.size} rows")
