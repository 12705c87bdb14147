import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import DEFAULTS
from pipeline.formats.submission import (
    format_submission,
    read_solution,
    read_submission,
    write_submission,
)

from helpers import run_cli


def test_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    coords = rng.uniform(0, 500, size=(7, 68, 2))
    p = write_submission(tmp_path / "s.csv", coords)
    vals = read_submission(p, n_rows=7 * 68 * 2)
    np.testing.assert_allclose(vals.reshape(7, 68, 2), coords, atol=5e-7)
    assert p.read_text().splitlines()[0] == "Id,Predicted"


def test_id_order_image_major_keypoint_major_x_then_y(tmp_path):
    n, k = 3, 5
    coords = np.zeros((n, k, 2))
    for i in range(n):
        for j in range(k):
            coords[i, j] = (1000 * i + 10 * j, 1000 * i + 10 * j + 1)
    p = write_submission(tmp_path / "s.csv", coords)
    rows = [line.split(",") for line in p.read_text().splitlines()[1:]]
    assert len(rows) == n * k * 2
    ids = [int(r[0]) for r in rows]
    vals = {int(r[0]): float(r[1]) for r in rows}
    assert ids == list(range(n * k * 2))
    assert vals[0] == 0.0            # face 0 point 0 x
    assert vals[1] == 1.0            # face 0 point 0 y
    assert vals[2] == 10.0           # face 0 point 1 x
    assert vals[2 * k] == 1000.0     # face 1 point 0 x
    assert vals[2 * k + 1] == 1001.0  # face 1 point 0 y
    assert vals[(2 * k + 3) * 2 + 1] == 2031.0  # face 2 point 3 y


def test_reader_sorts_by_id(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("Id,Predicted\n2,30\n0,10.5\n1,20\n3,-4e1\n")
    np.testing.assert_array_equal(read_submission(p), [10.5, 20, 30, -40])


@pytest.mark.parametrize("coords, needle", [
    (np.full((2, 3, 2), np.nan), "non-finite"),
    (np.array([[[1.0, np.inf]]]), "non-finite"),
    (np.zeros((2, 3)), "shape"),
    (np.zeros((2, 3, 3)), "shape"),
    (np.zeros((0, 3, 2)), "shape"),
])
def test_write_rejects_and_leaves_nothing(tmp_path, coords, needle):
    target = tmp_path / "sub" / "s.csv"
    target.parent.mkdir()
    with pytest.raises(PipelineError, match=needle) as e:
        write_submission(target, coords)
    assert str(target) in str(e.value)
    assert list(target.parent.iterdir()) == []


def test_write_rejects_wrong_face_count_keeps_old_file(tmp_path):
    target = tmp_path / "s.csv"
    write_submission(target, np.ones((2, 1, 2)))
    before = target.read_text()
    with pytest.raises(PipelineError, match="expected 3"):
        write_submission(target, np.ones((2, 1, 2)), n_faces=3)
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv"]


GOOD = "Id,Predicted\n0,1.0\n1,2.0\n2,3.0\n3,4.0\n"


@pytest.mark.parametrize("text, needle", [
    ("", "empty file"),
    ("\n\n", "empty file"),
    ("Id,Predicted\n", "no data rows"),
    ("Id,Value\n0,1\n", "wrong header"),
    ("Id,Predicted,Usage\n0,1,Public\n", "wrong header"),
    ("0,1.0\n1,2.0\n", "wrong header"),
    ("Id,Predicted\n0,1.0\n1,2.0\n3,4.0\n", "missing Id 2"),
    ("Id,Predicted\n1,1.0\n2,2.0\n", "missing Id 0"),
    ("Id,Predicted\n0,1.0\n1,2.0\n1,3.0\n", "duplicate Id 1 (lines 3 and 4)"),
    ("Id,Predicted\n0,1.0\nx,2.0\n", "line 3: non-numeric Id"),
    ("Id,Predicted\n0,1.0\n1.5,2.0\n", "non-numeric Id"),
    ("Id,Predicted\n0,1.0\n1,abc\n", "line 3: non-numeric value 'abc'"),
    ("Id,Predicted\n0,1.0\n1,\n", "non-numeric value"),
    ("Id,Predicted\n0,1_0\n", "non-numeric value"),
    ("Id,Predicted\n0,nan\n", "non-finite"),
    ("Id,Predicted\n0,-inf\n", "non-finite"),
    ("Id,Predicted\n0,1e999\n", "inf"),
    ("Id,Predicted\n0,1.0,5\n", "expected 2 fields"),
    ("Id,Predicted\n-1,1.0\n0,2\n", "negative Id"),
])
def test_reader_rejects(tmp_path, text, needle):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(PipelineError) as e:
        read_submission(p)
    msg = e.value.format()
    assert needle in msg
    assert msg.startswith(str(p)) and "\n" not in msg


def test_reader_row_count_and_missing_file(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text(GOOD)
    assert len(read_submission(p, n_rows=4)) == 4
    with pytest.raises(PipelineError, match="4 rows, expected 6"):
        read_submission(p, n_rows=6)
    with pytest.raises(PipelineError, match="file not found"):
        read_submission(tmp_path / "nope.csv")


def test_solution_reader_accepts_expected_and_usage(tmp_path):
    p = tmp_path / "sol.csv"
    p.write_text("Id,Expected,Usage\n1,2.5,Private\n0,1.5,Public\n")
    np.testing.assert_array_equal(read_solution(p), [1.5, 2.5])


def test_format_is_precise():
    text = format_submission(np.array([[[123.4567891, -0.25]]]))
    assert text == "Id,Predicted\n0,123.456789\n1,-0.250000\n"


def test_submit_cmd_from_predictions(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    ens = rng.uniform(0, 100, size=(4, 68, 2))
    (tmp_path / "predictions").mkdir()
    np.savez(tmp_path / "predictions" / "test.npz", ensemble=ens, per_fold=ens[None], folds=np.array([0]))
    test_dir = tmp_path / "data" / "cache" / "test"
    test_dir.mkdir(parents=True)
    (test_dir / "meta.csv").write_text("index,face_id\n" + "".join(f"{i},f{i}\n" for i in range(4)))
    code, out, err = run_cli(["submit", "--set", "submit.name=mine"], capsys)
    assert code == 0, err
    vals = read_submission(tmp_path / "submissions" / "mine.csv", n_rows=4 * 68 * 2)
    np.testing.assert_allclose(vals.reshape(4, 68, 2), ens, atol=5e-7)

    # face count disagrees with the test cache -> exit 2, one line naming the predictions
    (test_dir / "meta.csv").write_text("index,face_id\n" + "".join(f"{i},f{i}\n" for i in range(5)))
    code, out, err = run_cli(["submit", "--out-dir", "other"], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0 and "predictions/test.npz" in err and "expected 5" in err
    assert not (tmp_path / "other").exists() or list((tmp_path / "other").iterdir()) == []


def test_submit_cmd_rejects_nan_predictions(tmp_path, capsys):
    ens = np.ones((2, 68, 2))
    ens[1, 3, 0] = np.nan
    np.savez(tmp_path / "test.npz", ensemble=ens)
    code, _, err = run_cli(["submit", "--params", str(tmp_path / "none.yaml"), "--predictions",
                            str(tmp_path / "test.npz"), "--cache", str(tmp_path / "cache"),
                            "--out-dir", str(tmp_path / "subs")], capsys)
    assert code == 2 and "params file not found" in err  # --params must exist when given
    code, _, err = run_cli(["submit", "--predictions", str(tmp_path / "test.npz"), "--cache",
                            str(tmp_path / "cache"), "--out-dir", str(tmp_path / "subs")], capsys)
    assert code == 2 and "non-finite" in err and "face 1 point 3 x" in err
    assert not (tmp_path / "subs" / "submission.csv").exists()


def test_submit_cmd_missing_predictions(tmp_path, capsys):
    code, _, err = run_cli(["submit", "--predictions", str(tmp_path / "nope.npz")], capsys)
    assert code == 2 and "nope.npz" in err and "not found" in err


def test_submit_standalone_predicts_with_a_landmarker(tmp_path, monkeypatch, capsys):
    calls = {}

    class FakeLandmarker:
        metas = [{}, {}]
        calibration = None

        def predict_xml(self, xml_path, n_jobs=1):
            calls.update(xml=xml_path, n_jobs=n_jobs)
            return np.arange(3 * 68 * 2, dtype=float).reshape(3, 68, 2)

    def fake_from_checkpoints(paths, *, backend="torch", device="auto", tta="flip", jitter=0.0, **kw):
        calls.update(ckpts=list(paths), tta=tta, jitter=jitter, **kw)
        return FakeLandmarker()

    from pipeline.inference.landmarker import Landmarker

    monkeypatch.setattr(Landmarker, "from_checkpoints", staticmethod(fake_from_checkpoints))
    xml = tmp_path / "test.xml"
    xml.write_text("<dataset/>")
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    a.write_bytes(b"x")
    b.write_bytes(b"x")
    out = tmp_path / "out" / "pred.csv"
    code, stdout, err = run_cli(["submit", "--xml", str(xml), "--checkpoints", str(a), str(b),
                                 "--out", str(out), "--set", "predict.tta=none"], capsys)
    assert code == 0, err
    assert calls["xml"] == str(xml) and calls["ckpts"] == [str(a), str(b)]
    assert calls["tta"] == "none" and calls["n_jobs"] == DEFAULTS.crop.n_jobs and calls["schema"].k == 68
    assert calls["batch_size"] == DEFAULTS.predict.batch_size
    vals = read_submission(out)
    np.testing.assert_array_equal(vals, np.arange(3 * 68 * 2))

    code, _, err = run_cli(["submit", "--xml", str(xml), "--checkpoints", str(tmp_path / "c.pt"),
                            "--out", str(out)], capsys)
    assert code == 2 and "c.pt: checkpoint not found" in err
    code, _, err = run_cli(["submit", "--xml", str(xml), "--out", str(out)], capsys)
    assert code == 2 and "--checkpoints" in err
