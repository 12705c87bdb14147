"""`pipeline blend`: the weight fit, its honesty (out-of-fold weights), input checks and the
command end to end on tiny prediction folders (and on two DVC experiments)."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.formats.cache import read_array, read_meta
from pipeline.formats.predictions import read_predictions, write_oof_predictions, write_test_predictions
from pipeline.formats.submission import read_solution, read_submission
from pipeline.keypoints.schema import IBUG68
from pipeline.tools.blend import (
    apply_weights,
    blend_in_folds,
    fit_keypoint_weights,
    fit_weights,
    group_index,
    simplex_lstsq,
)

from helpers import REPO, git_dvc_project, run_cli


def _grid(m, steps):
    """Every point of the simplex in R^m on a grid of 1/steps."""
    if m == 1:
        return [np.array([1.0])]
    return [np.concatenate([[i / steps], rest * (1 - i / steps)]) for i in range(steps + 1)
            for rest in (_grid(m - 1, steps) if i < steps else [np.eye(m - 1)[0]])]


def test_fit_reaches_the_mae_optimum_of_a_brute_force_search():
    rng = np.random.default_rng(0)
    y = rng.normal(0, 10, 4000)
    # three inputs: small Gaussian noise, heavy-tailed noise, and a biased one
    x = np.stack([y + rng.normal(0, 1, 4000), y + rng.standard_t(1.5, 4000), y + 0.8 + rng.normal(0, 0.5, 4000)], 1)
    w = fit_weights(x, y)
    assert w.min() >= 0 and abs(w.sum() - 1) < 1e-12
    fit_mae = np.abs(x @ w - y).mean()
    grid_mae = min(np.abs(x @ g - y).mean() for g in _grid(3, 100))
    assert fit_mae <= grid_mae + 1e-9
    assert all(fit_mae <= np.abs(x[:, i] - y).mean() for i in range(3))  # no worse than any single input
    # least squares is the start, and a different answer: the MAE fit is what the metric wants
    l2 = simplex_lstsq(x, y)
    assert np.abs(x @ l2 - y).mean() > fit_mae
    assert ((x @ l2 - y) ** 2).mean() <= min(((x @ g - y) ** 2).mean() for g in _grid(3, 100)) + 1e-9


def test_identical_inputs_do_not_break_the_fit():
    y = np.linspace(0, 1, 50)
    x = np.stack([y + 0.1, y + 0.1, y - 0.3], 1)
    w = fit_weights(x, y)
    assert abs(w.sum() - 1) < 1e-12 and w.min() >= 0
    assert np.abs(x @ w - y).mean() < 1e-6  # 3/4 on the two copies, 1/4 on the third


def test_groups_cover_every_keypoint():
    g = group_index(IBUG68.groups, 68)
    assert sorted(np.concatenate(list(g.values())).tolist()) == list(range(68))
    assert list(group_index({"a": (0, 1)}, 4)) == ["a", "other"]
    assert list(group_index(None, 4)) == ["all"]


def _noisy(truth, sigma, seed):
    return truth + np.random.default_rng(seed).normal(0, sigma, truth.shape)


def test_the_weight_goes_to_the_good_model():
    truth = np.random.default_rng(1).uniform(0, 100, (60, 5, 2))
    preds = np.stack([_noisy(truth, 1, 2), _noisy(truth, 8, 3)])
    fold = np.arange(60) % 3
    honest, weights, _ = blend_in_folds(preds, truth, fold, np.ones(60, bool), {"all": np.arange(5)})
    for w in weights.values():
        assert w[0, 0] > 0.9 and np.allclose(w.sum(0), 1)
    good, bad = (np.abs(p - truth).mean() for p in preds)
    assert np.abs(honest - truth).mean() < min(bad, 1.01 * good)


def test_a_fold_is_blended_with_weights_fitted_without_its_faces():
    """Fold 0's faces are scored with weights fitted on fold 1 only: changing what the
    inputs predict for fold 0 leaves fold 0's weights as they were (and moves fold 1's)."""
    truth = np.random.default_rng(4).uniform(0, 100, (40, 3, 2))
    preds = np.stack([_noisy(truth, 1, 5), _noisy(truth, 3, 6)])
    fold, valid, groups = np.arange(40) % 2, np.ones(40, bool), {"all": np.arange(3)}
    _, w1, _ = blend_in_folds(preds, truth, fold, valid, groups)
    changed = preds.copy()
    changed[0, fold == 0] = _noisy(truth[fold == 0], 20, 7)  # input 0 is now bad on fold 0's faces
    _, w2, _ = blend_in_folds(changed, truth, fold, valid, groups)
    np.testing.assert_array_equal(w1[0], w2[0])
    assert w2[1][0, 0] < w1[1][0, 0] - 0.3


def test_the_blend_cannot_win_by_fitting_the_faces_it_scores():
    """Input 0 is right on fold 0 and wrong on fold 1, input 1 the opposite. Weights fitted
    in sample find a mix that looks better than either input; fitted out of fold, each
    fold gets the input that was right on the *other* fold, the wrong one."""
    truth = np.random.default_rng(8).uniform(0, 100, (40, 4, 2))
    fold = np.arange(40) % 2
    a, b = _noisy(truth, 0.5, 9), _noisy(truth, 0.5, 10)
    a[fold == 1] += 6
    b[fold == 0] -= 6
    preds, groups = np.stack([a, b]), {"all": np.arange(4)}
    honest, weights, _ = blend_in_folds(preds, truth, fold, np.ones(40, bool), groups)
    assert weights[0][1, 0] > 0.95 and weights[1][0, 0] > 0.95  # each fitted where the other is right
    in_sample = apply_weights(preds, fit_keypoint_weights(preds, truth, groups))

    def mae(p):
        return np.abs(p - truth).mean()

    assert mae(in_sample) < min(mae(a), mae(b)) < mae(honest)


# ------------------------------------------------------------------ the command on prediction folders

def write_input(folder: Path, cache: Path, sigma: float, seed: int, solution=None, n_folds=4, **over):
    """A predictions folder of the cache's faces: truth + Gaussian noise of `sigma` px (the
    test predictions are the test truth + noise when `solution` is given, else noise
    around the training mean)."""
    truth = read_array(cache / "train", "keypoints_orig")
    ids = read_meta(cache / "train")["face_id"].astype(str).tolist()
    test_ids = read_meta(cache / "test")["face_id"].astype(str).tolist()
    names = over.pop("keypoint_names", IBUG68.names)
    rng = np.random.default_rng(seed)
    oof = truth + rng.normal(0, sigma, truth.shape)
    base = solution if solution is not None else np.broadcast_to(truth.mean(0), (len(test_ids), *truth.shape[1:]))
    test = base + rng.normal(0, sigma, base.shape)
    arrays = dict(fold=np.arange(len(truth)) % n_folds, face_id=ids, test_face_id=test_ids)
    arrays.update(over)
    write_oof_predictions(folder / "oof.npz", tta=oof, plain=oof + 0.1, fold=arrays["fold"],
                          face_id=arrays["face_id"], keypoint_names=names)
    write_test_predictions(folder / "test.npz", ensemble=test, ensemble_raw=test, per_fold=test[None], folds=[0],
                           bias=np.zeros(truth.shape[1:]), calibrated=False, oof_kind="tta",
                           face_id=arrays["test_face_id"], keypoint_names=names)
    return folder


@pytest.fixture
def solution(tiny_workspace, demo_dir):
    n = len(read_meta(tiny_workspace / "cache" / "test"))
    return read_solution(demo_dir / "solution.csv").reshape(n, 68, 2)


def test_blend_command_end_to_end(tmp_path, tiny_workspace, demo_dir, solution, capsys):
    cache = tiny_workspace / "cache"
    good = write_input(tmp_path / "good" / "predictions", cache, 1.0, 0, solution)
    write_input(tmp_path / "bad", cache, 6.0, 1, solution)
    out = tmp_path / "out"
    code, stdout, err = run_cli(["blend", tmp_path / "good", tmp_path / "bad", "--cache", cache, "--out", out,
                                 "--solution", demo_dir / "solution.csv", "--calibrate", "off"], capsys)
    assert code == 0, err
    report = json.loads((out / "blend.json").read_text())
    w = report["weights"]["all"]
    assert w[0] > 0.9 and abs(sum(w) - 1) < 1e-9
    scores = report["scores"]
    honest = scores["blend (OOF weights fitted out of fold)"]
    assert honest["mae"] < scores[str(tmp_path / "bad")]["mae"]
    assert honest["test_mae"] < scores[str(tmp_path / "bad")]["test_mae"]
    for name in (str(tmp_path / "good"), str(tmp_path / "bad"), "blend (OOF weights"):
        assert name in stdout
    # the outputs: a valid CSV of the test faces and predictions another blend or evaluate can read
    n_test = len(solution)
    csv = read_submission(out / "submission.csv", n_rows=n_test * 68 * 2).reshape(n_test, 68, 2)
    test = read_predictions(out / "predictions" / "test.npz", ("ensemble", "face_id"))
    np.testing.assert_allclose(csv, test["ensemble"], atol=1e-6)
    oof = read_predictions(out / "predictions" / "oof.npz", ("tta", "plain", "fold"))
    assert np.isfinite(oof["tta"]).all()
    np.testing.assert_allclose(oof["tta"], read_predictions(good / "oof.npz", ("tta",))["tta"] * w[0]
                               + read_predictions(tmp_path / "bad" / "oof.npz", ("tta",))["tta"] * w[1], atol=0.5)
    code, _, err = run_cli(["blend", out, tmp_path / "bad", "--cache", cache, "--out", tmp_path / "again",
                            "--per-group"], capsys)
    assert code == 0, err
    groups = json.loads((tmp_path / "again" / "blend.json").read_text())["weights"]
    assert set(groups) == set(IBUG68.groups)


def write_calibrated_input(folder: Path, cache: Path, offset: float, seed: int) -> dict:
    """A predictions folder as `pipeline predict` writes it with calibration on: OOF and test
    predictions off by `offset` px (plus noise), `ensemble` = `ensemble_raw` - the OOF bias."""
    from pipeline.keypoints.calibrate import keypoint_bias

    truth = read_array(cache / "train", "keypoints_orig").astype(np.float64)
    ids = read_meta(cache / "train")["face_id"].astype(str).tolist()
    test_ids = read_meta(cache / "test")["face_id"].astype(str).tolist()
    rng = np.random.default_rng(seed)
    oof = truth + offset + rng.normal(0, 1, truth.shape)
    raw = truth.mean(0) + offset + rng.normal(0, 1, (len(test_ids), *truth.shape[1:]))
    bias = keypoint_bias(oof, truth)
    folder.mkdir(parents=True)
    write_oof_predictions(folder / "oof.npz", tta=oof, plain=oof, fold=np.arange(len(truth)) % 2, face_id=ids,
                          keypoint_names=IBUG68.names)
    write_test_predictions(folder / "test.npz", ensemble=raw - bias, ensemble_raw=raw, per_fold=raw[None], folds=[0],
                           bias=bias, calibrated=True, oof_kind="tta", face_id=test_ids, keypoint_names=IBUG68.names)
    return {"raw": raw, "calibrated": raw - bias, "bias": bias}


@pytest.mark.parametrize("calibrate", ["on", "off"])
def test_a_blend_that_keeps_one_input_gives_its_predictions(tmp_path, tiny_workspace, calibrate, capsys):
    """The blend starts from each input's uncalibrated fold ensemble (`ensemble_raw`), as its
    weights and its own bias are fitted on uncalibrated OOF predictions: a blend whose weights
    all go to one input gives that input's raw predictions with --calibrate off and its
    calibrated ones (the same OOF bias subtracted once) with --calibrate on."""
    cache = tiny_workspace / "cache"
    good = write_calibrated_input(tmp_path / "good", cache, 3.0, 0)
    write_calibrated_input(tmp_path / "far", cache, 40.0, 1)  # off the same way, further: weight 0
    out = tmp_path / "out"
    code, _, err = run_cli(["blend", tmp_path / "good", tmp_path / "far", "--cache", cache, "--out", out,
                            "--calibrate", calibrate], capsys)
    assert code == 0, err
    assert json.loads((out / "blend.json").read_text())["weights"]["all"] == [1.0, 0.0]
    test = read_predictions(out / "predictions" / "test.npz", ("ensemble", "ensemble_raw", "bias", "calibrated"))
    np.testing.assert_array_equal(test["ensemble_raw"], good["raw"])
    np.testing.assert_array_equal(test["bias"], good["bias"])
    assert bool(test["calibrated"]) == (calibrate == "on")
    np.testing.assert_array_equal(test["ensemble"], good["calibrated"] if calibrate == "on" else good["raw"])


@pytest.mark.parametrize("change, blamed", [
    ({"face_id": "shuffled"}, "face_id differ from the train"),
    ({"test_face_id": "shuffled"}, "test face_id differ from the test"),
    ({"keypoint_names": [f"p{i}" for i in range(68)]}, "keypoint_names differ"),
    ({"fold": "short"}, "shape"),
])
def test_mismatched_inputs_give_one_line_and_exit_2(tmp_path, tiny_workspace, change, blamed, capsys):
    cache = tiny_workspace / "cache"
    write_input(tmp_path / "a", cache, 1.0, 0)
    over = {}
    for key, value in change.items():
        if value == "shuffled":
            ids = read_meta(cache / ("test" if key.startswith("test") else "train"))["face_id"].astype(str).tolist()
            over[key] = ids[::-1]
        elif value == "short":
            over["fold"] = None
        else:
            over[key] = value
    if over.get("fold", 0) is None:  # a different data set: fewer faces than the cache
        write_input(tmp_path / "b", cache, 1.0, 1)
        z = dict(np.load(tmp_path / "b" / "oof.npz"))
        z.update(tta=z["tta"][:-1], plain=z["plain"][:-1], fold=z["fold"][:-1], face_id=z["face_id"][:-1])
        np.savez(tmp_path / "b" / "oof.npz", **z)
    else:
        write_input(tmp_path / "b", cache, 1.0, 1, **over)
    code, _, err = run_cli(["blend", tmp_path / "a", tmp_path / "b", "--cache", cache, "--out", tmp_path / "o"],
                             capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {tmp_path / 'b'}") and blamed in err, err
    assert not (tmp_path / "o").exists()


def test_an_unknown_input_is_one_line(tmp_path, tiny_workspace, capsys):
    write_input(tmp_path / "a", tiny_workspace / "cache", 1.0, 0)
    os.chdir(tmp_path)  # no DVC repository here: the name is neither a folder nor an experiment
    try:
        code, _, err = run_cli(["blend", tmp_path / "a", "no-such-exp", "--cache", tiny_workspace / "cache"], capsys)
    finally:
        os.chdir(REPO)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: no-such-exp: "), err


# ------------------------------------------------------------------ DVC experiments as inputs

def test_blend_two_dvc_experiments(tmp_path, tiny_workspace, capsys):
    """Two `dvc exp run` experiments whose predictions/ is a DVC-cached output (as in
    dvc.yaml) are blended by name."""
    dvc = Path(sys.executable).parent / "dvc"
    if not dvc.exists() or shutil.which("git") is None:
        pytest.skip("dvc or git is not installed")
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copytree(tiny_workspace / "cache", root / "cache")
    (root / "make.py").write_text(
        "import sys, yaml\nfrom pathlib import Path\nsys.path[:0] = %r\nfrom test_blend import write_input\n"
        "p = yaml.safe_load(open('params.yaml'))\n(Path('predictions')).mkdir(exist_ok=True)\n"
        "write_input(Path('predictions'), Path('cache'), p['sigma'], p['seed'])\n" % [str(Path(__file__).parent), str(REPO / "tests")])
    (root / "params.yaml").write_text("sigma: 1.0\nseed: 0\n")
    (root / "dvc.yaml").write_text("stages:\n  predict:\n    cmd: python make.py\n    deps: [make.py]\n"
                                   "    params: [sigma, seed]\n    outs: [predictions]\n")
    (root / ".gitignore").write_text("/cache\n")
    env = {**os.environ, "PATH": f"{dvc.parent}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
           "PYTHONPATH": str(REPO)}
    sh = git_dvc_project(root, env, dvc, "tiny", timeout=300)
    sh(dvc, "exp", "run", "-q", "-n", "good", "-S", "sigma=1.0", "-S", "seed=1")
    sh(dvc, "exp", "run", "-q", "-n", "bad", "-S", "sigma=6.0", "-S", "seed=2")
    out = sh(sys.executable, "-m", "pipeline", "blend", "good", "bad", "--cache", "cache", "--out", "blended")
    report = json.loads((root / "blended" / "blend.json").read_text())
    assert report["inputs"] == ["good", "bad"] and report["weights"]["all"][0] > 0.9, out
    assert (root / "blended" / "submission.csv").exists()
