"""OOF bias calibration: the mean residual of each keypoint's out-of-fold predictions,
subtracted from the test predictions.

A model can be off by the same amount on every face for one keypoint (a labelling
convention it cannot see, such as a pixel-origin mismatch, or a point whose annotators
lean one way). Out-of-fold predictions measure that offset on faces the model never
trained on. To judge whether subtracting it helps without fooling ourselves, each OOF
face is calibrated with the offset estimated from the *other* OOF faces (leave-one-out),
so the calibrated OOF error is an honest estimate of the calibrated test error."""

from __future__ import annotations

import numpy as np

CALIBRATE_MODES = ("auto", "on", "off")


def _valid(pred: np.ndarray) -> np.ndarray:
    """(N,) faces whose prediction is finite (folds that were not trained give NaN)."""
    return np.isfinite(pred).all(axis=(1, 2))


def keypoint_bias(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Mean residual pred - truth per keypoint over the faces with a prediction: (K, 2),
    x then y, original pixels. Zero when no face has one."""
    ok = _valid(pred)
    if not ok.any():
        return np.zeros(pred.shape[1:], dtype=np.float64)
    return (np.asarray(pred, np.float64)[ok] - np.asarray(truth, np.float64)[ok]).mean(0)


def leave_one_out_calibrated(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Each face's prediction minus the bias estimated from every other face: (N, K, 2).
    Faces without a prediction stay NaN; with fewer than two faces nothing changes."""
    pred = np.asarray(pred, np.float64)
    out = pred.copy()
    ok = _valid(pred)
    n = int(ok.sum())
    if n < 2:
        return out
    resid = pred[ok] - np.asarray(truth, np.float64)[ok]  # (n, K, 2)
    loo = (resid.sum(0, keepdims=True) - resid) / (n - 1)  # (n, K, 2)
    out[ok] = pred[ok] - loo
    return out


def should_calibrate(mode: str, pred: np.ndarray, truth: np.ndarray) -> bool:
    """on / off as given; auto: only when the leave-one-out calibrated OOF MAE is lower."""
    if mode not in CALIBRATE_MODES:
        raise ValueError(f"calibrate mode must be one of {CALIBRATE_MODES}, got {mode!r}")
    if mode != "auto":
        return mode == "on"
    ok = _valid(pred)
    if ok.sum() < 2:
        return False
    raw = np.abs(pred[ok] - truth[ok]).mean()
    cal = np.abs(leave_one_out_calibrated(pred, truth)[ok] - truth[ok]).mean()
    return bool(cal < raw)
