"""DDP on CPU: `torchrun --nproc-per-node 2 -m pipeline train` with gloo trains one fold,
rank 0 alone writes the outputs, and train.batch_size stays the global batch."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.formats.checkpoint import load_checkpoint

from helpers import REPO

TORCHRUN = Path(sys.executable).with_name("torchrun")
SETS = ["crop.side=32", "model.input_size=32", "train.batch_size=8", "train.epochs=2", "folds.k=2",
        "folds.train=[0,1]", "train.randaug_n=1", "train.device=cpu"]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not in the venv")
def test_torchrun_two_cpu_processes(tiny_workspace, tmp_path):
    ws = tiny_workspace
    n_train = sum(1 for line in (ws / "folds.csv").read_text().splitlines()[1:] if not line.endswith(",0"))
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "pipeline", "train", "--fold", "0",
           "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--out", str(tmp_path / "models"),
           "--live", str(tmp_path / "live"), "--no-resume"]
    for s in SETS:
        cmd += ["--set", s]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

    fold = tmp_path / "models" / "fold0"
    # rank 0 only: exactly these files, no temp files, no second rank's folder
    assert sorted(p.name for p in fold.iterdir()) == ["best.pt", "last.pt", "metrics.json",
                                                      "params.resolved.yaml"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["fold0"]
    last = load_checkpoint(fold / "last.pt")
    best = load_checkpoint(fold / "best.pt")
    assert last["epoch"] == 2 and 1 <= best["epoch"] <= 2
    assert [row["epoch"] for row in last["history"]] == [1, 2]  # one row per epoch: written once
    # the saved weights are the plain model's (no DDP 'module.' prefix)
    assert not any(k.startswith("module.") for k in last["model"])

    # train.batch_size is the global batch: 2 ranks x 4 take as many optimizer steps
    # as 1 process x 8 would (2 x 8 per step would halve them, 2 x 8 per rank as well)
    assert last["scheduler_step"] == 2 * math.ceil(n_train / 8)

    metrics = json.loads((fold / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and math.isfinite(metrics["val_mae"]) and metrics["val_mae"] > 0
    # DVCLive logged each epoch once (a second writer would double the rows)
    rows = (tmp_path / "live" / "plots" / "metrics" / "val_mae.tsv").read_text().splitlines()
    assert len(rows) == 1 + 2, rows

    # only rank 0 reports progress: every epoch line appears once
    out = r.stdout + r.stderr
    assert out.count("fold 0 epoch 1:") == 1 and out.count("fold 0 epoch 2:") == 1, out[-3000:]

    # 2 processes trained it: one process would train another model (each rank's batch, the
    # sampler's padding), so it does not take this fold as trained
    from pipeline.core.config import load_config
    from pipeline.training.identity import trained_epochs

    assert trained_epochs(fold, load_config(None, SETS), ws / "cache", ws / "folds.csv") == 0


def test_batch_not_divisible_by_ranks_is_an_error(tiny_workspace, tmp_path, monkeypatch):
    """train.batch_size must split evenly across the ranks (checked before anything is
    written; as 2 real ranks would see it, without paying for a torchrun start)."""
    import pipeline.stages.train as train
    from pipeline.core.config import load_config
    from pipeline.core.errors import PipelineError

    monkeypatch.setattr(train, "init_distributed", lambda device: (0, 2, "cpu"))
    ws = tiny_workspace
    cfg = load_config(None, SETS + ["train.batch_size=7"])
    with pytest.raises(PipelineError, match="train.batch_size 7 is not divisible by the 2 DDP processes"):
        train.fit(cfg, 0, ws / "cache", ws / "folds.csv", tmp_path / "models", resume=False)
    assert not (tmp_path / "models").exists()


def test_epoch_sampler_shards_cover_the_epoch():
    """Each rank takes every world-th index of one permutation: together the ranks see each
    face once (padded to equal lengths), and the shards do not depend on the rank count's order."""
    from pipeline.training.loader import EpochSampler

    n, world = 23, 2
    shards = []
    for rank in range(world):
        s = EpochSampler(n, seed=5, rank=rank, world=world)
        s.set_epoch(3)
        shards.append(list(s))
    assert len(shards[0]) == len(shards[1]) == math.ceil(n / world)
    assert set(shards[0]) | set(shards[1]) == set(range(n))
    single = EpochSampler(n, seed=5)
    single.set_epoch(3)
    merged = [i for pair in zip(*shards) for i in pair][:n]
    assert merged == list(single)  # the same permutation as one process, interleaved
