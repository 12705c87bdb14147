"""`pipeline train-folds`: the folds trained side by side, each by the train stage's own
command, so that the train stages resume from finished checkpoints."""

from __future__ import annotations

import pytest

from pipeline.core.config import load_config
from pipeline.formats.checkpoint import load_checkpoint
from pipeline.stages.train import fit
from pipeline.tools.train_folds import FoldJob, pending_folds, plan_waves

from helpers import run_cli

TINY = ["crop.side=32", "model.input_size=32", "train.batch_size=8", "train.epochs=2", "train.warmup_epochs=1",
        "folds.k=2", "folds.train=[0,1]", "train.randaug_n=0", "train.device=cpu"]


def test_three_folds_on_two_cpus_run_two_at_one_thread_then_one_at_two():
    waves = plan_waves([0, 1, 2], [0, 1], 2)
    assert waves == [[FoldJob(0, (0,)), FoldJob(1, (1,))], [FoldJob(2, (0, 1))]]
    assert [[j.threads for j in w] for w in waves] == [[1, 1], [2]]


def test_waves_share_every_cpu_and_never_exceed_the_jobs():
    waves = plan_waves([0, 1, 2], list(range(16)), 16)
    assert len(waves) == 1 and [j.threads for j in waves[0]] == [6, 5, 5]
    assert sorted(c for j in waves[0] for c in j.cpus) == list(range(16))
    waves = plan_waves([0, 1, 2, 3, 4], [4, 5, 6, 7], 2)
    assert [[j.fold for j in w] for w in waves] == [[0, 1], [2, 3], [4]]
    assert waves[0][1].cpus == (6, 7) and waves[2][0].cpus == (4, 5, 6, 7)
    # more processes than CPUs: one thread each, unpinned, the OS shares the cores
    assert plan_waves([0, 1, 2], [0, 1], 3) == [[FoldJob(0, ()), FoldJob(1, ()), FoldJob(2, ())]]
    assert [j.threads for j in plan_waves([0, 1], [0], 4)[0]] == [1, 1]
    with pytest.raises(ValueError):
        plan_waves([0], [0, 1], 0)


def test_pending_folds_are_the_missing_the_unfinished_and_those_of_other_params(tiny_workspace, tmp_path,
                                                                                  monkeypatch):
    import pipeline.training.identity as setup_module

    ws = tiny_workspace
    cfg = load_config(None, TINY)
    out = tmp_path / "models"
    inputs = (ws / "cache", ws / "folds.csv")
    hashed = []  # the inputs' identity is the same for every fold: computed once, when needed
    identity = setup_module.training_identity
    monkeypatch.setattr(setup_module, "training_identity", lambda *a, **k: hashed.append(1) or identity(*a, **k))
    assert pending_folds(cfg, out, *inputs) == {0: 0, 1: 0}
    assert hashed == []  # no last.pt: nothing to compare
    fit(cfg, 0, ws / "cache", ws / "folds.csv", out, resume=False)
    fit(cfg, 1, ws / "cache", ws / "folds.csv", out, resume=False, max_epochs=1)
    hashed.clear()
    assert pending_folds(cfg, out, *inputs) == {1: 1}
    assert hashed == [1]  # two folds with a last.pt, one identity
    assert pending_folds(load_config(None, TINY + ["train.lr=0.05"]), out, *inputs) == {0: 0, 1: 0}
    # speed-only and runtime params train the same model: a finished fold stays finished
    assert pending_folds(load_config(None, TINY + ["train.num_workers=1"]), out, *inputs) == {1: 1}
    # other inputs than the checkpoints were made from (a missing folds file here): all pending
    assert pending_folds(cfg, out, ws / "cache", ws / "nosuch.csv") == {0: 0, 1: 0}


def test_train_folds_trains_each_fold_as_the_stage_would_resume_it(tiny_workspace, tmp_path, monkeypatch, capsys):
    """Two folds side by side from the command line; the train stage run afterwards (as
    `dvc repro` does) has nothing left to train and leaves last.pt as it was."""
    ws = tiny_workspace
    monkeypatch.chdir(tmp_path)  # no params.yaml here: defaults + --set, as the children see them
    args = [a for o in TINY for a in ("--set", o)]
    code, _, err = run_cli(["train-folds", "--jobs", "2", "--cache", ws / "cache", "--folds", ws / "folds.csv",
                            "--out", "models", *args], capsys)
    assert code == 0, err
    cfg = load_config(None, TINY)
    assert pending_folds(cfg, "models", ws / "cache", ws / "folds.csv") == {}
    for fold in (0, 1):
        assert load_checkpoint(tmp_path / "models" / f"fold{fold}" / "last.pt")["epoch"] == 2
        assert f"fold {fold} epoch 2:" in (tmp_path / "logs" / f"train-fold{fold}.log").read_text()
        assert (tmp_path / "dvclive" / f"fold{fold}").is_dir()
    before = (tmp_path / "models" / "fold1" / "last.pt").read_bytes()
    m = fit(cfg, 1, ws / "cache", ws / "folds.csv", "models", resume=True)
    assert m["epochs"] == 2 and (tmp_path / "models" / "fold1" / "last.pt").read_bytes() == before
    # everything trained: a second call starts nothing
    code, _, err = run_cli(["train-folds", "--cache", ws / "cache", "--folds", ws / "folds.csv", "--out", "models",
                            "--log-dir", "logs2", *args], capsys)
    assert code == 0, err
    assert not (tmp_path / "logs2").exists()


def test_a_failed_fold_stops_the_others_and_names_its_log(tiny_workspace, tmp_path, monkeypatch, capsys):
    """A child killed mid-run (PIPELINE_KILL_AT_STEP SIGKILLs every child at its 3rd step):
    a non-zero exit and one line naming the fold's log and how it ended."""
    ws = tiny_workspace
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PIPELINE_KILL_AT_STEP", "3")
    args = [a for o in TINY for a in ("--set", o)]
    code, _, err = run_cli(["train-folds", "--jobs", "2", "--cache", ws / "cache", "--folds", ws / "folds.csv",
                            "--out", "models", *args], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: logs/train-fold") and "failed (killed by SIGKILL)" in last, err
    assert set(pending_folds(load_config(None, TINY), "models", ws / "cache", ws / "folds.csv")) == {0, 1}


def test_one_job_leaves_the_folds_to_dvc_repro(tiny_workspace, tmp_path, monkeypatch, capsys):
    ws = tiny_workspace
    monkeypatch.chdir(tmp_path)
    args = [a for o in TINY for a in ("--set", o)]
    code, _, err = run_cli(["train-folds", "--jobs", "1", "--cache", ws / "cache", "--folds", ws / "folds.csv",
                            "--out", "models", *args], capsys)
    assert code == 0, err
    assert not (tmp_path / "models").exists() and not (tmp_path / "logs").exists()
    code, _, err = run_cli(["train-folds", "--jobs", "two", *args], capsys)
    assert code == 2 and "--jobs" in err
