"""Scoring: the `evaluate` stage (OOF per fold and overall, test, OOF bias -> metrics/*.json)
and the `score` command (any CSV against a solution, with the same scorer). The metrics
themselves (MAE, the competition metric, and NME) are in pipeline/keypoints/metrics.py; the
`leaderboard` command that reads metrics/ is pipeline/tools/leaderboard.py."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import click
import numpy as np

from pipeline.core.config import config_options, flatten, write_resolved
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, write_json, write_text
from pipeline.core.params_schema import Config, DataParams
from pipeline.core.paths import CACHE_DIR, FOLDS_FILE, METRICS_DIR, PREDICTIONS_DIR
from pipeline.formats.cache import dataset_root, face_count, read_array, split_schema
from pipeline.formats.folds import read_folds
from pipeline.formats.predictions import OOF_KEYS, read_predictions
from pipeline.formats.submission import read_solution, read_submission
from pipeline.keypoints.calibrate import keypoint_bias, leave_one_out_calibrated
from pipeline.keypoints.metrics import mae, nme
from pipeline.keypoints.schema import get_schema

log = logging.getLogger(__name__)

# params sections recorded in metrics/history.jsonl and compared by the leaderboard
HISTORY_SECTIONS = ("data", "crop", "folds", "model", "train", "predict")


def _r(x: float | None) -> float | None:
    return None if x is None else float(x)


# ---------------------------------------------------------------------------- score

def _parse_eyes(text: str | None) -> tuple[int, int] | None:
    if text is None or text.strip().lower() in ("", "none", "null"):
        return None
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise click.BadParameter(f"expected two indices like 36,45 (or none), got {text!r}") from None


def score_files(submission: str | os.PathLike, solution: str | os.PathLike, k: int | None = None,
                eyes: tuple[int, int] | None = (36, 45), n_rows: int | None = None) -> dict[str, Any]:
    """Score a submission CSV against a solution CSV: {mae, nme, rows, faces, k}.

    `k` None means 68 if the row count allows it (else NME is not computed); an
    explicit k that does not divide the rows is an error. `n_rows` (known from the test
    cache) is what both files must hold; without it, when the two disagree, the one whose
    rows are not whole faces is blamed (the submission when both are)."""
    truth = read_solution(solution, n_rows=n_rows)
    pred = read_submission(submission)
    if len(pred) != len(truth):
        per_face = 2 * (68 if k is None else max(1, int(k)))
        if len(truth) % per_face and not len(pred) % per_face:
            raise PipelineError(solution, f"{len(truth)} rows, not whole faces of {per_face // 2} keypoints "
                                          f"(the submission {submission} has {len(pred)})")
        pred = read_submission(submission, n_rows=len(truth))
    result: dict[str, Any] = {"mae": mae(pred, truth), "nme": None, "rows": int(len(truth)),
                              "faces": None, "k": None}
    kk = 68 if k is None else int(k)
    if kk < 1:
        raise click.BadParameter(f"--keypoints must be >= 1, got {kk}")
    if len(truth) % (2 * kk):
        if k is not None:
            raise PipelineError(solution, f"{len(truth)} rows is not a multiple of 2 x {kk} keypoints")
        return result
    n = len(truth) // (2 * kk)
    result.update(faces=n, k=kk, nme=_r(nme(pred.reshape(n, kk, 2), truth.reshape(n, kk, 2), eyes, where=solution)))
    return result


@click.command("score")
@click.argument("submission")
@click.option("--solution", required=True, help="truth CSV (Id,Predicted)")
@click.option("--keypoints", "k", type=int, default=None, help="keypoints per face (default 68 when it fits)")
@click.option("--eyes", default="36,45", show_default=True, help="outer eye corner indices for NME, or none")
@click.option("--json", "json_out", default=None, help="also write the scores here")
def score_cmd(submission, solution, k, eyes, json_out):
    """Score a competition CSV against a solution: MAE (pixels) and NME (%)."""
    if json_out:
        check_output(json_out)
    res = score_files(submission, solution, k, _parse_eyes(eyes))
    click.echo(f"MAE  {res['mae']:.6f} px   ({res['rows']} values)")
    if res["nme"] is not None:
        click.echo(f"NME  {100 * res['nme']:.4f} %   ({res['faces']} faces x {res['k']} keypoints)")
    else:
        click.echo("NME  n/a")
    if json_out:
        write_json(json_out, res)


# ---------------------------------------------------------------------------- evaluate


def _block(pred: np.ndarray, plain: np.ndarray, truth: np.ndarray, eyes) -> dict[str, Any]:
    return {"mae": mae(pred, truth), "nme": _r(nme(pred, truth, eyes)),
            "mae_notta": mae(plain, truth), "nme_notta": _r(nme(plain, truth, eyes)), "n": int(len(truth))}


def oof_metrics(tta: np.ndarray, plain: np.ndarray, fold: np.ndarray, truth: np.ndarray,
                eyes) -> dict[str, Any]:
    """Per-fold and overall OOF metrics. Faces with any non-finite prediction (folds not
    trained) are skipped and counted; folds with no scored face are listed as untrained."""
    valid = np.isfinite(tta).all(axis=(1, 2)) & np.isfinite(plain).all(axis=(1, 2))
    per_fold: dict[str, Any] = {}
    untrained = []
    for f in sorted(np.unique(fold).tolist()):
        idx = (fold == f) & valid
        n_skip = int(((fold == f) & ~valid).sum())
        if not idx.any():
            untrained.append(int(f))
            continue
        per_fold[str(int(f))] = {**_block(tta[idx], plain[idx], truth[idx], eyes), "skipped": n_skip}
    if valid.any():
        overall = _block(tta[valid], plain[valid], truth[valid], eyes)
    else:
        overall = {"mae": None, "nme": None, "mae_notta": None, "nme_notta": None, "n": 0}
    overall["skipped"] = int((~valid).sum())
    overall["untrained_folds"] = untrained
    return {"per_fold": per_fold, "overall": overall}


def oof_bias_report(tta: np.ndarray, truth: np.ndarray, eyes, names: Sequence[str]) -> dict[str, Any]:
    """Per-keypoint mean OOF residual (x, y, original px) and the OOF metrics after
    subtracting it, each face calibrated with the other faces' estimate (leave-one-out,
    so the improvement is not measured on the faces it was fitted to)."""
    ok = np.isfinite(tta).all(axis=(1, 2))
    bias = keypoint_bias(tta, truth)  # (K, 2)
    report: dict[str, Any] = {"n": int(ok.sum()), "mean_x": float(bias[:, 0].mean()),
                              "mean_y": float(bias[:, 1].mean()),
                              "mean_abs": float(np.abs(bias).mean()),
                              "oof_mae_cal": None, "oof_nme_cal": None,
                              "per_keypoint": {str(n): [round(float(bx), 4), round(float(by), 4)]
                                               for n, (bx, by) in zip(names, bias)}}
    if ok.sum() >= 2:
        cal = leave_one_out_calibrated(tta, truth)[ok]
        report.update(oof_mae_cal=mae(cal, truth[ok]), oof_nme_cal=_r(nme(cal, truth[ok], eyes)))
    return report


def leaderboard_summary(oof: dict, bias: dict, test: dict) -> dict[str, float]:
    """The figures runs are compared by, under short flat names (one `dvc metrics show` row,
    one `dvc exp show` column each): OOF `mae`, `nme` (flip TTA) overall and per fold
    (`mae_f0`, `nme_f0`, ...), the leave-one-out calibrated OOF `mae_cal`, and the test
    `test_mae`, `test_nme`, `test_mae_uncal` (before OOF calibration). Figures that do not
    exist (no solution, untrained fold) are left out rather than written as null."""
    ov = oof["overall"]
    figures: dict[str, Any] = {"mae": ov["mae"], "nme": ov["nme"], "mae_cal": bias["oof_mae_cal"]}
    for f, m in oof["per_fold"].items():
        figures[f"mae_f{f}"] = m["mae"]
        figures[f"nme_f{f}"] = m["nme"]
    figures.update(test_mae=test["mae"], test_nme=test["nme"], test_mae_uncal=test.get("mae_uncal"))
    return {k: v for k, v in figures.items() if v is not None}


def uncalibrated_test_scores(test_npz: Path, solution: Path, eyes) -> dict[str, Any]:
    """Test MAE / NME of the ensemble before OOF calibration, when predict stored it and
    the truth exists: the leaderboard shows the test score with and without calibration."""
    if not (test_npz.exists() and solution.exists()):
        return {}
    z = read_predictions(test_npz, ("ensemble_raw", "calibrated"))
    raw, calibrated = z["ensemble_raw"].astype(np.float64), bool(z["calibrated"])  # (N, K, 2)
    truth = read_solution(solution)
    if truth.size != raw.size:
        return {"calibrated": calibrated}
    truth = truth.reshape(raw.shape)
    return {"calibrated": calibrated, "mae_uncal": mae(raw, truth), "nme_uncal": _r(nme(raw, truth, eyes))}


def solution_path(data_cfg: DataParams) -> Path:
    """Where the test truth lives: data.dir/data.solution, or the demo set's solution."""
    return dataset_root(data_cfg) / data_cfg.solution


def _append_history(path: Path, entry: dict) -> None:
    old = path.read_text() if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    write_text(path, old + json.dumps(entry, sort_keys=True, default=str) + "\n")


def flat_params(cfg: Config, sections: Sequence[str] = HISTORY_SECTIONS) -> dict[str, Any]:
    return flatten(cfg.model_dump(include=set(sections)))


def run_evaluate(cfg: Config, cache: str | os.PathLike, folds_path: str | os.PathLike,
                 predictions: str | os.PathLike, out_dir: str | os.PathLike,
                 submission: str | os.PathLike | None = None, history: bool = True) -> dict[str, Any]:
    cache, predictions, out = Path(cache), Path(predictions), check_output(out_dir, folder=True)
    train_split, test_split = cache / "train", cache / "test"
    schema = split_schema(train_split)
    if schema is None:  # no cache: the params' schema
        schema = get_schema(cfg.data)
    eyes = schema.eyes

    # OOF
    truth = read_array(train_split, "keypoints_orig").astype(np.float64)  # (N, K, 2)
    oof_path = predictions / "oof.npz"
    z = read_predictions(oof_path, OOF_KEYS)
    for key in ("tta", "plain"):
        if z[key].shape != truth.shape:
            raise PipelineError(oof_path, f"'{key}' has shape {z[key].shape}, truth "
                                          f"{train_split / 'keypoints_orig.npy'} has {truth.shape}")
    fold = z["fold"].reshape(-1)
    if len(fold) != len(truth):
        raise PipelineError(oof_path, f"'fold' has {len(fold)} entries for {len(truth)} faces")
    folds_path = Path(folds_path)
    if folds_path.exists():
        folds_fold = read_folds(folds_path)
        if len(folds_fold) != len(fold) or not np.array_equal(folds_fold, fold):
            raise PipelineError(oof_path, f"folds differ from {folds_path}; rerun `pipeline predict`")
    tta = z["tta"].astype(np.float64)  # (N, K, 2)
    oof = oof_metrics(tta, z["plain"].astype(np.float64), fold, truth, eyes)
    bias = oof_bias_report(tta, truth, eyes, schema.names)

    # test
    sol = solution_path(cfg.data)
    sub = Path(submission) if submission else Path("submissions") / f"{cfg.submit.name}.csv"
    test: dict[str, Any] = {"mae": None, "nme": None, "n": 0, "solution": None, "submission": None}
    unscored = None  # logged once the metrics are written: a failure is the command's only line
    if not sol.exists():
        unscored = ("no solution at %s: test set not scored", sol)
    elif not sub.exists():
        if submission:
            raise PipelineError(sub, "submission not found (run `pipeline submit` first)")
        unscored = ("no submission at %s: test set not scored", sub)
    else:
        # the solution must cover the test faces
        n_test = face_count(test_split)
        s = score_files(sub, sol, schema.k, eyes, None if n_test is None else n_test * schema.k * 2)
        test = {"mae": s["mae"], "nme": s["nme"], "n": s["faces"], "solution": str(sol), "submission": str(sub)}

    test.update(uncalibrated_test_scores(predictions / "test.npz", sol, eyes))

    summary = leaderboard_summary(oof, bias, test)
    # summary.json is the one DVC metric (a leaderboard row); the detailed files are plain outputs
    write_json(out / "bias.json", bias)
    write_json(out / "oof.json", oof)
    write_json(out / "test.json", test)
    write_json(out / "summary.json", summary)
    write_resolved(cfg, out, ["data", "submit"])
    if history:
        _append_history(out / "history.jsonl", {
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "params": flat_params(cfg), "summary": summary})
    if unscored:
        log.info(*unscored)
    return {"oof": oof, "test": test, "summary": summary}


def format_pct(x) -> str:
    return "-" if x is None else f"{100 * x:.3f}%"


def format_num(x, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


@click.command("evaluate")
@click.option("--cache", default=CACHE_DIR, show_default=True, help="face cache (train/keypoints_orig.npy)")
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@click.option("--predictions", default=PREDICTIONS_DIR, show_default=True, help="folder of oof.npz")
@click.option("--out", "out_dir", default=METRICS_DIR, show_default=True)
@click.option("--submission", default=None, help="CSV scored against the solution "
                                                 "[default: submissions/<submit.name>.csv]")
@config_options
def evaluate_cmd(cache, folds_path, predictions, out_dir, submission, cfg):
    """OOF metrics per fold and overall, test metrics when a solution exists -> metrics/*.json."""
    res = run_evaluate(cfg, cache, folds_path, predictions, out_dir, submission)
    s, ov, test = res["summary"], res["oof"]["overall"], res["test"]
    click.echo(f"OOF   MAE {format_num(s.get('mae'))} px  NME {format_pct(s.get('nme'))}  "
               f"(no TTA: MAE {format_num(ov['mae_notta'])}; calibrated: MAE {format_num(s.get('mae_cal'))})  n={ov['n']}")
    if test["mae"] is not None:
        click.echo(f"test  MAE {format_num(test['mae'])} px  NME {format_pct(test['nme'])}  n={test['n']}  "
                   f"(calibrated: {test.get('calibrated')}; uncalibrated MAE {format_num(test.get('mae_uncal'))})")
    click.echo(f"wrote {Path(out_dir) / 'summary.json'}")





