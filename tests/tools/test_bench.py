"""`pipeline bench` on tiny settings: every figure is present, finite and positive, and the
mean-shape baseline is exact when every face is the mean shape. No timing thresholds."""

import json
import math

import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.tools.bench.command import run_bench
from pipeline.tools.bench.references import box_normalised, mean_shape_baseline, place_in_boxes
from pipeline.tools.bench.report import format_table

TRAIN_KEYS = {"images_per_s_real", "images_per_s_synthetic", "ratio_real_synthetic", "train_flops_per_image",
              "compute_efficiency_synthetic", "compute_efficiency_real"}
INFER_KEYS = {"bs1_plain", "bs1_flip", "bsN_plain", "bsN_flip",
              "bs1_plain_1thread", "bs1_flip_1thread", "bsN_plain_1thread", "bsN_flip_1thread"}
ACC_KEYS = {"mae", "nme", "faces_per_s"}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """An untrained resunet-tiny checkpoint at 32 px (the accuracy path only needs weights)."""
    from pipeline.formats.checkpoint import save_checkpoint
    from pipeline.keypoints.schema import IBUG68
    from pipeline.models import create_model

    torch.manual_seed(0)
    model = create_model("resunet-tiny", 68, input_size=32)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    cfg = load_config(None, ["crop.side=32", "model.input_size=32"])
    save_checkpoint(path, {"model_config": model.config, "model": model.state_dict(), "schema": IBUG68.to_dict(),
                           "epoch": 0, "config": cfg.model_dump(), "crop": {"size": 32, "expand": cfg.crop.expand,
                                                               "label_origin": 0.0}})
    return path


def test_bench_tiny_has_every_figure(tmp_path, demo_dir, tiny_checkpoint, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "bench.json"
    argv = ["bench", "--set", "crop.n_jobs=1", "--set", "train.batch_size=4",
            "--presets", "resunet-tiny", "--steps", "1", "--rounds", "1", "--input-size", "32",
            "--infer-batch", "4", "--min-time", "0.01", "--matmul-n", "128", "--data", str(demo_dir),
            "--checkpoints", str(tiny_checkpoint), "--out", str(out),
            "--set", "video.presence=off"]  # the untrained model's flat maps pass no presence threshold
    main(argv)
    res = json.loads(out.read_text())
    assert _positive(res["matmul_peak_flops"]["fp32"])
    tr = res["train"]["resunet-tiny"]
    assert TRAIN_KEYS <= set(tr)
    assert all(_positive(tr[k]) for k in TRAIN_KEYS), tr
    assert math.isfinite(tr["data_overhead"])
    inf = res["infer"]["resunet-tiny"]
    assert INFER_KEYS <= set(inf)
    assert all(_positive(inf[k]) for k in INFER_KEYS), inf
    acc = res["accuracy"]
    assert acc["n_test"] == 8
    for name in ("mean_shape", f"checkpoint:{tiny_checkpoint}"):
        assert ACC_KEYS <= set(acc[name]), (name, acc[name])
        assert all(_positive(acc[name][k]) for k in ACC_KEYS), (name, acc[name])
    assert _positive(acc[f"checkpoint:{tiny_checkpoint}"]["faces_per_s_1thread"])
    # dlib: scored when the optional extra is installed, else a skip note
    assert "skipped" in acc["dlib"] or all(_positive(acc["dlib"][k]) for k in ("mae", "nme", "faces_per_s_1thread"))
    # batch 1 on one core, the first checkpoint through every backend (onnx when installed)
    assert res["batch1_model"] == str(tiny_checkpoint)
    for name in ("torch-eager", "torch", "onnx", "onnx-int8"):
        r = res["batch1"][name]
        assert ("skipped" in r and name.startswith("onnx")) or (_positive(r["plain"]) and _positive(r["flip"])), (name, r)
    assert "skipped" in res["batch1"]["dlib"] or _positive(res["batch1"]["dlib"]["plain"])
    assert res["batch1"]["faces"] == 8 and res["batch1"]["crop_size"] == 32  # the demo test faces, cropped
    # video: frames/s end to end and raw / smoothed jitter and NME on the generated test videos
    v = res["video"]
    assert "skipped" in v or (_positive(v["frames_per_s"]) and all(
        math.isfinite(v[kind][k]["nme"]) and v[kind][k]["jitter_px"] >= 0
        for kind in ("still", "moving") for k in ("raw", "smoothed"))), v
    # face detectors on the demo test photos: each installed one measured, the others noted
    det = res["detectors"]
    for name in ("mtcnn", "dlib", "haar"):
        r = det[name]
        assert "skipped" in r or (0 <= r["recall"] <= 1 and r["unmatched_per_photo"] >= 0
                                  and _positive(r["photos_per_s"]) and r["photos"] == 8), (name, r)
    table = capsys.readouterr().out
    assert "one face at a time, one core" in table and "face detectors on" in table
    # every accuracy row says which boxes it ran on, in the JSON and in the table
    for name in ("mean_shape", f"checkpoint:{tiny_checkpoint}", "dlib"):
        assert "skipped" in acc[name] or acc[name]["boxes"].startswith("test XML as given"), (name, acc[name])
        assert "skipped" in acc[name] or f"  boxes: {acc[name]['boxes']}" in table
    assert acc["test_xml_comment"].startswith("Synthetic demo faces") and "the test XML says: Synthetic" in table


def test_bench_without_data_skips_accuracy(tmp_path, monkeypatch):
    # no --data and no ../shared beside the cwd: accuracy is skipped, the rest still runs
    # (the training cache is built from demo data in a temp folder)
    import pipeline.tools.bench.command as bench

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "resolve_data_dir", lambda data: None)
    cfg = load_config(None, ["train.batch_size=2"])
    res = run_bench(cfg, ["resunet-tiny"], steps=1, batch_size=2, input_size=32, data=None, checkpoints=[],
                    device_name="cpu", infer_batch=2, rounds=1, min_time=0.0, matmul_n=64,
                    batch1_presets=["resunet-fast"])
    assert "skipped" in res["accuracy"] and "skipped" in res["detectors"]
    # a further architecture timed one face at a time, untrained, from crops of its input size
    fast = res["batch1_presets"]["resunet-fast"]
    assert fast["input_size"] == fast["crop_size"] == 32
    assert _positive(fast["torch"]["plain"]) and _positive(fast["torch"]["flip"])
    assert "resunet-fast (untrained)" in format_table(res)
    assert _positive(res["train"]["resunet-tiny"]["images_per_s_real"])
    assert _positive(res["batch1"]["torch"]["flip"]) and res["batch1_model"] == "resunet-tiny (untrained)"


def test_mean_shape_baseline_is_exact_on_mean_faces():
    rng = np.random.default_rng(0)
    shape = rng.uniform(0.1, 0.9, (68, 2))  # box-normalised
    boxes = np.column_stack([rng.uniform(0, 200, 30), rng.uniform(0, 200, 30),
                             rng.uniform(40, 120, 30), rng.uniform(40, 120, 30)])
    kp = place_in_boxes(shape, boxes)
    np.testing.assert_allclose(box_normalised(kp, boxes), np.broadcast_to(shape, kp.shape), atol=1e-12)
    test_boxes = boxes[:7] * 1.5 + 3
    pred = mean_shape_baseline(kp, boxes, test_boxes)
    truth = place_in_boxes(shape, test_boxes)
    from pipeline.keypoints.metrics import mae

    assert mae(pred, truth) < 1e-9


def test_bench_train_runs_a_regression_preset_with_the_default_regulariser(tiny_workspace):
    # the heatmap regulariser is on by default; a model without soft-argmax maps trains without it
    from pipeline.core.config import load_config
    from pipeline.tools.bench.training import bench_train

    cfg = load_config(None, [])
    assert cfg.train.heatmap_lambda > 0
    res = bench_train(cfg, "resnet50-fc", tiny_workspace / "cache", steps=1, batch_size=4, input_size=32,
                      device=torch.device("cpu"), rounds=1, warmup=0)
    assert res


def test_bench_variants_are_rows_of_one_table(tmp_path, monkeypatch):
    # each --variant is one more training row, named by its overrides, trained with them;
    # on the CPU both matmul peaks are kept and the higher one is the reference
    import pipeline.tools.bench.command as bench
    from pipeline.core.errors import PipelineError
    from pipeline.tools.bench import training
    from pipeline.tools.bench.report import format_table

    seen = []
    real_bench = training.bench_train_variants

    def spy(cfgs, *args, **kwargs):
        seen.extend((cfg.train.channels_last, cfg.train.lr) for cfg in cfgs)
        return real_bench(cfgs, *args, **kwargs)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "resolve_data_dir", lambda data: None)
    monkeypatch.setattr(bench, "bench_train_variants", spy)
    cfg = load_config(None, ["train.batch_size=2", "train.lr=0.01"])
    kw = {"steps": 1, "batch_size": 2, "input_size": 32, "data": None, "checkpoints": [], "device_name": "cpu",
          "infer_batch": 2, "rounds": 1, "min_time": 0.0, "matmul_n": 64, "accuracy": False, "detectors": False}
    res = run_bench(cfg, ["resunet-tiny"], variants=[["train.channels_last=off", "train.lr=0.02"]], **kw)
    name = "resunet-tiny train.channels_last=off train.lr=0.02"
    assert list(res["train"]) == ["resunet-tiny", name]
    assert seen == [("auto", 0.01), ("off", 0.02)]
    assert all(_positive(res["train"][n]["images_per_s_real"]) and res["train"][n]["warmup_s"] >= 0
               for n in res["train"])
    peak = res["matmul_peak_flops"]
    assert _positive(peak["fp32_mkl"]) and _positive(peak["fp32_onednn"])
    assert peak["fp32"] == max(peak["fp32_mkl"], peak["fp32_onednn"])
    assert name in format_table(res)
    with pytest.raises(PipelineError, match="train.nope"):
        run_bench(cfg, ["resunet-tiny"], variants=[["train.nope=1"]], **kw)


def test_bench_variant_model_options_build_the_variant_model(tmp_path, monkeypatch):
    # --variant model.options.X=... must time the model with X, not the plain preset again
    import pipeline.tools.bench.command as bench
    from pipeline.tools.bench import training

    built = []
    real_variant = training._Variant

    def spy(cfg, *args, **kwargs):
        v = real_variant(cfg, *args, **kwargs)
        built.append(v.setup.model.decoder_levels)
        return v

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "resolve_data_dir", lambda data: None)
    monkeypatch.setattr(training, "_Variant", spy)
    cfg = load_config(None, ["train.batch_size=2"])
    kw = {"steps": 1, "batch_size": 2, "input_size": 32, "data": None, "checkpoints": [], "device_name": "cpu",
          "infer_batch": 2, "rounds": 1, "min_time": 0.0, "matmul_n": 64, "accuracy": False, "detectors": False}
    run_bench(cfg, ["resunet-tiny"], variants=[["model.options.decoder_levels=4"]], **kw)
    assert built == [3, 4]


def test_bench_variant_option_splits_on_commas_outside_brackets():
    # a list-valued override (decoder widths) must reach the variant whole, not as "[64" and "32]"
    from pipeline.tools.bench.command import _csv

    assert _csv("model.options.decoder_widths=[64,32,16,8,8], train.lr=0.4") == \
        ["model.options.decoder_widths=[64,32,16,8,8]", "train.lr=0.4"]
    assert _csv("model.options={a: [1, 2], b: 3},x=1") == ["model.options={a: [1, 2], b: 3}", "x=1"]
    assert _csv("resunet-tiny, resunet72,") == ["resunet-tiny", "resunet72"]
    assert _csv(None) == []


def test_bench_times_each_variant_under_its_own_heap_policy(tiny_workspace, monkeypatch):
    # the heap policy is process-wide: a variant with train.keep_freed_memory=off must run
    # its timed steps with it off even though the variant before it turned it on
    from pipeline.core import heap
    from pipeline.tools.bench import training

    applied = []
    monkeypatch.setattr(training, "keep_freed_memory", lambda on: applied.append(on) or on)
    cfgs = [load_config(None, ["train.keep_freed_memory=on", "train.batch_size=2"]),
            load_config(None, ["train.keep_freed_memory=off", "train.batch_size=2"])]
    training.bench_train_variants(cfgs, "resunet-tiny", tiny_workspace / "cache", steps=1, batch_size=2,
                                  input_size=32, device=torch.device("cpu"), rounds=1, warmup=1)
    on = heap.use_keep_freed_memory("on")  # False where the C library is not glibc
    # warm-up (synthetic, real) of each variant, then one round of (real, synthetic) each
    assert applied == [on, on, False, False, on, on, False, False]


def test_bench_times_training_side_by_side_as_train_folds_runs_it(tmp_path, monkeypatch):
    """--side-by-side 2: the first preset's real feed in two one-thread processes at once,
    their images/s summed and set against the one-process row of the same run."""
    import pipeline.tools.bench.command as bench
    from pipeline.core.errors import PipelineError
    from pipeline.tools.train_folds import available_cpus

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "resolve_data_dir", lambda data: None)
    cfg = load_config(None, ["train.batch_size=2"])
    kw = {"steps": 2, "batch_size": 2, "input_size": 32, "data": None, "checkpoints": [], "device_name": "cpu",
          "infer_batch": 2, "rounds": 2, "min_time": 0.0, "matmul_n": 64, "accuracy": False, "detectors": False,
          "video": False, "use_dlib": False}
    with pytest.raises(PipelineError, match="needs 999 CPUs"):
        run_bench(cfg, ["resunet-tiny"], side_by_side=999, **kw)
    if len(available_cpus()) < 2:
        pytest.skip("needs 2 CPUs")
    res = run_bench(cfg, ["resunet-tiny"], side_by_side=2, **kw)
    sbs = res["train_side_by_side"]
    assert sbs["processes"] == 2 and sbs["threads"] == [1, 1] and sbs["row"] == "resunet-tiny"
    assert all(_positive(r) for r in sbs["images_per_s_per_process"])
    assert sbs["images_per_s_real"] == pytest.approx(sum(sbs["images_per_s_per_process"]))
    assert sbs["ratio_to_one_process"] == pytest.approx(
        sbs["images_per_s_real"] / res["train"]["resunet-tiny"]["images_per_s_real"])
    assert "2 processes side by side (1 + 1 threads" in format_table(res)


class _Rect:
    """dlib.rectangle: inclusive corner pixels, ints only."""

    def __init__(self, left, top, right, bottom):
        assert all(isinstance(v, int) for v in (left, top, right, bottom))
        self.corners = (left, top, right, bottom)


class _Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


def _fake_dlib(seen):
    """(a dlib module, a 68-point predictor) that record what the predictor is given."""
    import types

    def predictor(image, rect):
        seen.append((image.shape, rect.corners))
        left, top, right, bottom = rect.corners
        shape = types.SimpleNamespace()
        shape.parts = lambda: [_Point((left + right) / 2, (top + bottom) / 2)] * 68
        return shape

    return types.SimpleNamespace(rectangle=_Rect), predictor


def test_dlib_runs_on_the_test_xml_boxes_as_given(demo_dir, monkeypatch):
    """The accuracy section's dlib row: each face's rectangle is its test XML box itself
    (right = left + width: a HOG box is the detector's rectangle again), on its own photo,
    with a fake dlib so that this runs where dlib is not installed."""
    from pipeline.formats.annotations import load_xml, read_image
    from pipeline.keypoints.schema import IBUG68
    from pipeline.tools.bench import accuracy

    seen: list = []
    monkeypatch.setattr(accuracy, "dlib_or_skip", lambda out: _fake_dlib(seen))
    cfg = load_config(None, ["crop.n_jobs=1"])
    res = accuracy.bench_accuracy(demo_dir, cfg, [], torch.device("cpu"), use_dlib=True)
    faces = load_xml(demo_dir / cfg.data.test_xml, IBUG68, require_parts=False)
    assert len(seen) == len(faces) == res["n_test"]
    for (shape, (left, top, right, bottom)), face in zip(seen, faces):  # the XML's order: one photo per face here
        assert shape == read_image(demo_dir / face.image).shape
        np.testing.assert_array_equal([left, top, right - left, bottom - top], np.round(face.box))
    assert res["dlib"]["boxes"].startswith("test XML as given") and _positive(res["dlib"]["mae"])


def test_batch1_dlib_box_is_the_box_the_crop_was_cut_around(monkeypatch):
    """batch 1's dlib row times dlib on the same crops as the model, with the square box
    each crop was cut around (here a square face box): mapped back through the crop, it is
    that box."""
    from pipeline.keypoints.geometry import crop_one, crop_transform
    from pipeline.models import create_model
    from pipeline.tools.bench import batch1

    seen: list = []
    monkeypatch.setattr(batch1, "dlib_or_skip", lambda out: _fake_dlib(seen))
    box, expand, size = [50.0, 40.0, 64.0, 64.0], 1.25, 40
    a = crop_transform(box, expand, size)
    image = np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8)
    faces = crop_one(image, a, size)[None]
    model = create_model("resunet-tiny", 68, input_size=32)
    meta = {"model_config": model.config, "schema": {"flip": list(range(68))}}
    out = batch1.bench_batch1(model, meta, size, min_time=0.0, faces=faces, expand=expand, rounds=1,
                              backends=("torch-eager",))
    assert seen and _positive(out["dlib"]["plain"]) and "the box the crop was cut around" in out["dlib"]["boxes"]
    left, top, right, bottom = seen[0][1]
    s, edge = a[0, 0], a[:, 2] - 0.5 * a[0, 0] + 0.5  # crop edge u -> photo edge: edge + u * s
    np.testing.assert_allclose([edge[0] + left * s, edge[1] + top * s, (right - left) * s, (bottom - top) * s], box)
