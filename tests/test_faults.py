"""Faults: a training process killed with SIGKILL mid-epoch leaves only whole files, and
`pipeline train --resume` continues from the last complete epoch to the same result as a
run that was never interrupted.

Temp files: every output is written to `.<name>.<random>.tmp` and renamed (pipeline/core/io.py),
so a kill mid-write can leave such a temp file behind, never half an output. The next
`pipeline train` of that fold deletes the stale temps of its own outputs in its folder
(`remove_stale_temps`) before it writes anything."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.formats.checkpoint import load_checkpoint

from helpers import REPO

EPOCHS = 5
SETS = ["crop.side=32", "model.input_size=32", "train.batch_size=8", f"train.epochs={EPOCHS}",
        "train.warmup_epochs=1", "folds.k=2", "folds.train=[0,1]", "train.randaug_n=1", "train.device=cpu"]


def _cmd(ws: Path, out: Path, live: Path, *extra: str, sets: list[str] = SETS) -> list[str]:
    cmd = [sys.executable, "-m", "pipeline", "train", "--fold", "0", "--cache", str(ws / "cache"),
           "--folds", str(ws / "folds.csv"), "--out", str(out), "--live", str(live), *extra]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _epoch_of(path: Path) -> int:
    """Epoch in last.pt, 0 while it does not exist yet. The file is replaced by rename, so a
    reader sees the old or the new checkpoint, never a mix."""
    if not path.exists():
        return 0
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])
    except FileNotFoundError:
        return 0


def _check_whole(folder: Path) -> list[Path]:
    """Every output in `folder` loads completely; returns the temp files found."""
    temps = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") and p.name.endswith(".tmp"):
            temps.append(p)
        elif p.suffix == ".pt":
            load_checkpoint(p)
        elif p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".yaml":
            assert isinstance(yaml.safe_load(p.read_text()), dict)
        else:
            raise AssertionError(f"unexpected file {p}")
    return temps


@pytest.mark.parametrize("ema", [0.0, 0.9], ids=["raw", "ema"])
def test_kill_mid_epoch_then_resume(tiny_workspace, tmp_path, ema):
    """The trainer kills itself (SIGKILL, PIPELINE_KILL_AT_STEP) after the first batch of
    epoch 2: deterministic, on a quiet or a busy machine alike. With the weights' moving
    average on, it resumes from last.pt too."""
    import math

    import pandas as pd

    from pipeline.core.faults import KILL_AT_STEP

    ws = tiny_workspace
    sets = SETS + [f"train.ema_decay={ema}"]
    out, live = tmp_path / "models", tmp_path / "live"
    fold = out / "fold0"
    last = fold / "last.pt"
    folds = pd.read_csv(ws / "folds.csv")
    steps_per_epoch = math.ceil((folds["fold"] != 0).sum() / 8)  # train.batch_size=8
    assert steps_per_epoch >= 2  # so that step steps_per_epoch + 1 is mid-epoch
    r = subprocess.run(_cmd(ws, out, live, "--no-resume", sets=sets), cwd=tmp_path,
                       env={**_env(), KILL_AT_STEP: str(steps_per_epoch + 1)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert "fold 0 epoch 1:" in r.stderr and "fold 0 epoch 2:" not in r.stderr
    ck = load_checkpoint(last)
    assert ck["epoch"] == 1 and ck["scheduler_step"] == steps_per_epoch

    done = _epoch_of(last)
    assert 1 <= done < EPOCHS
    assert not (fold / "metrics.json").exists()  # the killed run never finished
    left = _check_whole(fold)  # every output is whole; a killed writer's temp at most
    # a kill inside torch.save leaves such a temp: make sure there is one for the next run
    stale = fold / ".last.pt.k1lled00.tmp"
    stale.write_bytes(last.read_bytes()[:1000])
    (fold / ".metrics.json.k1lled01.tmp").write_text('{"fold": ')

    r = subprocess.run(_cmd(ws, out, live, "--resume", sets=sets), cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"fold 0: resuming from {last} at epoch {done}" in r.stderr, r.stderr[-3000:]
    assert f"fold 0 epoch {done}:" not in r.stderr  # the finished epochs are not trained again
    assert f"fold 0 epoch {done + 1}:" in r.stderr and f"fold 0 epoch {EPOCHS}:" in r.stderr
    assert "left by an interrupted run" in r.stderr

    assert _check_whole(fold) == [], "stale temp files were not cleaned"
    assert not stale.exists() and not any(p.exists() for p in left)
    final = load_checkpoint(last)
    assert final["epoch"] == EPOCHS
    assert [h["epoch"] for h in final["history"]] == list(range(1, EPOCHS + 1))
    metrics = json.loads((fold / "metrics.json").read_text())
    assert metrics["epochs"] == EPOCHS

    # bit for bit the run that was never interrupted (in this process, on one thread as
    # the subprocesses were)
    from pipeline.core.config import load_config
    from pipeline.stages.train import fit

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fit(load_config(None, sets), 0, ws / "cache", ws / "folds.csv", tmp_path / "ref", resume=False)
    finally:
        torch.set_num_threads(threads)
    want = load_checkpoint(tmp_path / "ref" / "fold0" / "last.pt")
    assert final["scheduler_step"] == want["scheduler_step"]
    for k, v in want["model"].items():
        assert torch.equal(final["model"][k], v), k
    for key in ("val_mae", "val_mae_ema", "weights") if ema > 0 else ("val_mae",):  # not the timings
        assert [h[key] for h in final["history"]] == [h[key] for h in want["history"]], key
    assert ("ema" in final) == (ema > 0)
    if ema > 0:
        assert final["ema"]["updates"] == want["ema"]["updates"] == final["scheduler_step"]
        for k, v in want["ema"]["model"].items():
            assert torch.equal(final["ema"]["model"][k], v), k


def test_stale_temps_of_other_names_are_kept(tmp_path):
    """remove_stale_temps deletes only the temps of the names it is given."""
    from pipeline.core.io import remove_stale_temps

    (tmp_path / ".last.pt.abc.tmp").write_bytes(b"x")
    (tmp_path / ".other.csv.abc.tmp").write_bytes(b"x")
    (tmp_path / "last.pt").write_bytes(b"keep")
    removed = remove_stale_temps(tmp_path, ["last.pt", "best.pt"])
    assert [p.name for p in removed] == [".last.pt.abc.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.csv.abc.tmp", "last.pt"]


@pytest.mark.parametrize("when", ["before_rename", "during_write"])
def test_atomic_write_interrupted_keeps_old_file(tmp_path, when):
    """An exception while writing (the in-process analogue of a kill) keeps the previous
    file byte for byte and removes the temp."""
    from pipeline.core.io import atomic_path, torch_save

    target = tmp_path / "last.pt"
    torch_save(target, {"epoch": 1})
    before = target.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            if when == "during_write":
                tmp.write_bytes(before[:10])
            raise KeyboardInterrupt
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_crop_killed_between_splits_keeps_the_old_cache(demo_dir, tiny_workspace, tmp_path):
    """SIGKILL after the train split is written (PIPELINE_KILL_AT=crop:train): the old
    cache stays whole (train and test of one run); the next crop removes the temp folder
    and writes both splits of one new run."""
    import json

    from pipeline.core.faults import KILL_AT

    cache = tmp_path / "cache"
    shutil.copytree(tiny_workspace / "cache", cache)
    before = _tree(cache)
    cmd = [sys.executable, "-m", "pipeline", "crop", "--out", str(cache), "--set", f"data.dir={demo_dir}",
           "--set", "crop.side=24", "--set", "crop.n_jobs=1"]
    r = subprocess.run(cmd, cwd=tmp_path, env={**_env(), KILL_AT: "crop:train"}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert _tree(cache) == before
    assert [p.name for p in tmp_path.glob(".cache.tmp-*")], "the kill should have left the temp folder"
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "left by an interrupted run" in r.stderr
    assert not list(tmp_path.glob(".cache.*")), list(tmp_path.glob(".cache.*"))
    info = {s: json.loads((cache / s / "info.json").read_text()) for s in ("train", "test")}
    assert info["train"]["size"] == info["test"]["size"] == 24 and info["train"]["run"] == info["test"]["run"]


def test_crop_full_disk_keeps_the_old_cache(demo_dir, tiny_workspace, tmp_path, monkeypatch, capsys):
    """ENOSPC while writing the test split: exit 2, one line naming the cache, old cache
    unchanged, no temp folder."""
    import errno

    import pipeline.formats.cache as cache_format
    from pipeline.cli import main

    cache = tmp_path / "cache"
    shutil.copytree(tiny_workspace / "cache", cache)
    before = _tree(cache)
    real = cache_format.write_npy

    def full(path, array):
        if Path(path).parent.name == "test":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, array)

    monkeypatch.setattr(cache_format, "write_npy", full)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["crop", "--out", str(cache), "--set", f"data.dir={demo_dir}", "--set", "crop.side=24",
              "--set", "crop.n_jobs=1"])
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and err == [f"error: {cache}: writing failed (No space left on device); left as it was"]
    assert _tree(cache) == before
    assert not list(tmp_path.glob(".cache.*"))
