"""ONNX export and the inference backends: torch vs onnxruntime agreement on demo crops
(< 0.01 px), the export JSON and its one reader, `--backend onnx` / a .onnx checkpoint in
predict, predict-image, heatmaps and morph, BatchNorm folding, and the single reader of a
checkpoint's crop geometry (a model trained on one crop, with other params on disk)."""

import json

import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.formats.checkpoint import checkpoint_crop, load_model
from pipeline.inference.tta import predict_crops
from pipeline.keypoints.schema import IBUG68
from pipeline.stages.train import fit

from helpers import run

ort = pytest.importorskip("onnxruntime", reason="onnx backend tests need onnxruntime (pip install '.[onnx]')")

# trained on the 32 px / expand 1.25 cache of tiny_workspace, with other crop params on
# disk: the checkpoint's stamped geometry must win everywhere; with the CPU recipe's
# upsampled maps, so the ONNX graph carries the bilinear resize before the head
TINY = ["crop.side=48", "crop.expand=1.6", "model.input_size=32", "train.batch_size=8", "train.epochs=1",
        "folds.k=2", "folds.train=[0,1]", "train.randaug_n=1", "train.device=cpu", "model.options.map_upsample=2"]




@pytest.fixture(scope="module")
def trained(tiny_workspace, tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    fit(load_config(None, TINY), 0, tiny_workspace / "cache", tiny_workspace / "folds.csv", models, resume=False)
    return models / "fold0" / "best.pt"


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "tiny.onnx"
    assert run(["export", trained, "--out", out]) == 0
    return out


def test_checkpoint_crop_reads_the_stamped_geometry_first(trained):
    ckpt = torch.load(trained, weights_only=True)
    assert ckpt["config"]["crop"]["side"] == 48 and ckpt["config"]["crop"]["expand"] == 1.6
    assert checkpoint_crop(ckpt) == (32, 1.25)  # the cache the model saw
    with pytest.raises(PipelineError, match="m.pt: bad crop geometry"):
        checkpoint_crop({"config": {"crop": {"size": 40, "expand": 1.5}}}, "m.pt")  # the params are not the cache
    with pytest.raises(PipelineError, match="bad crop geometry"):
        checkpoint_crop({"crop": {"size": "x"}}, "m.pt")


def test_export_writes_onnx_and_json(exported, trained):
    meta = json.loads(exported.with_suffix(".json").read_text())
    assert meta["crop"]["size"] == 32 and meta["crop"]["expand"] == 1.25
    assert meta["input"]["size"] == [32, 32] and meta["input"]["layout"] == "NCHW"
    assert meta["schema"]["names"] == list(IBUG68.names) and meta["flip"]["perm"] == list(IBUG68.flip_perm)
    assert len(meta["normalisation"]["mean"]) == 3
    assert meta["verify"]["max_abs_diff_px_plain"] < 0.01 and meta["verify"]["max_abs_diff_px_tta"] < 0.01
    sess = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["image"]
    assert [o.name for o in sess.get_outputs()] == ["coords", "probs"]
    # dynamic batch: 3 faces in one call
    coords, probs = sess.run(None, {"image": np.zeros((3, 3, 32, 32), np.float32)})
    assert coords.shape == (3, 68, 2) and probs.shape[:2] == (3, 68)
    np.testing.assert_allclose(probs.sum((2, 3)), 1, atol=1e-4)


@pytest.mark.parametrize("source", ["cache", "demo"])
def test_torch_and_onnxruntime_agree_on_demo_crops(exported, trained, tiny_workspace, source):
    from pipeline.formats.cache import load_cache
    from pipeline.inference.predictor import load_predictor
    from pipeline.tools.export import demo_crops

    model, ckpt = load_model(trained, "cpu")  # the plain (unfused) torch model is the reference
    faces = np.array(load_cache(tiny_workspace / "cache" / "test").faces) if source == "cache" else demo_crops(32)
    kw = dict(input_size=32, in_chans=3, flip_perm=IBUG68.flip_perm)
    ref = predict_crops(model, faces, **kw)
    onnx_model, meta = load_predictor(exported, "torch")  # a .onnx file always runs on onnxruntime
    fused, _ = load_predictor(trained, "torch")
    for other in (onnx_model, fused):
        for batch in (1, 64):  # one face at a time and batched
            got = predict_crops(other, faces, batch_size=batch, **kw)
            for k in ("plain", "flip", "tta"):
                assert np.abs(got[k] - ref[k]).max() < 0.01, (type(other).__name__, batch, k)
    assert meta["crop"] == {**meta["crop"], "size": 32, "expand": 1.25}


def test_fused_batchnorm_matches_the_model():
    from pipeline.inference.predictor import fuse_batchnorm
    from pipeline.models import create_model

    torch.manual_seed(0)
    model = create_model("resunet-tiny", 68, input_size=64).eval()
    for m in model.modules():  # non-trivial statistics, so a wrong fold would show
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    fused = fuse_batchnorm(model)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())  # the original is untouched
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (fused(x) - model(x)).abs().max() < 1e-3


def test_predict_cli_onnx_backend_agrees_with_torch(trained, tiny_workspace, tmp_path):
    ws = tiny_workspace
    # the fold layout predict expects: models/fold0/best.pt (+ fold1 absent)
    models = trained.parent.parent
    over = sum((["--set", s] for s in ["crop.side=32", "model.input_size=32", "folds.k=2", "folds.train=[0,1]"]), [])
    base = ["predict", "--cache", ws / "cache", "--folds", ws / "folds.csv", "--models", models]
    assert run(base + ["--out", tmp_path / "t"] + over) == 0
    assert run(base + ["--out", tmp_path / "o", "--backend", "onnx"] + over) == 0
    t, o = np.load(tmp_path / "t" / "test.npz"), np.load(tmp_path / "o" / "test.npz")
    assert np.abs(t["ensemble"] - o["ensemble"]).max() < 0.01


def test_predict_image_uses_the_checkpoint_crop_and_runs_from_onnx(trained, exported, tiny_workspace, demo_dir,
                                                                  tmp_path, monkeypatch):
    import pipeline.inference.landmarker as landmarker
    from pipeline.formats.annotations import read_image
    from pipeline.formats.cache import load_cache
    from pipeline.inference.tta import predict_original
    from pipeline.keypoints.geometry import crop_one, crop_transform

    meta = load_cache(tiny_workspace / "cache" / "test").meta
    row = meta.iloc[0]
    photo = demo_dir / row.image
    box = np.array([[row.box_left, row.box_top, row.box_width, row.box_height]], dtype=np.float64)
    # the detector is not under test here: it returns the face's own box
    monkeypatch.setattr(landmarker, "locate_faces", lambda image, max_faces=0, detector=None: (box, box))
    image = read_image(photo)
    model, ckpt = load_model(trained, "cpu")

    def expected(size, expand):
        a = crop_transform(box[0], expand, size)[None]
        face = crop_one(image, a[0], size)[None]
        return predict_original(model, ckpt, face, a, "flip", 8, torch.device("cpu"))["final"][0]

    got = {}
    for name, ck in (("pt", trained), ("onnx", exported)):
        out = tmp_path / name
        # --keep-all: the tiny model's flat maps pass no presence threshold; the points are under test
        assert run(["predict-image", photo, "--checkpoint", ck, "--out-dir", out, "--keep-all"]) == 0
        res = json.loads((out / f"{photo.stem}_keypoints.json").read_text())
        got[name] = np.asarray(res["faces"][0]["points"])
    right, wrong = expected(32, 1.25), expected(48, 1.6)
    assert np.abs(wrong - right).max() > 0.5  # the two geometries are distinguishable
    assert np.abs(got["pt"] - right).max() < 0.01
    assert np.abs(got["onnx"] - right).max() < 0.01


def test_heatmaps_and_morph_crop_photos_with_the_checkpoint_geometry(trained, tiny_workspace, demo_dir,
                                                                   monkeypatch):
    """A photo given to `heatmaps` or `morph` is cropped at the checkpoint's stamped geometry
    (32 px, expand 1.25), not at the params it was trained with (48 px, 1.6)."""
    import pipeline.inference.photos as photos
    from pipeline.formats.annotations import read_image
    from pipeline.formats.cache import load_cache
    from pipeline.inference.landmarker import Landmarker
    from pipeline.inference.tta import predict_original
    from pipeline.keypoints.geometry import crop_one, crop_transform, to_crop
    from pipeline.tools.morph import morph_face
    from pipeline.tools.viz import face_from_source

    row = load_cache(tiny_workspace / "cache" / "test").meta.iloc[0]
    photo = demo_dir / row.image
    box = np.array([[row.box_left, row.box_top, row.box_width, row.box_height]], dtype=np.float64)
    monkeypatch.setattr(photos, "locate_faces", lambda image, max_faces=0, detector=None: (box, box))
    image = read_image(photo)
    model, ckpt = load_model(trained, "cpu")

    face, _ = face_from_source(str(photo), ckpt, str(tiny_workspace / "cache"))
    np.testing.assert_array_equal(face, crop_one(image, crop_transform(box[0], 1.25, 32), 32))
    assert face.shape == (32, 32, 3)

    landmarker = Landmarker.from_checkpoints([trained], device="cpu")
    frame, pts, _ = morph_face(str(photo), landmarker, load_config(None, []), str(tiny_workspace / "cache"), "test",
                               40, 1.6, str(demo_dir))
    a = crop_transform(box[0], 1.6, 40)  # the morph frame's own view of the photo
    stamped = crop_transform(box[0], 1.25, 32)[None]  # the model's own crop of the face
    want = predict_original(model, ckpt, crop_one(image, stamped[0], 32)[None], stamped, "flip", 8,
                            torch.device("cpu"))["final"][0]
    # the Landmarker folds BatchNorm into the convs: equal up to float rounding
    np.testing.assert_allclose(pts, to_crop(want[None], a[None])[0], atol=1e-3)
    other = Landmarker([(m, {**c, "crop": {"size": 48, "expand": 1.6, "label_origin": 0.0}})  # the params
                        for m, c in zip(landmarker.models, landmarker.metas)])
    assert np.abs(other.predict(image, box)[0] - want).max() > 0.5


def test_heatmaps_and_morph_from_an_exported_model(exported, tiny_workspace, demo_dir, tmp_path):
    import cv2

    h = tmp_path / "h.png"
    assert run(["heatmaps", "1", "--checkpoint", exported, "--cache", tiny_workspace / "cache", "--points", "36,45",
                "--tile", 32, "--out", h]) == 0
    assert cv2.imread(str(h)) is not None
    gif = tmp_path / "m.gif"
    assert run(["morph", "0", "1", "--checkpoint", exported, "--cache", tiny_workspace / "cache",
                "--data-dir", demo_dir, "--frames", 3, "--size", 32, "--out", gif]) == 0
    assert gif.read_bytes()[:6] == b"GIF89a"


def test_bad_exports_are_one_line_errors(exported, tmp_path, capsys):
    import shutil

    onnx = tmp_path / "m.onnx"
    shutil.copy(exported, onnx)
    photo = tmp_path / "p.png"
    photo.write_bytes(b"")
    argv = ["heatmaps", "0", "--checkpoint", onnx, "--out", tmp_path / "h.png"]
    assert run(argv) == 2  # no JSON beside it
    err = capsys.readouterr().err.strip()
    assert "m.json" in err and "missing" in err and len(err.splitlines()) == 1
    meta = json.loads(exported.with_suffix(".json").read_text())
    (tmp_path / "m.json").write_text("{not json")
    assert run(argv) == 2
    assert "not valid JSON" in capsys.readouterr().err
    (tmp_path / "m.json").write_text(json.dumps({**meta, "onnx_sha256": "0" * 64}))
    assert run(argv) == 2
    assert "sha256 differs" in capsys.readouterr().err
    (tmp_path / "m.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "crop"}))
    assert run(argv) == 2
    assert "not an export JSON" in capsys.readouterr().err
    assert run(["export", tmp_path / "missing.pt", "--out", tmp_path / "x.onnx"]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("src,dst", [(96, 64), (64, 96), (32, 64), (128, 96)])
def test_matmul_resize_is_the_antialiased_interpolate(src, dst):
    # predict's cache -> input resize runs as R @ X @ R.T (cheaper at batch 1); it must stay
    # the filter the models were validated with
    import torch.nn.functional as F

    from pipeline.keypoints.preprocess import resize_batch

    x = torch.rand(2, 3, src, src, generator=torch.Generator().manual_seed(0)) * 4 - 2
    ref = F.interpolate(x, size=(dst, dst), mode="bilinear", align_corners=False, antialias=True)
    assert (resize_batch(x, dst) - ref).abs().max() < 1e-4
    assert (resize_batch(x.contiguous(memory_format=torch.channels_last), dst) - ref).abs().max() < 1e-4


def test_int8_export_is_close_to_fp32(trained, tiny_workspace, tmp_path):
    from pipeline.formats.cache import load_cache
    from pipeline.inference.predictor import load_predictor

    out = tmp_path / "q.onnx"
    assert run(["export", trained, "--out", out, "--int8", "--calibration", tiny_workspace / "cache" / "train"]) == 0
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["precision"] == "int8" and "cache" in meta["quantization"]["calibration"]
    import onnx

    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "QuantizeLinear" in ops and "Softmax" in ops  # convs quantized, soft-argmax float
    faces = np.array(load_cache(tiny_workspace / "cache" / "test").faces)
    kw = dict(input_size=32, in_chans=3, flip_perm=IBUG68.flip_perm)
    ref = predict_crops(load_model(trained, "cpu")[0], faces, **kw)["tta"]
    got = predict_crops(load_predictor(out)[0], faces, **kw)["tta"]
    assert np.isfinite(got).all() and np.abs(got - ref).mean() < 0.5  # px in a 32 px crop
    # a cache of another crop size cannot calibrate this model
    assert run(["export", trained, "--out", tmp_path / "r.onnx", "--int8", "--calibration", tmp_path]) == 2


@pytest.mark.realdata
def test_torch_and_onnxruntime_agree_on_the_shared_test_crops(exported, trained, real_dir):
    from pipeline.formats.annotations import crop_faces, load_xml
    from pipeline.inference.predictor import load_predictor

    xml = real_dir / "labels_ibug_300W_test_parsed.xml"
    faces = load_xml(xml, IBUG68, require_parts=False)
    crops, _ = crop_faces(faces, real_dir, 32, 1.25, 1, xml)  # the checkpoint's geometry
    kw = dict(input_size=32, in_chans=3, flip_perm=IBUG68.flip_perm)
    ref = predict_crops(load_model(trained, "cpu")[0], crops, **kw)
    got = predict_crops(load_predictor(exported)[0], crops, **kw)
    for k in ("plain", "tta"):
        assert np.abs(got[k] - ref[k]).max() < 0.01, k


def test_onnx_backend_uses_the_exported_twin_only_when_it_matches(trained, tmp_path, caplog):
    import logging
    import shutil

    from pipeline.inference.predictor import load_predictor

    pt = tmp_path / "best.pt"
    shutil.copy(trained, pt)
    assert run(["export", pt, "--no-verify"]) == 0  # -> best.onnx + best.json beside it
    assert (tmp_path / "best.onnx").is_file() and (tmp_path / "best.json").is_file()
    with caplog.at_level(logging.INFO, logger="pipeline.inference.predictor"):
        load_predictor(pt, "onnx")
    assert "exported from best.pt" in caplog.text
    caplog.clear()
    ckpt = torch.load(pt, weights_only=True)
    ckpt["epoch"] += 1  # another checkpoint under the same name: the twin is stale
    torch.save(ckpt, pt)
    with caplog.at_level(logging.INFO, logger="pipeline.inference.predictor"):
        model, meta = load_predictor(pt, "onnx")
    assert "exported from another checkpoint" in caplog.text and meta["epoch"] == ckpt["epoch"]
