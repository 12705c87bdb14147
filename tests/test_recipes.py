"""Every recipe end to end at toy size: its model, training, TTA and submission settings run
through crop, folds, train, predict, submit and evaluate on a small demo set, so no recipe is
first run for real by a user. Only the sizes change: the data, the crop and input side, the
epochs, the folds and the devices."""

import json

import pytest

from helpers import REPO, run

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
TOY = ["crop.side=32", "crop.n_jobs=1", "model.input_size=32", "folds.k=2", "folds.train=[0,1]",
       "train.epochs=1", "train.batch_size=8", "train.val_every=1", "train.device=cpu", "train.num_workers=0",
       "predict.device=cpu", "predict.batch_size=16", "data.extra_train={}", "data.label_origin=0.0"]


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    from pipeline.synth.layout import generate_demo

    return generate_demo(tmp_path_factory.mktemp("recipe_data") / "demo", n_train=24, n_test=4, seed=3)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_runs_end_to_end_at_toy_size(recipe, toy_data, tmp_path):
    sets = [a for kv in [f"data.dir={toy_data}", *TOY, "submit.name=toy"] for a in ("--set", kv)]
    ws = tmp_path
    common = ["--params", str(recipe), *sets]
    assert run(["crop", "--out", str(ws / "cache"), *common]) == 0
    assert run(["folds", "--cache", str(ws / "cache"), "--out", str(ws / "folds.csv"), *common]) == 0
    paths = ["--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv")]
    for fold in (0, 1):
        assert run(["train", "--fold", str(fold), *paths, "--out", str(ws / "models"), "--live",
                    str(ws / "live" / str(fold)), *common]) == 0
    assert run(["predict", *paths, "--models", str(ws / "models"), "--out", str(ws / "pred"), *common]) == 0
    submission = ws / "toy.csv"
    assert run(["submit", "--cache", str(ws / "cache"), "--predictions", str(ws / "pred" / "test.npz"), "--out", str(submission),
                *common]) == 0
    assert run(["evaluate", *paths, "--predictions", str(ws / "pred"), "--out", str(ws / "metrics"),
                "--submission", str(submission), *common]) == 0
    oof = json.loads((ws / "metrics" / "oof.json").read_text())
    assert set(oof["per_fold"]) == {"0", "1"} and oof["overall"]["n"] == 24
    assert submission.read_text().startswith("Id,Predicted")
