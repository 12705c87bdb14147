"""Shared fixtures, and only fixtures: a small demo data set, its crop cache and folds, a
trained tiny model with its predictions, and the real ibug300w-mini set when ../shared is
present (tests that need it skip otherwise). Plain helpers are in helpers.py."""

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import load_config
from pipeline.formats.annotations import xml_text

from helpers import REPO

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
    from pipeline.synth.layout import generate_demo

    return generate_demo(tmp_path_factory.mktemp("demo") / "demo", n_train=48, n_test=8, seed=3)


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory, demo_dir) -> Path:
    """demo_dir cropped at 32 px into <ws>/cache and split into 2 folds at <ws>/folds.csv."""
    import pandas as pd

    from pipeline.stages.crop import run_crop
    from pipeline.stages.folds import make_folds

    ws = tmp_path_factory.mktemp("ws")
    cfg = load_config(None, [f"data.dir={demo_dir}", "crop.side=32", "crop.n_jobs=1"])
    run_crop(cfg, ws / "cache")
    meta = pd.read_csv(ws / "cache" / "train" / "meta.csv")
    pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": meta["group"],
                  "fold": make_folds(meta["group"], 2, 0)}).to_csv(ws / "folds.csv", index=False)
    return ws


@pytest.fixture(scope="session")
def extra_ws(tmp_path_factory, demo_dir, tiny_workspace) -> dict:
    """A second demo set (another seed, 12 training faces) as data.extra_train's `more`,
    cropped like tiny_workspace's cache into <root>/more: {"folder", "root", "sets"}, sets
    = the overrides that name it (data.dir = demo_dir, the 32 px crop)."""
    from pipeline.stages.crop import run_crop_extra
    from pipeline.synth.layout import generate_demo

    base = tmp_path_factory.mktemp("extra")
    folder = generate_demo(base / "more", n_train=12, n_test=1, seed=11)
    sets = [f"data.dir={demo_dir}", "crop.side=32", "crop.n_jobs=1", f"data.extra_train.more={folder}"]
    run_crop_extra(load_config(None, sets), "more", base / "extra" / "more", tiny_workspace / "cache")
    return {"folder": folder, "root": base / "extra", "sets": sets}


@pytest.fixture
def make_dataset(tmp_path):
    """Factory for small on-disk data sets in the competition layout:
    make_dataset(images={rel: RGB uint8 array | bytes}, train=entries, test=entries) -> folder.
    Arrays are written with cv2.imwrite (by extension); entries as for `xml_text`; a str
    for train/test is written verbatim (for malformed files). Returns the folder."""
    import cv2
    import numpy as np

    counter = {"n": 0}

    def make(images=None, train=None, test=None, name=None):
        counter["n"] += 1
        root = tmp_path / (name or f"ds{counter['n']}")
        root.mkdir(parents=True)
        for rel, img in (images or {}).items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(img, (bytes, bytearray)):
                p.write_bytes(img)
            else:
                arr = np.asarray(img)
                if arr.ndim == 3 and arr.shape[2] in (3, 4):
                    arr = arr[..., [2, 1, 0, 3][:arr.shape[2]]]  # RGB(A) -> BGR(A)
                assert cv2.imwrite(str(p), arr), p
        for fname, entries in (("labels_ibug_300W_train.xml", train), ("labels_ibug_300W_test_parsed.xml", test)):
            if entries is not None:
                (root / fname).write_text(entries if isinstance(entries, str) else xml_text(entries))
        return root

    return make


@pytest.fixture
def face_points():
    """A plausible (68, 2) face inside box (40, 40, 80, 90): the demo template, placed."""
    from pipeline.synth.face import TEMPLATE

    pts = TEMPLATE[:, :2].copy()
    return (pts - pts.min(0)) / (pts.max(0) - pts.min(0)) * [80, 90] + [40, 40]


# ------------------------------------------------------------------ pictures (tests/tools, tests/formats)

@pytest.fixture(scope="session")
def viz_ws(tiny_workspace, demo_dir, tmp_path_factory):
    """tiny_workspace + a 1-epoch resunet-tiny (32 px) for fold 0, its predictions
    (test.npz, oof.npz as `pipeline predict` lays them out) and a regression checkpoint."""
    import torch

    from pipeline.formats.cache import load_cache
    from pipeline.formats.checkpoint import load_model, save_checkpoint
    from pipeline.inference.tta import predict_original
    from pipeline.keypoints.schema import IBUG68
    from pipeline.models import create_model
    from pipeline.stages.train import fit

    ws = tiny_workspace
    out = tmp_path_factory.mktemp("vizws")
    cfg = load_config(None, [f"data.dir={demo_dir}", "crop.side=32", "model.input_size=32", "train.epochs=1",
                             "train.batch_size=16", "train.device=cpu", "folds.k=2", "folds.train=[0,1]"])
    fit(cfg, 0, ws / "cache", ws / "folds.csv", out / "models", resume=False)
    ckpt_path = out / "models" / "fold0" / "best.pt"
    model, ckpt = load_model(ckpt_path, "cpu")
    train, test = load_cache(ws / "cache" / "train"), load_cache(ws / "cache" / "test")
    import pandas as pd

    fold = pd.read_csv(ws / "folds.csv")["fold"].to_numpy()
    dev = torch.device("cpu")
    ens = predict_original(model, ckpt, test.faces, test.crop_to_orig, "flip", 64, dev)["final"]
    val = np.flatnonzero(fold == 0)
    tta = np.full((len(train), 68, 2), np.nan)
    tta[val] = predict_original(model, ckpt, train.faces[val], train.crop_to_orig[val], "flip", 64, dev)["tta"]
    (out / "pred").mkdir()
    np.savez(out / "pred" / "test.npz", ensemble=ens, per_fold=ens[None], folds=np.array([0]))
    np.savez(out / "pred" / "oof.npz", tta=tta, plain=tta, fold=fold)
    reg = create_model("vgg-seed", 68, 3, 32)
    save_checkpoint(out / "reg.pt", {"model_config": reg.config, "model": reg.state_dict(), "epoch": 0,
                                     "schema": IBUG68.to_dict(), "config": cfg.model_dump(), "best_mae": 0.0})
    return {"cache": ws / "cache", "pred": out / "pred", "ckpt": ckpt_path, "reg": out / "reg.pt",
            "data": demo_dir, "n_val": len(val)}


# ------------------------------------------------------------------ a model whose maps mean something

@pytest.fixture(scope="session")
def face_model(tmp_path_factory) -> dict:
    """A resunet-tiny trained long enough on a demo set for its heatmaps to tell faces from
    non-faces (the 1-epoch models above are flat everywhere), calibrated by
    `pipeline calibrate-presence` on its held-out fold: {"ckpt": the calibrated checkpoint,
    "raw": the same model uncalibrated, "calibration": the command's result, "demo", "cache",
    "folds"}."""
    import pandas as pd

    from pipeline.stages.crop import run_crop
    from pipeline.stages.folds import make_folds
    from pipeline.stages.train import fit
    from pipeline.synth.layout import generate_demo
    from pipeline.tools.presence_calibration import run_calibrate_presence

    root = tmp_path_factory.mktemp("facemodel")
    demo = generate_demo(root / "demo", n_train=FACE_MODEL["faces"], n_test=2, seed=7)
    sets = [f"data.dir={demo}", f"crop.side={FACE_MODEL['side']}", "crop.n_jobs=1",
            f"model.input_size={FACE_MODEL['side']}", f"train.epochs={FACE_MODEL['epochs']}", "train.batch_size=16",
            "train.device=cpu", "folds.k=2", "folds.train=[0,1]"]
    cfg = load_config(None, sets)
    run_crop(cfg, root / "cache")
    meta = pd.read_csv(root / "cache" / "train" / "meta.csv")
    pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": meta["group"],
                  "fold": make_folds(meta["group"], 2, 0)}).to_csv(root / "folds.csv", index=False)
    fit(cfg, 0, root / "cache", root / "folds.csv", root / "models", resume=False)
    raw = root / "models" / "fold0" / "best.pt"
    (calibration,) = run_calibrate_presence(cfg, [str(raw)], root / "cache", root / "folds.csv",
                                            out=str(root / "calibrated.pt"))
    return {"ckpt": root / "calibrated.pt", "raw": raw, "calibration": calibration, "demo": demo,
            "cache": root / "cache", "folds": root / "folds.csv", "sets": sets}


FACE_MODEL = {"faces": 120, "side": 64, "epochs": 80}
