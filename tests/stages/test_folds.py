"""Grouped folds: photos stay whole, folds balanced, deterministic, CLI output."""

import re

import numpy as np
import pandas as pd
import pytest

from pipeline.cli import main
from pipeline.core.errors import PipelineError
from pipeline.formats.annotations import photo_group
from pipeline.stages.folds import make_folds


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
    groups = ["a"] * 4 + ["b"] * 3 + ["c"] * 3 + ["d", "e"]  # largest group == a fold (12 / 3)
    fold = make_folds(groups, 3, 0)
    assert sorted(set(fold.tolist())) == [0, 1, 2]
    _assert_grouped(groups, fold)


def test_group_larger_than_a_fold_is_refused():
    groups = ["a"] * 10 + ["b", "c"]  # 'a' alone is 10 faces, a fold is 4
    with pytest.raises(PipelineError, match=r"meta.csv: photo group 'a' has 10 faces, more than a fold"):
        make_folds(groups, 3, 0, source="meta.csv")


@pytest.mark.parametrize("image, group", [
    ("afw/1130084326_2.jpg", "afw/1130084326"),
    ("afw/1130084326_2_mirror.jpg", "afw/1130084326"),
    ("helen/trainset/100032540_1.jpg", "helen/trainset/100032540"),
    ("helen/trainset/100032540_1_mirror.jpg", "helen/trainset/100032540"),
    ("lfpw/trainset/image_0001.png", "lfpw/trainset/image_0001"),
    ("lfpw/trainset/image_0854_mirror.jpg", "lfpw/trainset/image_0854"),
    ("ibug/image_092_01.jpg", "ibug/image_092"),
    ("ibug/image_092_02_mirror.jpg", "ibug/image_092"),
    ("images/train/000012_1.jpg", "images/train/000012"),
    ("a/face.png", "a/face"),
])
def test_300w_names_group_by_photo(image, group):
    assert photo_group(image) == group
    # lfpw photos stay apart (the old rule merged all of them into 'lfpw/trainset/image')
    assert photo_group("lfpw/trainset/image_0001.png") != photo_group("lfpw/trainset/image_0002.png")


def test_real_layout_folds_keep_photos_and_mirrors_together(tmp_path):
    """On the full set's layout (subset folders, LFPW/iBUG names, multi-face photos,
    _mirror copies) no photo and no face/mirror pair is split across folds, the groups
    are exactly the photos, and the folds are balanced. The old rule (strip _<digits>)
    fails this: the control at the end shows the test can tell."""
    import json
    import re

    from pipeline.core.params_schema import DEFAULTS
    from pipeline.formats.annotations import load_xml
    from pipeline.keypoints.schema import IBUG68
    from pipeline.stages.folds import group_faces
    from pipeline.synth.layout import generate_demo

    ds = generate_demo(tmp_path / "d", n_train=240, n_test=4, seed=2, layout="300w")
    truth = json.loads((ds / "demo.json").read_text())["photos"]  # image -> photo it shows
    faces = load_xml(ds / "labels_ibug_300W_train.xml", IBUG68)
    meta = pd.DataFrame({"image": [f.image for f in faces]})
    groups = group_faces(meta, DEFAULTS.folds.group_regex)
    photo = meta["image"].map(truth)
    assert photo.notna().all()
    # groups == photos, one to one: nothing split, nothing lumped together
    assert (pd.DataFrame({"g": groups, "p": photo}).groupby("g")["p"].nunique() == 1).all()
    assert groups.nunique() == photo.nunique()
    assert meta["image"].str.contains("_mirror").sum() == 120
    assert meta["image"].str.startswith("lfpw/trainset/image_").any()
    for k in (3, 5):
        fold = make_folds(groups.to_numpy(), k, seed=0)
        _assert_grouped(photo, fold)
        sizes = np.bincount(fold, minlength=k)
        assert sizes.max() - sizes.min() <= 4  # within the biggest photo (2 faces + 2 mirrors)
    # the same through the stages: crop, then `pipeline folds` with the params' rule
    from pipeline.core.config import load_config
    from pipeline.stages.crop import run_crop

    run_crop(load_config(None, [f"data.dir={ds}", "crop.side=8", "crop.n_jobs=1"]), tmp_path / "c")
    out = tmp_path / "f" / "folds.csv"
    main(["folds", "--cache", str(tmp_path / "c"), "--out", str(out)])
    df = pd.read_csv(out, dtype={"face_id": str, "group": str})
    meta = pd.read_csv(tmp_path / "c" / "train" / "meta.csv", dtype={"image": str})
    _assert_grouped(meta["image"].map(truth), df["fold"])
    assert df["group"].nunique() == photo.nunique()
    sizes = np.bincount(df["fold"], minlength=5)
    assert sizes.max() - sizes.min() <= 4
    # control: the old rule puts mirrors and LFPW photos in the wrong groups
    old = meta["image"].map(lambda im: re.sub(r"_\d+$", "", im.rsplit(".", 1)[0]))
    fold = make_folds(old.to_numpy(), 2, seed=0) if old.value_counts().max() <= len(old) / 2 else None
    split = fold is None or (pd.DataFrame({"p": photo, "f": fold}).groupby("p")["f"].nunique() > 1).any()
    assert split


def test_cli_logs_groups_and_uses_group_regex(demo_dir, tmp_path, caplog):
    """`pipeline folds` groups by folds.group_regex (not by the cache's group column) and
    logs the number of groups and the largest; a rule lumping everything is refused."""
    import logging

    from pipeline.core.config import load_config
    from pipeline.stages.crop import run_crop

    run_crop(load_config(None, [f"data.dir={demo_dir}", "crop.side=16", "crop.n_jobs=1"]), tmp_path / "c")
    out = tmp_path / "f" / "folds.csv"
    with caplog.at_level(logging.INFO):
        main(["folds", "--cache", str(tmp_path / "c"), "--out", str(out), "--set", "folds.k=2",
              "--set", "folds.train=[0]", "--set", "folds.group_regex=^images/(?P<photo>train)/.*[02468]_1$"])
    df = pd.read_csv(out, dtype={"face_id": str, "group": str})
    # even photo numbers: one group 'train'; the others do not match and are their own group
    even = df["face_id"].str.match(r".*[02468]_1(#\d+)?$")
    assert (df.loc[even, "group"] == "train").all() and df.loc[~even, "group"].str.startswith("images/").all()
    assert even.sum() <= len(df) / 2
    _assert_grouped(df["group"], df["fold"])
    assert re.search(rf"48 faces in {df['group'].nunique()} photo groups .*largest: train with {even.sum()} faces",
                     caplog.text)
    bad = tmp_path / "g" / "folds.csv"
    with pytest.raises(SystemExit) as e:
        main(["folds", "--cache", str(tmp_path / "c"), "--out", str(bad), "--set", "folds.group_regex=(?P<photo>images)"])
    assert e.value.code == 2 and not bad.parent.exists()


@pytest.mark.parametrize("k", [0, 1, 4])
def test_bad_k(k):
    with pytest.raises(PipelineError, match="folds.k"):
        make_folds(["a", "b", "c"], k, 0)


def test_real_groups(real_dir):
    from pipeline.formats.annotations import load_xml
    from pipeline.keypoints.schema import IBUG68

    groups = [f.group for f in load_xml(real_dir / "labels_ibug_300W_train.xml", IBUG68)]
    fold = make_folds(groups, 5, 0)
    _assert_grouped(groups, fold)
    sizes = np.bincount(fold)
    assert len(sizes) == 5 and sizes.min() >= 0.9 * len(groups) / 5


def test_cli(demo_dir, tmp_path, capsys):
    from pipeline.core.config import load_config
    from pipeline.stages.crop import run_crop

    run_crop(load_config(None, [f"data.dir={demo_dir}", "crop.side=16", "crop.n_jobs=1"]), tmp_path / "c")
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
