"""Grouped folds: photos stay whole, folds balanced, deterministic, CLI output."""

import numpy as np
import pandas as pd
import pytest

from pipeline.cli import main
from pipeline.dataset import photo_group
from pipeline.errors import PipelineError
from pipeline.folds import make_folds


def _groups(seed=0, n_photos=60):
    rng = np.random.default_rng(seed)
    names = []
    for p in range(n_photos):
        for j in range(int(rng.choice([1, 1, 1, 2, 3, 5]))):
            names.append(f"afw/{1130084326 + p}_{j + 1}.jpg")
    order = rng.permutation(len(names))
    return [photo_group(names[i]) for i in order]


def _assert_grouped(groups, fold):
    by = pd.DataFrame({"g": groups, "f": fold}).groupby("g")["f"].nunique()
    assert (by == 1).all()


def test_grouped_balanced_deterministic():
    groups = _groups()
    assert photo_group("afw/1130084326_1.jpg") == photo_group("afw/1130084326_2.jpg")
    fold = make_folds(groups, 5, seed=0)
    assert fold.dtype == np.int64 and fold.shape == (len(groups),)
    _assert_grouped(groups, fold)
    sizes = np.bincount(fold, minlength=5)
    assert (sizes > 0).all() and sizes.max() - sizes.min() <= 5  # within the biggest photo
    np.testing.assert_array_equal(fold, make_folds(groups, 5, seed=0))
    assert not np.array_equal(fold, make_folds(groups, 5, seed=1))
    # the folds of a face do not depend on the order the faces are listed in
    perm = np.random.default_rng(3).permutation(len(groups))
    np.testing.assert_array_equal(make_folds([groups[i] for i in perm], 5, 0), fold[perm])


def test_every_fold_non_empty_at_the_limit():
    groups = ["a"] * 10 + ["b", "c"]
    fold = make_folds(groups, 3, 0)
    assert sorted(set(fold.tolist())) == [0, 1, 2]
    _assert_grouped(groups, fold)


@pytest.mark.parametrize("k", [0, 1, 4])
def test_bad_k(k):
    with pytest.raises(PipelineError, match="folds.k"):
        make_folds(["a", "b", "c"], k, 0)


def test_real_groups(real_dir):
    from pipeline.dataset import load_xml
    from pipeline.schema import IBUG68

    groups = [f.group for f in load_xml(real_dir / "labels_ibug_300W_train.xml", IBUG68)]
    fold = make_folds(groups, 5, 0)
    _assert_grouped(groups, fold)
    sizes = np.bincount(fold)
    assert len(sizes) == 5 and sizes.min() >= 0.9 * len(groups) / 5


def test_cli(demo_dir, tmp_path, capsys):
    from pipeline.config import load_config
    from pipeline.crop import run_crop

    run_crop(load_config(None, [f"data.dir={demo_dir}", "crop.size=16", "crop.n_jobs=1"]), tmp_path / "c")
    out = tmp_path / "f" / "folds.csv"
    main(["folds", "--cache", str(tmp_path / "c"), "--out", str(out), "--set", "folds.k=3",
          "--set", "folds.train=[0,2]"])
    df = pd.read_csv(out, dtype={"face_id": str, "group": str})
    meta = pd.read_csv(tmp_path / "c" / "train" / "meta.csv", dtype={"face_id": str, "group": str})
    assert list(df.columns) == ["index", "face_id", "group", "fold"]
    assert df["index"].tolist() == list(range(48)) and df["face_id"].tolist() == meta["face_id"].tolist()
    assert sorted(df["fold"].unique()) == [0, 1, 2]
    _assert_grouped(df["group"], df["fold"])
    assert sorted(p.name for p in out.parent.iterdir()) == ["folds.csv", "folds.params.yaml"]
    # folds.train must name existing folds; nothing is written then
    bad = tmp_path / "g" / "folds.csv"
    with pytest.raises(SystemExit) as e:
        main(["folds", "--cache", str(tmp_path / "c"), "--out", str(bad), "--set", "folds.k=2"])
    assert e.value.code == 2 and "folds.train" in capsys.readouterr().err and not bad.parent.exists()
    with pytest.raises(SystemExit) as e:
        main(["folds", "--cache", str(tmp_path / "nope"), "--out", str(bad)])
    assert e.value.code == 2 and "meta.csv" in capsys.readouterr().err and not bad.parent.exists()
