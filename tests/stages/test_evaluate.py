import json

import numpy as np
import pytest

from pipeline.formats.submission import write_submission

from helpers import run_cli


def write_csv(path, values, header="Id,Predicted"):
    path.write_text(header + "\n" + "".join(f"{i},{v!r}\n" for i, v in enumerate(values)))
    return path


# ---------------------------------------------------------------- score

def test_score_agrees_with_numpy(tmp_path, capsys):
    rng = np.random.default_rng(3)
    truth = rng.uniform(0, 400, (5, 68, 2))
    pred = truth + rng.normal(0, 3, truth.shape)
    sol = write_csv(tmp_path / "sol.csv", truth.reshape(-1).tolist())
    sub = write_submission(tmp_path / "sub.csv", pred)
    # independent computation on the values actually written
    written = np.loadtxt(sub, delimiter=",", skiprows=1)
    want_mae = np.mean(np.abs(written[:, 1] - truth.reshape(-1)))
    p = written[:, 1].reshape(5, 68, 2)
    iod = np.linalg.norm(truth[:, 36] - truth[:, 45], axis=1)
    want_nme = np.mean(np.linalg.norm(p - truth, axis=2).mean(1) / iod)
    out_json = tmp_path / "score.json"
    code, out, err = run_cli(["score", str(sub), "--solution", str(sol), "--json", str(out_json)], capsys)
    assert code == 0, err
    res = json.loads(out_json.read_text())
    assert abs(res["mae"] - want_mae) < 1e-6
    assert abs(res["nme"] - want_nme) < 1e-9
    assert res["faces"] == 5 and res["k"] == 68 and res["rows"] == 680
    assert f"{want_mae:.6f}" in out and "NME" in out


def test_score_keypoints_option_and_no_nme(tmp_path, capsys):
    truth = np.zeros((2, 2, 2))
    truth[:, 1, 0] = 10.0
    pred = truth + 1.0
    sol = write_csv(tmp_path / "sol.csv", truth.reshape(-1).tolist())
    sub = write_csv(tmp_path / "sub.csv", pred.reshape(-1).tolist())
    j = tmp_path / "s.json"
    code, out, _ = run_cli(["score", str(sub), "--solution", str(sol), "--keypoints", "2", "--eyes", "0,1",
                            "--json", str(j)], capsys)
    assert code == 0
    res = json.loads(j.read_text())
    assert res["mae"] == 1.0 and res["nme"] == pytest.approx(np.sqrt(2) / 10)
    # 8 rows do not fit the default K=68: MAE only
    code, out, _ = run_cli(["score", str(sub), "--solution", str(sol), "--json", str(j)], capsys)
    assert code == 0 and "NME  n/a" in out and json.loads(j.read_text())["nme"] is None
    # an explicit K that does not divide the rows is an error
    code, _, err = run_cli(["score", str(sub), "--solution", str(sol), "--keypoints", "3"], capsys)
    assert code == 2 and "not a multiple" in err


GOOD_ROWS = [f"{i},{float(i)}" for i in range(8)]


@pytest.mark.parametrize("text, needle", [
    ("Id,Prediction\n" + "\n".join(GOOD_ROWS) + "\n", "wrong header"),
    ("Id,Predicted\n" + "\n".join(GOOD_ROWS[:3] + GOOD_ROWS[4:]) + "\n", "missing Id 3"),
    ("Id,Predicted\n" + "\n".join(GOOD_ROWS + ["5,1.0"]) + "\n", "duplicate Id 5"),
    ("Id,Predicted\n" + "\n".join(GOOD_ROWS[:6]) + "\n", "6 rows, expected 8"),
    ("Id,Predicted\n" + "\n".join(GOOD_ROWS + ["8,9.0"]) + "\n", "9 rows, expected 8"),
    ("Id,Predicted\n" + "\n".join(GOOD_ROWS[:7] + ["7,nan"]) + "\n", "non-finite"),
    ("Id,Predicted\n" + "\n".join(GOOD_ROWS[:7] + ["7,seven"]) + "\n", "non-numeric value"),
    ("Id,Predicted\n" + "\n".join(GOOD_ROWS[:7] + ["id7,7"]) + "\n", "non-numeric Id"),
    ("", "empty file"),
])
def test_score_rejects_malformed_submission(tmp_path, capsys, text, needle):
    sol = write_csv(tmp_path / "sol.csv", [float(i) for i in range(8)])
    sub = tmp_path / "bad_sub.csv"
    sub.write_text(text)
    code, out, err = run_cli(["score", str(sub), "--solution", str(sol)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(sub) in lines[0] and needle in lines[0], err


def test_score_rejects_malformed_solution_and_missing(tmp_path, capsys):
    sub = write_csv(tmp_path / "sub.csv", [1.0, 2.0])
    sol = tmp_path / "sol.csv"
    sol.write_text("Id,Expected\n0,1\n0,2\n")
    code, _, err = run_cli(["score", str(sub), "--solution", str(sol)], capsys)
    assert code == 2 and str(sol) in err and "duplicate Id 0" in err
    code, _, err = run_cli(["score", str(tmp_path / "none.csv"), "--solution", str(sub)], capsys)
    assert code == 2 and "none.csv: file not found" in err


def test_score_via_subprocess(tmp_path):
    import subprocess
    import sys

    sol = write_csv(tmp_path / "sol.csv", [0.0, 1.0])
    sub = write_csv(tmp_path / "sub.csv", [0.0, 1.0, 2.0])
    proc = subprocess.run([sys.executable, "-m", "pipeline", "score", str(sub), "--solution", str(sol)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {sub}: 3 rows, expected 2"


# ---------------------------------------------------------------- evaluate

@pytest.fixture
def layout(tmp_path, monkeypatch):
    """A tiny cache/folds/predictions/submission/solution layout with K=2, eyes (0, 1)."""
    monkeypatch.chdir(tmp_path)
    k = 2
    schema = {"name": "custom", "names": ["a", "b"], "flip": [1, 0], "eyes": [0, 1]}
    truth = np.zeros((5, k, 2))
    truth[:, 1, 0] = 10.0  # inter-ocular distance 10
    tta = truth.copy()
    plain = truth.copy()
    fold = np.array([0, 0, 1, 1, 2])
    tta[0, 0, 0] += 1.0    # fold 0: face errors (1/2, 0) px
    plain[0, 0, 0] += 2.0
    tta[2, :, 1] += 4.0    # fold 1: face errors (4, 0)
    plain[2, :, 1] += 4.0
    tta[4] = np.nan        # fold 2 not trained
    plain[4] = np.nan
    train = tmp_path / "data" / "cache" / "train"
    train.mkdir(parents=True)
    np.save(train / "keypoints_orig.npy", truth)
    (train / "info.json").write_text(json.dumps({"schema": schema}))
    (tmp_path / "folds").mkdir()
    (tmp_path / "folds" / "folds.csv").write_text(
        "index,face_id,group,fold\n" + "".join(f"{i},f{i},g{i},{f}\n" for i, f in enumerate(fold)))
    (tmp_path / "predictions").mkdir()
    np.savez(tmp_path / "predictions" / "oof.npz", tta=tta, plain=plain, fold=fold)
    # test set: 2 faces; the submission is off by 0.5 px in x everywhere
    test_truth = np.array([[[0.0, 0.0], [20.0, 0.0]], [[5.0, 5.0], [10.0, 5.0]]])
    (tmp_path / "data" / "demo").mkdir(parents=True)
    write_csv(tmp_path / "data" / "demo" / "solution.csv", test_truth.reshape(-1).tolist())
    sub = test_truth.copy()
    sub[..., 0] += 0.5
    write_submission(tmp_path / "submissions" / "submission.csv", sub)
    (tmp_path / "params.yaml").write_text("data:\n  dir: data/demo\n  schema: custom\n"
                                          "  custom_schema: {names: [a, b], flip: [1, 0], eyes: [0, 1]}\n")
    return tmp_path


def test_evaluate_numbers(layout, capsys):
    code, out, err = run_cli(["evaluate"], capsys)
    assert code == 0, err
    oof = json.loads((layout / "metrics" / "oof.json").read_text())
    f0, f1 = oof["per_fold"]["0"], oof["per_fold"]["1"]
    assert set(oof["per_fold"]) == {"0", "1"}
    assert f0["n"] == 2 and f0["skipped"] == 0
    assert f0["mae"] == pytest.approx(1.0 / 8)
    assert f0["mae_notta"] == pytest.approx(2.0 / 8)
    assert f0["nme"] == pytest.approx(((1.0 / 2) / 10 + 0) / 2)
    assert f0["nme_notta"] == pytest.approx(((2.0 / 2) / 10) / 2)
    assert f1["mae"] == pytest.approx(8.0 / 8) and f1["nme"] == pytest.approx((4 / 10) / 2)
    ov = oof["overall"]
    assert ov["n"] == 4 and ov["skipped"] == 1 and ov["untrained_folds"] == [2]
    assert ov["mae"] == pytest.approx(9.0 / 16)
    assert ov["nme"] == pytest.approx((0.05 + 0 + 0.4 + 0) / 4)
    test = json.loads((layout / "metrics" / "test.json").read_text())
    assert test["n"] == 2 and test["mae"] == pytest.approx(0.25)
    assert test["nme"] == pytest.approx((0.5 / 20 + 0.5 / 5) / 2)
    summary = json.loads((layout / "metrics" / "summary.json").read_text())
    assert summary["mae"] == pytest.approx(9.0 / 16) and summary["test_mae"] == pytest.approx(0.25)
    assert summary["test_nme"] == pytest.approx(test["nme"]) and summary["nme"] == pytest.approx(ov["nme"])
    # the leaderboard row: overall and per trained fold, short names, no entry for untrained fold 2
    assert summary["mae_f0"] == pytest.approx(f0["mae"]) and summary["nme_f1"] == pytest.approx(f1["nme"])
    assert not {"mae_f2", "nme_f2"} & set(summary)
    # per-keypoint OOF bias over the 4 predicted faces: point a is off by (+1/4, 0) (face 0)
    # and (0, +4/4) (face 2), point b by (0, +1); the leave-one-out calibrated MAE of face i
    # subtracts the other three faces' mean residual
    bias = json.loads((layout / "metrics" / "bias.json").read_text())
    assert bias["n"] == 4 and bias["per_keypoint"] == {"a": [0.25, 1.0], "b": [0.0, 1.0]}
    truth = np.load(layout / "data" / "cache" / "train" / "keypoints_orig.npy")[:4]
    pred = np.load(layout / "predictions" / "oof.npz")["tta"][:4]
    resid = pred - truth
    loo = (resid.sum(0) - resid) / 3
    assert summary["mae_cal"] == pytest.approx(np.abs(resid - loo).mean())
    assert (layout / "metrics" / "params.resolved.yaml").exists()
    hist = (layout / "metrics" / "history.jsonl").read_text().splitlines()
    assert len(hist) == 1
    entry = json.loads(hist[0])
    assert entry["summary"] == summary and entry["params"]["train.lr"] == 1e-3
    assert not [p for p in (layout / "metrics").iterdir() if p.name.endswith(".tmp")]

    # a second run appends, and the leaderboard shows folds sorted by MAE and both runs
    code, _, err = run_cli(["evaluate", "--set", "train.lr=0.5"], capsys)
    assert code == 0, err
    assert len((layout / "metrics" / "history.jsonl").read_text().splitlines()) == 2
    code, out, err = run_cli(["leaderboard", "--no-exps"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["fold", "n"])
    folds = [lines[header + 2].split()[0], lines[header + 3].split()[0]]
    assert folds == ["0", "1"]  # fold 0 (MAE 0.125) before fold 1 (MAE 1.0)
    assert "0.1250" in lines[header + 2] and "1.0000" in lines[header + 3]
    assert "untrained folds [2]" in out
    runs = next(i for i, line in enumerate(lines) if line.startswith("source"))
    assert "train.lr" in lines[runs]  # the one param that differs
    assert "data.dir" not in lines[runs]


def test_evaluate_reorders_folds_by_mae(layout, capsys):
    # make fold 1 the better one: leaderboard order flips
    z = dict(np.load(layout / "predictions" / "oof.npz"))
    z["tta"][0, 0, 0] += 100.0
    np.savez(layout / "predictions" / "oof.npz", **z)
    assert run_cli(["evaluate"], capsys)[0] == 0
    code, out, _ = run_cli(["leaderboard", "--no-exps"], capsys)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["fold", "n"])
    assert [lines[header + 2].split()[0], lines[header + 3].split()[0]] == ["1", "0"]


def test_evaluate_without_solution_and_bad_inputs(layout, capsys):
    (layout / "data" / "demo" / "solution.csv").unlink()
    assert run_cli(["evaluate"], capsys)[0] == 0
    test = json.loads((layout / "metrics" / "test.json").read_text())
    assert test["mae"] is None and test["n"] == 0
    # folds.csv that disagrees with the predictions
    (layout / "folds" / "folds.csv").write_text("index,face_id,group,fold\n0,a,a,0\n")
    code, _, err = run_cli(["evaluate"], capsys)
    assert code == 2 and "folds differ" in err
    (layout / "folds" / "folds.csv").unlink()
    (layout / "predictions" / "oof.npz").unlink()
    code, _, err = run_cli(["evaluate"], capsys)
    assert code == 2 and "oof.npz" in err and len(err.strip().splitlines()) == 1


def test_evaluate_rejects_bad_submission(layout, capsys):
    (layout / "submissions" / "submission.csv").write_text("Id,Predicted\n0,1\n")
    code, _, err = run_cli(["evaluate"], capsys)
    assert code == 2 and "submission.csv: 1 rows, expected 8" in err
