"""Determinism: the same seed and data give a byte-identical submission on CPU.

Two full tiny runs through the CLI (demo-data -> crop -> folds -> train 2 folds x 1 epoch
-> predict -> submit), each in its own folder and its own Python process, started at the
same time. Run B differs in what must not matter: crop.n_jobs (joblib workers vs in
process), the folder path and PYTHONHASHSEED. When the CSVs differ, the intermediate
files are compared to say which stage diverged first."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from helpers import REPO

PARAMS = {
    "data": {"dir": "demo"},
    "demo": {"n_train": 40, "n_test": 6, "seed": 11},
    "crop": {"side": 32, "n_jobs": 1},
    "folds": {"k": 2, "train": [0, 1]},
    "model": {"input_size": 32},
    "train": {"epochs": 1, "batch_size": 8, "randaug_n": 1, "device": "cpu"},
    "predict": {"device": "cpu", "batch_size": 16},
    "submit": {"name": "submission"},
}

# every step through the CLI entry point (one process per run: torch is imported once)
DRIVER = r"""
import sys
from pipeline.cli import main

STEPS = [
    ["demo-data", "demo"],
    ["crop", "--out", "cache"],
    ["folds", "--cache", "cache", "--out", "folds.csv"],
    ["train", "--fold", "0", "--cache", "cache", "--folds", "folds.csv", "--out", "models", "--live", "live/fold0"],
    ["train", "--fold", "1", "--cache", "cache", "--folds", "folds.csv", "--out", "models", "--live", "live/fold1"],
    ["predict", "--cache", "cache", "--folds", "folds.csv", "--models", "models", "--out", "predictions"],
    ["submit", "--predictions", "predictions/test.npz", "--cache", "cache", "--out-dir", "submissions"],
]
for argv in STEPS:
    try:
        main(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            sys.exit(f"step {argv[0]} exited {e.code}")
"""


def _start(run_dir: Path, n_jobs: int, hashseed: str) -> subprocess.Popen:
    run_dir.mkdir(parents=True)
    params = {s: dict(v) for s, v in PARAMS.items()}
    params["crop"]["n_jobs"] = n_jobs
    (run_dir / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": hashseed}
    return subprocess.Popen([sys.executable, "-c", DRIVER], cwd=run_dir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _first_difference(a: Path, b: Path) -> str | None:
    """The earliest stage output that differs between the two runs (None: none does)."""
    checks = ["demo/labels_ibug_300W_train.xml", "demo/labels_ibug_300W_test_parsed.xml",
              *[f"demo/images/train/{p.name}" for p in sorted((a / "demo/images/train").glob("*.jpg"))],
              "cache/train/faces.npy", "cache/train/keypoints.npy", "cache/test/faces.npy", "folds.csv"]
    for rel in checks:
        if _digest(a / rel) != _digest(b / rel):
            return rel
    for fold in (0, 1):
        ca = torch.load(a / f"models/fold{fold}/last.pt", weights_only=True)
        cb = torch.load(b / f"models/fold{fold}/last.pt", weights_only=True)
        for k in ca["model"]:
            if not torch.equal(ca["model"][k], cb["model"][k]):
                return f"models/fold{fold}/last.pt: weights {k}"
    with np.load(a / "predictions/test.npz") as za, np.load(b / "predictions/test.npz") as zb:
        for k in za.files:
            if not np.array_equal(za[k], zb[k]):
                return f"predictions/test.npz: {k}"
    return None


def test_two_runs_give_identical_submissions(tmp_path):
    a, b = tmp_path / "run_a", tmp_path / "elsewhere" / "run_b"
    procs = [_start(a, n_jobs=1, hashseed="0"), _start(b, n_jobs=2, hashseed="12345")]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    sa, sb = a / "submissions" / "submission.csv", b / "submissions" / "submission.csv"
    assert sa.read_text().startswith("Id,Predicted\n")
    n_rows = len(sa.read_text().splitlines()) - 1
    assert n_rows == PARAMS["demo"]["n_test"] * 68 * 2
    assert sa.read_bytes() == sb.read_bytes(), \
        f"runs diverge first at {_first_difference(a, b) or 'the CSV text'}"
    # and every intermediate (images, cache, folds, weights, raw predictions) is identical,
    # not just the 6-decimal CSV
    assert _first_difference(a, b) is None
