"""Shared fixtures: a small demo data set, its crop cache and folds, and the real
ibug300w-mini set when ../shared is present (tests that need it skip otherwise)."""

from pathlib import Path

import pytest

from pipeline.config import load_config

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "data" / "ibug300w-mini"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def real_dir() -> Path:
    if not (REAL / "labels_ibug_300W_train.xml").exists():
        pytest.skip("../shared/data/ibug300w-mini is absent")
    return REAL


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    from pipeline.demo import generate_demo

    return generate_demo(tmp_path_factory.mktemp("demo") / "demo", n_train=48, n_test=8, seed=3)


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory, demo_dir) -> Path:
    """demo_dir cropped at 32 px into <ws>/cache and split into 2 folds at <ws>/folds.csv."""
    import pandas as pd

    from pipeline.crop import run_crop
    from pipeline.folds import make_folds

    ws = tmp_path_factory.mktemp("ws")
    cfg = load_config(None, [f"data.dir={demo_dir}", "crop.size=32", "crop.n_jobs=1"])
    run_crop(cfg, ws / "cache")
    meta = pd.read_csv(ws / "cache" / "train" / "meta.csv")
    pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": meta["group"],
                  "fold": make_folds(meta["group"], 2, 0)}).to_csv(ws / "folds.csv", index=False)
    return ws
