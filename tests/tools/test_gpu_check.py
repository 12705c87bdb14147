"""`python -m pipeline.tools.gpu_check` (make gpu-check): its --cpu dry run runs every check at toy
sizes and passes; without CUDA it refuses with one line (exit 2); a failed or crashing
check makes it exit 1 and the others still run. `--train-real PACK` (make gpu-train): its --cpu
dry run trains fold 0 of the GPU recipe on a pack, epochs from the budget probe, and writes
one JSON and the log; a failed phase is in the JSON and exits 1."""

from __future__ import annotations

import json
import math

import pytest
import torch

import pipeline.tools.gpu_check as gc
import pipeline.tools.gpu_real as gr
from pipeline.formats.folds import read_folds
from pipeline.formats.pack import write_pack

from helpers import REPO

RECIPE = str(REPO / "recipes" / "gpu.yaml")


def test_cpu_dry_run_passes_every_check(tmp_path):
    res = gc.run_gpu_check(tmp_path / "gc", cpu=True)
    assert res["failures"] == [], {k: res[k] for k in res["failures"]}
    assert res == json.loads((tmp_path / "gc" / "gpu-check.json").read_text())  # written as returned
    assert res["env"]["device"] == "cpu" and res["env"]["torch"] == torch.__version__
    setup = res["setup"]
    assert setup["amp"] == "torch.bfloat16" and setup["max_abs_amp_minus_fp32_px"] <= gc.AMP_TOL_PX
    done, total = map(int, setup["blurpool_channels_last"].split("/"))
    assert done == total > 0
    for name in ("throughput_channels_last", "throughput_nchw"):
        assert res[name]["images_per_s_real"] > 0 and res[name]["images_per_s_synthetic"] > 0
        assert "peak_memory_gib" not in res[name]  # a GPU figure: only on CUDA
    for amp in ("auto", "fp16"):
        r = res[f"resume_{amp}"]
        assert r["steps_per_epoch"] >= 2 and r["val_mae_resumed"] == pytest.approx(r["val_mae_unkilled"], rel=0.02)
    assert res["resume_fp16"]["scaler"]["_growth_tracker"] == 2 * res["resume_fp16"]["steps_per_epoch"]
    assert res["predict"]["test_faces"] == gc.CPU_DRY["n_test"] and res["predict"]["oof_faces"] > 0
    assert "skipped" in res["ddp"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_says_so_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gc.main(["--out", str(tmp_path / "gc")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: gpu-check: no usable CUDA device") and "--cpu" in err[0]
    assert not (tmp_path / "gc").exists()


def test_a_failed_or_crashing_check_exits_1_and_the_rest_still_run(tmp_path, monkeypatch):
    def mismatch(ctx):
        gc._require(False, "max |AMP - fp32| = 9 px")

    def crash(ctx):
        raise RuntimeError("CUDA error: no kernel image is available")

    monkeypatch.setattr(gc, "CHECKS", [("a", mismatch), ("b", crash), ("c", lambda ctx: {"x": 1})])
    with pytest.raises(SystemExit) as e:
        gc.main(["--cpu", "--out", str(tmp_path / "gc")])
    assert e.value.code == 1
    res = json.loads((tmp_path / "gc" / "gpu-check.json").read_text())
    assert res["failures"] == ["a", "b"] and res["c"] == {"x": 1}
    assert res["a"]["error"] == "mismatch: max |AMP - fp32| = 9 px"
    assert res["b"]["error"].startswith("RuntimeError: CUDA error")


@pytest.fixture(scope="module")
def pack(tiny_workspace, tmp_path_factory):
    """The 32 px demo cache and its 2 folds, packed."""
    out = tmp_path_factory.mktemp("pack") / "pack"
    write_pack(tiny_workspace / "cache", tiny_workspace / "folds.csv", out)
    return out


def test_train_real_cpu_dry_run_writes_one_json_and_the_log(pack, tiny_workspace, tmp_path):
    gc.main(["--train-real", str(pack), "--cpu", "--params", RECIPE, "--out", str(tmp_path / "out")])  # exit 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train-real.json", "train-real.log"]
    res = json.loads((tmp_path / "out" / "train-real.json").read_text())
    assert res["failures"] == [] and res["mode"] == "cpu dry run" and res["env"]["device"] == "cpu"
    assert set(res["phases_s"]) == {"unpack", "probe", "train", "predict"}
    # the recipe's training and TTA, on the tiny model at the pack's crop size
    assert res["recipe"]["optimizer"] == "sgd" and res["recipe"]["lr"] == 0.8 and res["recipe"]["input_size"] == 32
    assert res["recipe"]["tta"] == "flip" and res["recipe"]["tta_jitter"] == 0.05
    budget = res["budget"]
    assert budget["probe_epochs"] == gr.PROBE_EPOCHS and budget["probe_s_per_epoch"] > 0
    assert budget["epochs"] == budget["recipe_epochs"] == 2 and not budget["capped"]  # 6 min hold 2 toy epochs
    train = res["train"]
    assert train["epochs"] == 2 and 1 <= train["best_epoch"] <= 2 and train["peak_memory_gib"] is None
    assert train["images_per_s_median"] > 0 and 0 <= train["data_wait_frac_mean"] <= 1
    val = res["val"]
    fold = read_folds(tiny_workspace / "folds.csv")
    assert val["faces"] == int((fold == 0).sum())
    for kind in ("tta", "plain"):
        assert 0 < val[f"nme_{kind}"] < 5 and val[f"mae_{kind}"] > 0
        assert set(val[f"regions_nme_{kind}"]) == {"jaw", "brows", "nose", "eyes", "mouth"}
        assert all(math.isfinite(v) and v > 0 for v in val[f"regions_nme_{kind}"].values())
    assert val["nme_plain"] == pytest.approx(train["val_nme_no_tta"], rel=0.05)  # the same weights, both untested views
    assert "fp16" not in res
    log = (tmp_path / "out" / "train-real.log").read_text()
    assert "fold 0 epoch 2:" in log and "budget:" in log and "train-real: done" in log


def test_train_real_epochs_given_skips_the_probe_and_fp16_runs_only_in_time_left(pack, tmp_path):
    res = gr.run_train_real(pack, tmp_path / "a", params=RECIPE, cpu=True, epochs=1, fp16_too=True, wall_min=60)
    assert res["failures"] == [] and set(res["phases_s"]) == {"unpack", "train", "predict", "train_fp16",
                                                              "predict_fp16"}
    assert res["budget"] == {"epochs": 1, "recipe_epochs": 2, "from": "--epochs"} and res["train"]["epochs"] == 1
    fp16 = res["fp16"]
    assert fp16["train"]["epochs"] == 1 and fp16["val"]["faces"] == res["val"]["faces"]
    assert math.isfinite(fp16["val"]["nme_tta"])
    assert set(fp16["val"]["regions_nme_tta"]) == set(res["val"]["regions_nme_tta"])
    assert "amp=torch.float16" in (tmp_path / "a" / "train-real.log").read_text()  # the GradScaler path ran

    res = gr.run_train_real(pack, tmp_path / "b", params=RECIPE, cpu=True, epochs=1, fp16_too=True, wall_min=0.001)
    assert res["failures"] == [] and "left of --wall-min 0.001" in res["fp16"]["skipped"]
    assert set(res["phases_s"]) == {"unpack", "train", "predict"}


def test_train_real_a_failed_phase_is_in_the_json_and_exits_1(pack, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(gr, "run_predict", broken)
    with pytest.raises(SystemExit) as e:
        gc.main(["--train-real", str(pack), "--cpu", "--params", RECIPE, "--epochs", "1", "--out", str(tmp_path)])
    assert e.value.code == 1
    res = json.loads((tmp_path / "train-real.json").read_text())
    assert res["failures"] == ["predict"] and res["predict"]["error"] == "RuntimeError: CUDA error: out of memory"
    assert res["train"]["epochs"] == 1 and "val" not in res



def test_train_real_refuses_params_that_crop_otherwise_before_any_work(pack, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gc.main(["--train-real", str(pack), "--cpu", "--params", RECIPE, "--set", "crop.side=48",
                 "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 32 px crops" in err[0] and "rebuild the pack" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_train_real_without_cuda_says_so_and_exits_2(pack, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gc.main(["--train-real", str(pack), "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: gpu-check: no usable CUDA device")
    assert not (tmp_path / "out").exists()


def test_score_fold_reads_oof_npz_through_the_predictions_reader(tiny_workspace, tmp_path):
    from pipeline.core.errors import PipelineError
    from pipeline.formats.cache import load_cache
    from pipeline.formats.predictions import write_oof_predictions

    train = load_cache(tiny_workspace / "cache" / "train")
    fold = read_folds(tiny_workspace / "folds.csv", train.meta, train.path)
    truth = train.keypoints_orig
    write_oof_predictions(tmp_path / "oof.npz", tta=truth + 1.0, plain=truth, fold=fold,
                          face_id=train.meta["face_id"], keypoint_names=train.schema.names)
    res = gr.score_fold(tiny_workspace / "cache", tmp_path, 1)
    assert res["faces"] == int((fold == 1).sum()) > 0
    assert res["mae_tta"] == pytest.approx(1.0) and res["mae_plain"] == 0 and res["nme_plain"] == 0
    assert res["nme_tta"] > 0 and set(res["regions_nme_tta"]) == set(train.schema.regions())
    (tmp_path / "oof.npz").write_bytes(b"not an npz")
    with pytest.raises(PipelineError) as e:
        gr.score_fold(tiny_workspace / "cache", tmp_path, 1)
    assert str(e.value) == f"{tmp_path / 'oof.npz'}: not a readable .npz file (ValueError)"


def test_logging_to_holds_a_handler_on_a_logger_for_a_with_block_only():
    import logging

    logger = logging.getLogger("pipeline.test_logging_to")
    logger.setLevel(logging.WARNING)
    clock = gr.EpochClock()
    with pytest.raises(RuntimeError):
        with gr.logging_to(clock, logger.name) as got:
            assert got is clock and logger.level == logging.INFO
            logger.info("fold 0 epoch 1: loss 0.5  812.4 img/s  data wait 3.1%")
            logger.debug("fold 0 epoch 2: loss 0.5  900.0 img/s  data wait 1.0%")  # under INFO: not kept
            raise RuntimeError("a failed phase")
    assert [(e["epoch"], e["images_per_s"], e["data_wait_frac"]) for e in clock.epochs] == [(1, 812.4, 0.031)]
    assert clock not in logger.handlers and logger.level == logging.WARNING
    logger.info("fold 0 epoch 3: loss 0.5  1.0 img/s  data wait 1.0%")
    assert len(clock.epochs) == 1


def test_epochs_for_budget():
    assert gr.epochs_for_budget(360, 1.5, 300) == 240
    assert gr.epochs_for_budget(360, 1.0, 200) == 200  # never more than the recipe's
    assert gr.epochs_for_budget(10, 60.0, 200) == 1
    with pytest.raises(ValueError):
        gr.epochs_for_budget(360, float("nan"), 200)
