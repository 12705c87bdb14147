"""A training's identity (pipeline/training/identity.py) changes exactly when the weights would:
a fold stays trained under every edit that cannot change its weights (the test split, where
the data set lies, the params that only shape inputs hashed by content, the spelling of a
switch) and trains afresh under every one that can (each model and train param, the DDP
world size, the order in which extra faces join)."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import load_config
from pipeline.core.params_schema import is_runtime, is_speed_only, section_fields
from pipeline.stages.crop import run_crop, run_crop_extra
from pipeline.stages.folds import make_folds
from pipeline.stages.train import fit
from pipeline.synth.layout import generate_demo
from pipeline.training.identity import current_identity, identity_mismatch, trained_epochs
from pipeline.training.setup import load_fold

TRAIN = ["model.input_size=32", "train.batch_size=8", "train.epochs=1", "train.warmup_epochs=1", "folds.k=2",
         "folds.train=[0,1]", "train.randaug_n=0", "train.device=cpu"]

# a value other than the default of every param that can change the weights
CHANGES_THE_WEIGHTS = {
    "model.preset": "resunet-fast", "model.input_size": 48, "model.in_chans": 1, "model.options": "{width: 0.5}",
    "train.epochs": 2, "train.batch_size": 4, "train.optimizer": "sgd", "train.lr": 0.002, "train.momentum": 0.8,
    "train.weight_decay": 0.001, "train.warmup_epochs": 0.5, "train.loss": "l2", "train.wing_width": 5.0,
    "train.wing_curvature": 3.0, "train.structure_lambda": 0.1, "train.normalize_coords": "false",
    "train.heatmap_lambda": 0.5, "train.heatmap_sigma": 2.0, "train.scale_min": 0.8, "train.scale_max": 1.2,
    "train.flip": 0.3, "train.randaug_n": 3, "train.randaug_m": 5, "train.rotate": 5.0, "train.erase": 0.1,
    "train.amp": "bf16", "train.channels_last": "off", "train.ema_decay": 0.9, "train.val_every": 2,
    "train.seed": 1, "train.grad_clip": 1.0,
}
# every other param, at a value that trains the same weights from the same cache, folds and
# extra caches: those that only locate or shape those inputs (hashed by content instead), the
# folds that get a stage, runtime and speed-only params, and switches spelled otherwise but
# resolving alike here (train.amp off = auto on a CPU without native bf16; sync_bn in one
# process; channels_last auto = on)
KEEPS_THE_WEIGHTS = {
    "data.dir": None,  # filled in: the data set's folder through a symlink
    "data.train_xml": "other.xml", "data.test_xml": "other.xml", "data.solution": "other.csv",
    "data.schema": "nose1", "data.custom_schema": "{names: [a, b], flip: [1, 0], eyes: [0, 1]}",
    "data.label_origin": 1.0, "crop.side": 48, "crop.expand": 1.4, "crop.n_jobs": 2, "folds.k": 3,
    "folds.seed": 5, "folds.train": "[1]", "folds.group_regex": "^(?P<photo>.+)$",
    "train.amp": "off", "train.sync_bn": "on", "train.channels_last": "on", "train.compile": "on",
    "train.keep_freed_memory": "off", "train.num_workers": 2, "train.device": "auto",
}


def _workspace(root, data_dir):
    """data_dir cropped at 32 px into <root>/cache, 2 folds at <root>/folds.csv."""
    cfg = load_config(None, [f"data.dir={data_dir}", "crop.side=32", "crop.n_jobs=1"])
    run_crop(cfg, root / "cache")
    meta = pd.read_csv(root / "cache" / "train" / "meta.csv")
    pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": meta["group"],
                  "fold": make_folds(meta["group"], 2, 0)}).to_csv(root / "folds.csv", index=False)
    return root / "cache", root / "folds.csv"


@pytest.fixture
def no_native_bf16(monkeypatch):
    import pipeline.core.device as device

    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda flags=None: False)  # train.amp auto: fp32


def test_every_param_is_classified():
    """Each param of the sections a training could read is listed above as one that can
    change the weights or one that cannot (data.extra_train has its own tests below)."""
    keys = {f"{s}.{k}" for s in ("data", "crop", "folds", "model", "train") for k in section_fields(s)}
    assert set(CHANGES_THE_WEIGHTS) | set(KEEPS_THE_WEIGHTS) == keys - {"data.extra_train"}
    assert not set(CHANGES_THE_WEIGHTS) & set(KEEPS_THE_WEIGHTS) - {"train.amp", "train.channels_last"}
    for key in CHANGES_THE_WEIGHTS:
        section, name = key.split(".")
        field = section_fields(section)[name]
        assert not is_runtime(field) and not is_speed_only(field), key


def test_params_that_cannot_change_the_weights_keep_a_fold_trained(tiny_workspace, demo_dir, tmp_path,
                                                                  no_native_bf16):
    ws = tiny_workspace
    cache, folds = ws / "cache", ws / "folds.csv"
    sets = TRAIN + [f"data.dir={demo_dir}"]  # the data set tiny_workspace was cropped from
    fit(load_config(None, sets), 0, cache, folds, tmp_path / "models", resume=False)
    link = tmp_path / "link"
    link.symlink_to(demo_dir)
    moved = []
    for key, value in KEEPS_THE_WEIGHTS.items():
        value = link if value is None else value
        other = load_config(None, sets + [f"{key}={value}"])
        if trained_epochs(tmp_path / "models" / "fold0", other, cache, folds) != 1:
            moved.append(key)
    assert moved == []


def test_params_that_change_the_weights_train_afresh(tiny_workspace, tmp_path, no_native_bf16):
    ws = tiny_workspace
    base = current_identity(load_config(None, TRAIN), ws / "cache", ws / "folds.csv")
    assert base is not None
    same = [key for key, value in CHANGES_THE_WEIGHTS.items()
            if identity_mismatch(base, current_identity(load_config(None, TRAIN + [f"{key}={value}"]), ws / "cache",
                                                        ws / "folds.csv")) != ["params"]
            and key != "train.amp"]
    assert same == []
    bf16 = current_identity(load_config(None, TRAIN + ["train.amp=bf16"]), ws / "cache", ws / "folds.csv")
    assert identity_mismatch(base, bf16) == ["precision"]


def test_amp_spelled_otherwise_compares_the_precision_it_resolves_to(tiny_workspace, monkeypatch):
    """On a CPU with native bf16 train.amp auto, on and bf16 all train in bf16: one identity."""
    import pipeline.core.device as device

    ws = tiny_workspace
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda flags=None: True)
    ids = [current_identity(load_config(None, TRAIN + [f"train.amp={amp}"]), ws / "cache", ws / "folds.csv")
           for amp in ("auto", "on", "bf16")]
    assert ids[0]["precision"] == "bf16"
    assert identity_mismatch(ids[0], ids[1]) == identity_mismatch(ids[0], ids[2]) == []


def test_a_test_set_only_edit_and_data_dir_spelled_otherwise_keep_a_fold_trained(demo_dir, tmp_path, caplog,
                                                                                    no_native_bf16):
    """One test box moved by 1 px re-crops the cache with another run id (both splits carry
    it) and a byte-identical training split; data.dir through a symlink or relative to the
    working folder writes another XML path into the cache: neither retrains the fold."""
    data = tmp_path / "data"
    shutil.copytree(demo_dir, data)
    cache, folds = _workspace(tmp_path / "a", data)
    cfg = load_config(None, TRAIN + [f"data.dir={data}"])
    out = tmp_path / "models"
    fit(cfg, 0, cache, folds, out, resume=False)
    last = out / "fold0" / "last.pt"
    before = last.read_bytes()

    xml = data / "labels_ibug_300W_test_parsed.xml"
    xml.write_text(re.sub(r"left='(-?\d+)'", lambda m: f"left='{int(m.group(1)) + 1}'", xml.read_text(), count=1))
    moved, _ = _workspace(tmp_path / "b", data)
    info = [json.loads((c / "train" / "info.json").read_text()) for c in (cache, moved)]
    assert info[0]["run"] != info[1]["run"]  # control: the crop run id names both splits
    for name in ("faces.npy", "keypoints.npy", "meta.csv"):
        assert (cache / "train" / name).read_bytes() == (moved / "train" / name).read_bytes(), name
    assert trained_epochs(out / "fold0", cfg, moved, folds) == 1

    link = tmp_path / "link"
    link.symlink_to(data)
    for i, spelled in enumerate((link, os.path.relpath(data))):
        other_cache, _ = _workspace(tmp_path / f"c{i}", spelled)
        other = load_config(None, TRAIN + [f"data.dir={spelled}"])
        assert trained_epochs(out / "fold0", other, other_cache, folds) == 1, spelled
    with caplog.at_level("INFO"):
        fit(other, 0, other_cache, folds, out, resume=True)
    assert "resuming" in caplog.text and last.read_bytes() == before


def test_extra_faces_join_in_one_order_whatever_the_order_of_extra_train(tiny_workspace, extra_ws, tmp_path,
                                                                          no_native_bf16):
    """data.extra_train is a mapping: listing its folders in another order trains on the
    same faces in the same order, under the same identity."""
    ws = tiny_workspace
    root = tmp_path / "extra"
    shutil.copytree(extra_ws["root"], root)
    second = generate_demo(tmp_path / "second", n_train=6, n_test=1, seed=12)
    more = f"data.extra_train.more={extra_ws['folder']}"
    alpha = f"data.extra_train.alpha={second}"
    base = [s for s in extra_ws["sets"] if not s.startswith("data.extra_train")]
    run_crop_extra(load_config(None, base + [more, alpha]), "alpha", root / "alpha", ws / "cache")
    orders = [load_config(None, TRAIN + base + sets) for sets in ([more, alpha], [alpha, more])]
    assert list(orders[0].data.extra_train) != list(orders[1].data.extra_train)
    (c0, t0, v0), (c1, t1, v1) = (load_fold(ws / "cache", ws / "folds.csv", 0, cfg, root) for cfg in orders)
    np.testing.assert_array_equal(c0.faces, c1.faces)
    np.testing.assert_array_equal(c0.keypoints, c1.keypoints)
    np.testing.assert_array_equal(t0, t1)
    ids = [current_identity(cfg, ws / "cache", ws / "folds.csv", root) for cfg in orders]
    assert ids[0] is not None and identity_mismatch(ids[0], ids[1]) == []


def test_an_extra_cropped_again_from_the_same_faces_keeps_a_fold_trained(tiny_workspace, extra_ws, tmp_path,
                                                                          no_native_bf16):
    """An extra cache records the main crop it was checked against and its own crop run id:
    re-cropped with the same faces (after a test-only edit of the main set, or with a
    param that shapes nothing of it) it trains the same weights."""
    ws = tiny_workspace
    cfg = load_config(None, TRAIN + extra_ws["sets"])
    a = current_identity(cfg, ws / "cache", ws / "folds.csv", extra_ws["root"])
    again = tmp_path / "extra"
    shutil.copytree(extra_ws["root"], again)
    info_path = again / "more" / "info.json"
    info = json.loads(info_path.read_text())
    info["run"], info["extra"]["main_run"] = "another", "another main"
    info_path.write_text(json.dumps(info))
    b = current_identity(cfg, ws / "cache", ws / "folds.csv", again)
    assert a is not None and identity_mismatch(a, b) == []
    kp = np.load(again / "more" / "keypoints.npy")
    kp[0, 0, 0] += 1.0
    np.save(again / "more" / "keypoints.npy", kp)
    assert identity_mismatch(a, current_identity(cfg, ws / "cache", ws / "folds.csv", again)) == ["extra_train"]


def test_the_ddp_world_size_is_part_of_the_identity(tiny_workspace, no_native_bf16):
    """Two processes split train.batch_size, pad the sampler and decide sync_bn: auto:
    another world size is another training."""
    ws = tiny_workspace
    cfg = load_config(None, TRAIN)
    one = current_identity(cfg, ws / "cache", ws / "folds.csv")
    two = current_identity(cfg, ws / "cache", ws / "folds.csv", world=2)
    assert identity_mismatch(one, two) == ["params"]
