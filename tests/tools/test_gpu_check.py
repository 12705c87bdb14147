"""`python -m pipeline.tools.gpu_check` (make gpu-check): its --cpu dry run runs every check at toy
sizes and passes; without CUDA it refuses with one line (exit 2); a failed or crashing
check makes it exit 1 and the others still run."""

from __future__ import annotations

import json

import pytest
import torch

import pipeline.tools.gpu_check as gc


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
