import json

import pytest

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.stages.train import fit
from pipeline.tools.budget_plot import budget_plot, draw_chart, model_label, nice_ticks, parse_reference
from tests.helpers import check_picture, run_cli


@pytest.fixture(scope="module")
def two_runs(tiny_workspace, demo_dir, tmp_path_factory):
    """Two 1-epoch fold-0 runs of resunet-tiny, the second at width 0.75 for 2 epochs."""
    out = tmp_path_factory.mktemp("budget")
    base = [f"data.dir={demo_dir}", "crop.side=32", "model.input_size=32", "train.batch_size=16",
            "train.device=cpu", "folds.k=2", "folds.train=[0,1]"]
    runs = []
    for name, more in (("a", ["train.epochs=1"]), ("b", ["train.epochs=2", "model.options.width=0.75"])):
        fit(load_config(None, base + more), 0, tiny_workspace / "cache", tiny_workspace / "folds.csv",
            out / name, resume=False)
        runs.append(out / name / "fold0")
    return runs


def test_metrics_record_the_training_faces(two_runs, tiny_workspace):
    import pandas as pd

    folds = pd.read_csv(tiny_workspace / "folds.csv")
    metrics = json.loads((two_runs[0] / "metrics.json").read_text())
    assert metrics["train_faces"] == int((folds["fold"] != 0).sum())


def test_budget_plot_draws_one_line_per_model(two_runs, tmp_path):
    out = tmp_path / "plot.png"
    runs = budget_plot([str(p) for p in two_runs], str(out), ["dlib=5.41"], steps=1, rounds=1)
    check_picture(out)
    figures = json.loads(out.with_suffix(".json").read_text())
    assert figures["references"] == {"dlib": 5.41}
    assert [r["model"] for r in figures["runs"]] == [r.model for r in runs]
    assert runs[0].model != runs[1].model and "width=0.75" in runs[1].model
    for run in runs:  # minutes are the images trained at the timed pace
        assert run.images_per_s > 0
        assert run.minutes == pytest.approx(run.epochs * run.train_faces / run.images_per_s / 60)
    assert runs[1].epochs == 2


def test_budget_plot_refuses_a_run_without_figures(two_runs, tmp_path, capsys):
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "metrics.json").write_text(json.dumps({"epochs": 3, "val_nme": 0.1}))
    code, _, err = run_cli(["budget-plot", str(bad), "--out", str(tmp_path / "p.png")], capsys)
    assert code == 2 and "train_faces" in err and str(bad / "metrics.json") in err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("text", ["5.41", "dlib=", "=5", "dlib=x", "dlib=nan"])
def test_a_bad_reference_is_one_line(text):
    with pytest.raises(PipelineError, match="--reference"):
        parse_reference(text)


def test_reference_label_may_hold_an_equals_sign():
    assert parse_reference("dlib, k=68=5.41%") == ("dlib, k=68", 5.41)


@pytest.mark.parametrize("lo, hi", [(2.9, 3.6), (0.0, 34.7), (0.0, 30.0), (3.1, 5.6)])
def test_ticks_cover_the_range(lo, hi):
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 9


def test_chart_without_points_is_an_error():
    with pytest.raises(PipelineError, match="nothing to plot"):
        draw_chart({}, {"dlib": 5.0}, "t", "x", "y")


def test_model_label_names_only_the_options_that_differ():
    label = model_label({"preset": "resunet-tiny", "num_keypoints": 68, "input_size": 128,
                         "options": {"width": 1.0, "depths": [2, 2, 2, 2]}})
    assert label.startswith("resunet-tiny depths=[2,2,2,2] width=1.0, 128 px,") and "M params" in label
    assert model_label({"preset": "resunet-tiny", "num_keypoints": 68, "input_size": 96,
                        "options": {}}).startswith("resunet-tiny, 96 px")
