"""Predict: flip TTA, fold ensemble, OOF, mapping back to original pixels, CLI chain."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.cli import main
from pipeline.core.config import load_config
from pipeline.formats.cache import load_cache
from pipeline.formats.checkpoint import load_checkpoint
from pipeline.formats.submission import read_submission
from pipeline.inference.tta import predict_crops
from pipeline.keypoints.schema import IBUG68
from pipeline.stages.train import fit

from helpers import Fixed, run_cli

TINY = ["crop.side=32", "model.input_size=32", "train.batch_size=8", "train.epochs=1", "folds.k=2",
        "folds.train=[0,1]", "train.randaug_n=1"]


class BrightestColumn(torch.nn.Module):
    """Every keypoint at the (x, y) of the brightest pixel: exactly flip-equivariant up to
    the index remap, so flip TTA must reproduce the plain prediction."""

    def forward(self, x):
        b, _, h, w = x.shape
        flat = x.mean(1).reshape(b, -1).argmax(-1)
        xy = torch.stack([(flat % w).float(), (flat // w).float()], -1)  # (B, 2)
        return xy[:, None, :].expand(b, 68, 2)


def test_flip_tta_of_an_equivariant_model_equals_plain():
    faces = np.zeros((3, 32, 32, 3), np.uint8)
    for i, (x, y) in enumerate([(3, 5), (20, 9), (30, 30)]):
        faces[i, y, x] = 255
    out = predict_crops(BrightestColumn(), faces, input_size=32, in_chans=3, flip_perm=IBUG68.flip_perm)
    np.testing.assert_allclose(out["flip"], out["plain"], atol=1e-6)
    np.testing.assert_allclose(out["plain"][:, 0], [[3, 5], [20, 9], [30, 30]], atol=1e-6)


def test_flip_tta_unflips_and_remaps_indices():
    # a model that always answers the same shape: on the mirrored face its answer, un-mirrored
    # and index-remapped, is the schema-flipped shape; TTA averages the two
    rng = np.random.default_rng(0)
    coords = rng.uniform(0, 31, (68, 2))
    out = predict_crops(Fixed(coords), np.zeros((2, 32, 32, 3), np.uint8), input_size=32, in_chans=3,
                        flip_perm=IBUG68.flip_perm)
    np.testing.assert_allclose(out["flip"][0], IBUG68.flip_coords(coords, 32), atol=1e-5)
    np.testing.assert_allclose(out["tta"], (out["plain"] + out["flip"]) / 2)


def test_predictions_map_back_through_input_resize():
    # input 64 from a 32 px cache: input pixel centres map back as x = (x' + 0.5) / 2 - 0.5
    coords = np.array([[0.5, 0.5], [63.0, 10.0]] + [[32.0, 32.0]] * 66)
    out = predict_crops(Fixed(coords), np.zeros((1, 32, 32, 3), np.uint8), input_size=64, in_chans=3,
                        flip_perm=None)
    np.testing.assert_allclose(out["plain"][0, :2], [[0.0, 0.0], [31.25, 4.75]], atol=1e-6)
    assert "tta" not in out


@pytest.fixture(scope="module")
def trained(tiny_workspace, tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    for fold in (0, 1):
        fit(load_config(None, TINY), fold, tiny_workspace / "cache", tiny_workspace / "folds.csv", models,
            resume=False)
    return models


def test_predict_cli_ensemble_and_oof(tiny_workspace, trained, tmp_path):
    ws = tiny_workspace
    args = ["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(trained),
            "--out", str(tmp_path / "pred")] + sum((["--set", s] for s in TINY), [])
    main(args)
    test = np.load(tmp_path / "pred" / "test.npz")
    oof = np.load(tmp_path / "pred" / "oof.npz")
    n_test, n_train = len(load_cache(ws / "cache" / "test")), len(load_cache(ws / "cache" / "train"))
    assert test["ensemble"].shape == (n_test, 68, 2) and test["per_fold"].shape == (2, n_test, 68, 2)
    np.testing.assert_allclose(test["ensemble_raw"], test["per_fold"].mean(0))
    # OOF calibration (predict.calibrate: auto) subtracts the OOF bias, or leaves it alone
    expect = test["ensemble_raw"] - test["bias"] if test["calibrated"] else test["ensemble_raw"]
    np.testing.assert_allclose(test["ensemble"], expect)
    folds = pd.read_csv(ws / "folds.csv")["fold"].to_numpy()
    np.testing.assert_array_equal(oof["fold"], folds)
    assert oof["tta"].shape == (n_train, 68, 2) and np.isfinite(oof["tta"]).all()
    # predictions are in original pixels: inside (or near) each face's photo
    meta = load_cache(ws / "cache" / "test").meta
    assert (test["ensemble"][..., 0] > -meta["image_width"].to_numpy()[:, None]).all()
    assert (test["ensemble"][..., 0] < 2 * meta["image_width"].to_numpy()[:, None]).all()


def test_submit_and_score_agree_with_independent_mae(tiny_workspace, trained, tmp_path, demo_dir, capsys):
    ws = tiny_workspace
    over = sum((["--set", s] for s in TINY), [])
    main(["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(trained),
          "--out", str(tmp_path / "pred")] + over)
    main(["submit", "--predictions", str(tmp_path / "pred" / "test.npz"), "--cache", str(ws / "cache"),
          "--out-dir", str(tmp_path / "subs")] + over)
    sub = tmp_path / "subs" / "submission.csv"
    main(["score", str(sub), "--solution", str(demo_dir / "solution.csv"), "--json", str(tmp_path / "s.json")])
    got = json.loads((tmp_path / "s.json").read_text())["mae"]
    a = pd.read_csv(sub).sort_values("Id")["Predicted"].to_numpy()
    b = pd.read_csv(demo_dir / "solution.csv").sort_values("Id").iloc[:, 1].to_numpy()
    assert abs(got - np.abs(a - b).mean()) < 1e-6


def test_predict_calibration_subtracts_the_oof_bias_when_on(tiny_workspace, trained, tmp_path):
    ws = tiny_workspace
    base = ["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(trained)]
    over = sum((["--set", s] for s in TINY), [])
    main(base + ["--out", str(tmp_path / "on")] + over + ["--set", "predict.calibrate=on"])
    main(base + ["--out", str(tmp_path / "off")] + over + ["--set", "predict.calibrate=off"])
    on, off = np.load(tmp_path / "on" / "test.npz"), np.load(tmp_path / "off" / "test.npz")
    oof = np.load(tmp_path / "on" / "oof.npz")["tta"]
    truth = load_cache(ws / "cache" / "train").keypoints_orig
    np.testing.assert_allclose(on["bias"], (oof - truth).mean(0))
    assert bool(on["calibrated"]) and not bool(off["calibrated"])
    np.testing.assert_allclose(on["ensemble"], off["ensemble"] - on["bias"])
    np.testing.assert_allclose(off["ensemble"], off["ensemble_raw"])


def test_label_origin_moves_labels_onto_the_pixel_grid_and_predictions_back(demo_dir, tmp_path):
    from pipeline.inference.tta import predict_original
    from pipeline.keypoints.geometry import to_crop
    from pipeline.stages.crop import run_crop

    caches = {}
    for origin in (0, 1):
        cfg = load_config(None, [f"data.dir={demo_dir}", "crop.side=32", "crop.n_jobs=1",
                                 f"data.label_origin={origin}"])
        run_crop(cfg, tmp_path / f"o{origin}")
        caches[origin] = load_cache(tmp_path / f"o{origin}" / "train")
    c0, c1 = caches[0], caches[1]
    assert c1.info["label_origin"] == 1.0
    np.testing.assert_array_equal(c0.keypoints_orig, c1.keypoints_orig)  # the labels as written
    np.testing.assert_allclose(c1.keypoints, to_crop(c1.keypoints_orig - 1.0, c1.crop_to_orig), atol=1e-4)
    assert np.abs(c1.keypoints - c0.keypoints).min() > 0.05  # the crop targets really moved

    coords = np.tile([[10.0, 12.0]], (68, 1))
    ckpt = {"model_config": {"input_size": 32, "in_chans": 3}, "schema": IBUG68.to_dict()}
    faces, a = c0.faces[:2], c0.crop_to_orig[:2]
    plain = predict_original(Fixed(coords), {**ckpt, "crop": {"label_origin": 0.0}}, faces, a, "none", 8,
                             torch.device("cpu"))["final"]
    shifted = predict_original(Fixed(coords), {**ckpt, "crop": {"label_origin": 1.0}}, faces, a, "none", 8,
                               torch.device("cpu"))["final"]
    np.testing.assert_allclose(shifted, plain + 1.0)


def _project(trained, root):
    """A project laid out as `pipeline train` writes it: root/models/fold{0,1}/best.pt."""
    for fold in (0, 1):
        (root / "models" / f"fold{fold}").mkdir(parents=True)
        shutil.copy(trained / f"fold{fold}" / "best.pt", root / "models" / f"fold{fold}" / "best.pt")
    return sorted(str(p) for p in root.glob("models/fold*/best.pt"))


@pytest.mark.parametrize("calibrate", ["on", "off"])
def test_submit_xml_writes_the_stage_csv_byte_for_byte(tiny_workspace, trained, demo_dir, tmp_path, capsys,
                                                       caplog, calibrate):
    """`pipeline submit --xml <test XML> --checkpoints models/fold*/best.pt` with the predict
    params of `pipeline predict` -> `pipeline submit` writes that CSV, OOF calibration included."""
    ws, root = tiny_workspace, tmp_path / "proj"
    ckpts = _project(trained, root)
    over = sum((["--set", s] for s in TINY + [f"predict.calibrate={calibrate}"]), [])
    main(["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(root / "models"),
          "--out", str(root / "predictions")] + over)
    assert bool(np.load(root / "predictions" / "test.npz")["calibrated"]) == (calibrate == "on")
    main(["submit", "--predictions", str(root / "predictions" / "test.npz"), "--cache", str(ws / "cache"),
          "--out", str(root / "stage.csv")] + over)
    xml = demo_dir / load_config(None).data.test_xml
    code, _, err = run_cli(["submit", "--xml", xml, "--checkpoints", *ckpts, "--out", root / "xml.csv"] + over, capsys)
    assert code == 0, err
    assert (root / "xml.csv").read_bytes() == (root / "stage.csv").read_bytes()
    if calibrate == "off":
        return
    # without the calibration: the raw fold mean, which the stage's CSV is not
    code, _, err = run_cli(["submit", "--xml", xml, "--checkpoints", *ckpts, "--out", root / "raw.csv",
                            "--calibration", "off"] + over, capsys)
    assert code == 0, err
    raw = read_submission(root / "raw.csv").reshape(-1, 68, 2)
    np.testing.assert_allclose(raw, np.load(root / "predictions" / "test.npz")["ensemble_raw"], atol=5e-7)
    assert (root / "raw.csv").read_bytes() != (root / "stage.csv").read_bytes()
    # other predict params than the predictions': auto warns and leaves the calibration out,
    # a named predictions file is an error
    notta = over + ["--set", "predict.tta=none"]
    code, _, err = run_cli(["submit", "--xml", xml, "--checkpoints", *ckpts, "--out", root / "none.csv"] + notta,
                           capsys)
    assert code == 0, err
    assert "OOF calibration not applied" in caplog.text and "predict.tta none" in caplog.text
    code, _, err = run_cli(["submit", "--xml", xml, "--checkpoints", *ckpts, "--out", root / "bad.csv",
                            "--calibration", root / "predictions" / "test.npz"] + notta, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "test.npz: cannot calibrate" in err, err
    assert not (root / "bad.csv").exists()


def test_submit_xml_calibrates_only_with_the_checkpoints_predict_used(tiny_workspace, trained, demo_dir, tmp_path,
                                                                   capsys, caplog):
    """Issue 48, finding 2: test.npz records the identity (content hash of the weights and
    crop geometry) of the checkpoints it was made from and the predict params it needs;
    `submit --xml --calibration auto` applies its bias only for those very checkpoints (not
    others at the same paths, retrained after predict ran) and those params, even without
    predictions/params.resolved.yaml, and otherwise says in one line that it skipped and why."""
    from pipeline.formats.checkpoint import checkpoint_identity

    ws, root = tiny_workspace, tmp_path / "proj"
    ckpts = _project(trained, root)
    over = sum((["--set", s] for s in TINY + ["predict.calibrate=on"]), [])
    main(["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(root / "models"),
          "--out", str(root / "predictions")] + over)
    test_npz = root / "predictions" / "test.npz"
    z = np.load(test_npz)
    loaded = [load_checkpoint(c) for c in ckpts]
    assert [str(h) for h in z["checkpoint_identity"]] == [checkpoint_identity(ck) for ck in loaded]
    assert len(set(z["checkpoint_identity"])) == 2
    # what the weights predict with, not the file's bytes: a run's params (recorded in the
    # checkpoint, speed-only ones included) do not change it, one weight does
    other_params = {**loaded[0], "config": {**loaded[0]["config"], "crop": {"n_jobs": 7}}}
    assert checkpoint_identity(other_params) == checkpoint_identity(loaded[0])
    moved = {**loaded[0], "model": {k: v + 1e-3 if v.is_floating_point() else v for k, v in loaded[0]["model"].items()}}
    assert checkpoint_identity(moved) != checkpoint_identity(loaded[0])
    xml = demo_dir / load_config(None).data.test_xml

    def submit(name, *extra):
        caplog.clear()
        with caplog.at_level("INFO"):
            code, _, err = run_cli(["submit", "--xml", xml, "--checkpoints", *ckpts, "--out", root / name,
                                    *extra] + over, capsys)
        assert code == 0, err
        return [r.getMessage() for r in caplog.records if "calibration" in r.getMessage()]

    assert any("applied" in line and "not applied" not in line for line in submit("applied.csv"))
    submit("raw.csv", "--calibration", "off")
    assert (root / "applied.csv").read_bytes() != (root / "raw.csv").read_bytes()

    # fold 1 retrained after predict ran (here: one weight moved), at the same path
    original = open(ckpts[1], "rb").read()
    ck = torch.load(ckpts[1], weights_only=True)
    name = next(k for k, v in ck["model"].items() if v.is_floating_point())
    ck["model"][name] += 0.01
    torch.save(ck, ckpts[1])
    lines = submit("other.csv")
    assert len(lines) == 1 and "OOF calibration not applied" in lines[0] and ckpts[1] in lines[0], lines
    submit("other_raw.csv", "--calibration", "off")
    assert (root / "other.csv").read_bytes() == (root / "other_raw.csv").read_bytes()
    code, _, err = run_cli(["submit", "--xml", xml, "--checkpoints", *ckpts, "--out", root / "bad.csv",
                            "--calibration", test_npz] + over, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "test.npz: cannot calibrate" in err, err
    assert not (root / "bad.csv").exists()
    with open(ckpts[1], "wb") as f:
        f.write(original)

    # the predict params come from test.npz itself: without params.resolved.yaml another
    # tta_jitter (the OOF bias of other views) is still not applied
    (root / "predictions" / "params.resolved.yaml").unlink()
    lines = submit("jitter.csv", "--set", "predict.tta_jitter=0.05")
    assert len(lines) == 1 and "OOF calibration not applied" in lines[0] and "predict.tta_jitter" in lines[0], lines
    assert any("applied" in line and "not applied" not in line for line in submit("again.csv"))
    assert (root / "again.csv").read_bytes() == (root / "applied.csv").read_bytes()


def test_a_models_identity_is_its_checkpoints_under_either_backend(trained, tmp_path):
    """test.npz names a fold's model by its checkpoint's identity whichever backend loaded it
    (the torch backend's meta is the checkpoint; an onnx backend's holds no weights: the file
    is read), and `submit --xml` compares them the same way; an exported .onnx model is no
    checkpoint: never the one its calibration was fitted for."""
    from pipeline.core.config import result_params
    from pipeline.core.device import resolve_device
    from pipeline.core.errors import PipelineError
    from pipeline.formats.checkpoint import checkpoint_identity, model_identity
    from pipeline.formats.predictions import write_test_predictions
    from pipeline.inference.predictor import model_runtime
    from pipeline.stages.submit import calibration_mismatch

    path, absent = trained / "fold0" / "best.pt", tmp_path / "absent.pt"
    ckpt = load_checkpoint(path)
    meta_only = {k: v for k, v in ckpt.items() if k != "model"}
    want = checkpoint_identity(ckpt)
    assert model_identity(absent, ckpt) == want  # the torch meta: the path is not read
    assert model_identity(path, meta_only) == want
    with pytest.raises(PipelineError, match="checkpoint not found"):
        model_identity(absent, meta_only)

    cfg = load_config(None, TINY)
    npz, k = tmp_path / "test.npz", IBUG68.k
    write_test_predictions(npz, ensemble=np.zeros((1, k, 2)), ensemble_raw=np.zeros((1, k, 2)),
                           per_fold=np.zeros((1, 1, k, 2)), folds=[0], bias=np.zeros((k, 2)), calibrated=True,
                           oof_kind="tta" if cfg.predict.tta == "flip" else "plain", face_id=["f0"],
                           keypoint_names=IBUG68.names, checkpoint_identity=[want],
                           runtime=[model_runtime(ckpt, cfg.predict.amp, resolve_device(cfg.predict.device))],
                           predict_params=result_params(cfg, ["predict"])["predict"])
    assert calibration_mismatch(npz, cfg.predict, [path], [ckpt], IBUG68) is None
    assert calibration_mismatch(npz, cfg.predict, [path], [meta_only], IBUG68) is None
    onnx = tmp_path / "best.onnx"
    assert calibration_mismatch(npz, cfg.predict, [onnx], [meta_only], IBUG68) == (
        f"made from other checkpoints than {onnx} (not the weights `pipeline predict` used)")


def test_a_folds_val_nme_is_its_oof_nme_without_tta(tiny_workspace, tmp_path):
    """Issue 48, finding 4: validation is scored as `pipeline predict` scores out of fold
    (predict.amp auto's precision, fp32 on a CPU, whatever train.amp; the same decode), so
    metrics.json's val NME and MAE are the fold's OOF figures without TTA in metrics/oof.json."""
    from pipeline.stages.evaluate import run_evaluate

    ws = tiny_workspace
    sets = TINY + ["folds.train=[0]", "train.epochs=2", "train.amp=bf16", "train.device=cpu", "predict.device=cpu"]
    fit(load_config(None, sets), 0, ws / "cache", ws / "folds.csv", tmp_path / "models", resume=False)
    main(["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(tmp_path / "models"),
          "--out", str(tmp_path / "pred")] + sum((["--set", s] for s in sets), []))
    run_evaluate(load_config(None, sets), ws / "cache", ws / "folds.csv", tmp_path / "pred", tmp_path / "metrics",
                 history=False)
    val = json.loads((tmp_path / "models" / "fold0" / "metrics.json").read_text())
    oof = json.loads((tmp_path / "metrics" / "oof.json").read_text())["per_fold"]["0"]
    assert val["val_nme"] == pytest.approx(oof["nme_notta"], rel=1e-6, abs=0)
    assert val["val_mae"] == pytest.approx(oof["mae_notta"], rel=1e-6, abs=0)


def test_tta_none_with_jitter_is_a_one_line_param_error(tiny_workspace, trained, tmp_path, capsys):
    """Jitter views are scored out of fold only with flip TTA: tta none with jitter is refused
    before anything loads or is written."""
    ws = tiny_workspace
    over = sum((["--set", s] for s in TINY + ["predict.tta=none", "predict.tta_jitter=0.1"]), [])
    code, _, err = run_cli(["predict", "--cache", ws / "cache", "--folds", ws / "folds.csv", "--models", trained,
                            "--out", tmp_path / "pred"] + over, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--set predict.tta_jitter=0.1" in err and "predict.tta_jitter 0.1 needs predict.tta flip" in err
    assert not (tmp_path / "pred").exists()


def _submit_xml(xml, ckpts, out, over, capsys, caplog, *extra):
    """`submit --xml` -> (exit code, stderr, its log lines about the calibration)."""
    caplog.clear()
    with caplog.at_level("INFO"):
        code, _, err = run_cli(["submit", "--xml", xml, "--checkpoints", *ckpts, "--out", out, *extra] + over, capsys)
    return code, err, [r.getMessage() for r in caplog.records if "calibration" in r.getMessage()]


def test_a_repeated_checkpoint_is_another_ensemble_and_gets_no_calibration(tiny_workspace, trained, demo_dir,
                                                                          tmp_path, capsys, caplog):
    """The OOF bias `pipeline predict` fitted for folds 0 and 1 is for their mean: fold 0
    given twice is another ensemble (the same models, counted otherwise), so `submit --xml`
    skips the calibration with one line saying why, and refuses it when told to use it."""
    ws, root = tiny_workspace, tmp_path / "proj"
    ckpts = _project(trained, root)
    over = sum((["--set", s] for s in TINY + ["predict.calibrate=on"]), [])
    main(["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(root / "models"),
          "--out", str(root / "predictions")] + over)
    xml, twice = demo_dir / load_config(None).data.test_xml, [ckpts[0], ckpts[0]]
    code, err, lines = _submit_xml(xml, twice, root / "twice.csv", over, capsys, caplog)
    assert code == 0, err
    assert len(lines) == 1 and "OOF calibration not applied" in lines[0] and "twice" in lines[0], lines
    code, err, _ = _submit_xml(xml, twice, root / "twice_raw.csv", over, capsys, caplog, "--calibration", "off")
    assert code == 0, err
    assert (root / "twice.csv").read_bytes() == (root / "twice_raw.csv").read_bytes()
    code, err, _ = _submit_xml(xml, twice, root / "bad.csv", over, capsys, caplog,
                               "--calibration", root / "predictions" / "test.npz")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "test.npz: cannot calibrate" in err, err
    assert not (root / "bad.csv").exists()


def test_predict_records_the_exported_int8_models_that_ran(tiny_workspace, trained, demo_dir, tmp_path, capsys,
                                                            caplog):
    """After `export --int8`, `predict --backend onnx` runs each fold's int8 twin: test.npz
    records that (the backend, the precision and the .onnx file's hash), so `submit --xml`
    with the checkpoints (the torch backend, fp32) does not apply the int8 models' bias."""
    pytest.importorskip("onnxruntime.quantization")
    from pipeline.core.digest import file_sha256

    ws, root = tiny_workspace, tmp_path / "proj"
    ckpts = _project(trained, root)
    for c in ckpts:
        main(["export", c, "--int8", "--no-verify"])
    over = sum((["--set", s] for s in TINY + ["predict.calibrate=on"]), [])
    main(["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models", str(root / "models"),
          "--out", str(root / "predictions"), "--backend", "onnx"] + over)
    z = np.load(root / "predictions" / "test.npz")
    xml = demo_dir / load_config(None).data.test_xml
    code, err, lines = _submit_xml(xml, ckpts, root / "torch.csv", over, capsys, caplog)
    assert code == 0, err
    assert len(lines) == 1 and "OOF calibration not applied" in lines[0] and "onnx int8" in lines[0], lines
    code, err, _ = _submit_xml(xml, ckpts, root / "raw.csv", over, capsys, caplog, "--calibration", "off")
    assert code == 0, err
    assert (root / "torch.csv").read_bytes() == (root / "raw.csv").read_bytes()
    assert [str(r) for r in z["runtime"]] == [f"onnx int8 {file_sha256(Path(c).with_suffix('.onnx'))}"
                                              for c in ckpts]


def test_the_calibration_is_for_one_multiset_of_models_one_backend_and_precision(trained, tmp_path):
    """`calibration_mismatch` compares the models that ran, each with how it ran (backend,
    precision), as a multiset: the same checkpoints under another autocast precision, or one
    of them twice, are not what the bias was fitted for."""
    from pipeline.core.config import result_params
    from pipeline.formats.checkpoint import checkpoint_identity
    from pipeline.formats.predictions import write_test_predictions
    from pipeline.stages.submit import calibration_mismatch

    paths = [trained / "fold0" / "best.pt", trained / "fold1" / "best.pt"]
    metas = [load_checkpoint(p) for p in paths]
    cfg = load_config(None, TINY + ["predict.device=cpu"])
    npz, k = tmp_path / "test.npz", IBUG68.k

    def made(runtime):
        write_test_predictions(npz, ensemble=np.zeros((1, k, 2)), ensemble_raw=np.zeros((1, k, 2)),
                               per_fold=np.zeros((2, 1, k, 2)), folds=[0, 1], bias=np.zeros((k, 2)),
                               calibrated=True, oof_kind="tta", face_id=["f0"], keypoint_names=IBUG68.names,
                               checkpoint_identity=[checkpoint_identity(m) for m in metas], runtime=runtime,
                               predict_params=result_params(cfg, ["predict"])["predict"])

    made(["torch fp32", "torch fp32"])
    assert calibration_mismatch(npz, cfg.predict, paths, metas, IBUG68) is None
    assert calibration_mismatch(npz, cfg.predict, paths[::-1], metas[::-1], IBUG68) is None  # a multiset
    assert "twice" in calibration_mismatch(npz, cfg.predict, paths[:1] * 2, metas[:1] * 2, IBUG68)
    bf16 = load_config(None, TINY + ["predict.device=cpu", "predict.amp=bf16"]).predict
    assert "torch fp32" in calibration_mismatch(npz, bf16, paths, metas, IBUG68)
    made(["torch bf16", "torch bf16"])
    assert calibration_mismatch(npz, bf16, paths, metas, IBUG68) is None
    made(["onnx fp32 " + "0" * 64, "torch fp32"])
    assert "onnx fp32" in calibration_mismatch(npz, cfg.predict, paths, metas, IBUG68)
