"""Trainer: schedule, resume equivalence, NaN stop, checkpoints, and a tiny fold that learns."""

import math
import sys

import pytest
import torch

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.formats.checkpoint import load_checkpoint
from pipeline.stages.train import fit
from pipeline.training.optim import get_lr

TINY = ["crop.side=32", "model.input_size=32", "train.batch_size=8", "train.epochs=4",
        "train.warmup_epochs=1", "folds.k=2", "folds.train=[0,1]", "train.randaug_n=1"]


def test_get_lr_warmup_then_cosine():
    total, warm, peak = 100, 10, 0.8
    lrs = [get_lr(s, total, warm, peak) for s in range(total)]
    assert lrs[0] == pytest.approx(peak / warm)
    assert lrs[warm - 1] == pytest.approx(peak)
    assert all(a < b for a, b in zip(lrs[:warm - 1], lrs[1:warm]))  # rising
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1:]))  # then falling
    assert get_lr(total, total, warm, peak) == pytest.approx(0.0, abs=1e-12)
    assert get_lr(warm + (total - warm) // 2, total, warm, peak) == pytest.approx(peak / 2, rel=1e-6)


def test_resume_equals_uninterrupted(tiny_workspace):
    ws = tiny_workspace
    cfg = load_config(None, TINY)
    full = fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "full", resume=False)
    fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "cut", resume=False, max_epochs=2)
    assert load_checkpoint(ws / "cut" / "fold0" / "last.pt")["epoch"] == 2
    resumed = fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "cut", resume=True)
    assert resumed["epochs"] == full["epochs"] == 4
    assert abs(resumed["last_val_mae"] - full["last_val_mae"]) < 1e-5


def test_rerun_of_a_finished_fold_writes_the_same_outputs(tiny_workspace):
    """`dvc repro -f` (or a comment edited in train.py) re-runs train on a finished fold:
    DVC has deleted the DVCLive plots first, and the resumed run, with nothing left to
    train, must write them again, byte for byte, with metrics.json and the checkpoints."""
    import shutil

    ws = tiny_workspace
    cfg = load_config(None, TINY + ["train.epochs=2", "train.randaug_n=0"])
    out, live = ws / "rerun", ws / "rerun_live"
    fit(cfg, 0, ws / "cache", ws / "folds.csv", out, resume=True, live_dir=live)

    def files():
        return {str(p.relative_to(ws)): p.read_bytes() for d in (out, live / "plots")
                for p in sorted(d.rglob("*")) if p.is_file()}

    first = files()
    assert "rerun_live/plots/metrics/val_mae.tsv" in first and "rerun/fold0/metrics.json" in first
    shutil.rmtree(live / "plots")
    m = fit(cfg, 0, ws / "cache", ws / "folds.csv", out, resume=True, live_dir=live)
    assert m["epochs"] == 2 and files() == first
    # a retrain from scratch writes the same bytes too: no timings in what DVC compares
    shutil.rmtree(out)
    shutil.rmtree(live)
    fit(cfg, 0, ws / "cache", ws / "folds.csv", out, resume=False, live_dir=live)
    assert files() == first


def test_training_augments_with_every_augmentation_param(tiny_workspace):
    """build_training's augmentation reads the train section through TrainAugment.from_config:
    a param added there (rotate, erase) reaches the training loader."""
    from pipeline.training.setup import build_training, load_fold

    ws = tiny_workspace
    cfg = load_config(None, TINY + ["train.rotate=7", "train.erase=0.25", "train.scale_min=0.9", "train.flip=0.3"])
    cache, train_idx, _ = load_fold(ws / "cache", ws / "folds.csv", 0)
    aug = build_training(cfg, cache, train_idx, torch.device("cpu")).dataset.transform
    assert (aug.rotate, aug.erase, aug.scale_min, aug.flip_p, aug.input_size) == (7.0, 0.25, 0.9, 0.3, 32)


def test_training_without_dvclive_installed_warns_and_trains(tiny_workspace, monkeypatch, caplog):
    """A GPU node's stock torch image may lack DVC's packages: `pipeline train` (whose --live
    defaults to dvclive/foldK) trains all the same, without the per-epoch log."""
    ws = tiny_workspace
    monkeypatch.setitem(sys.modules, "dvclive", None)  # `from dvclive import Live` raises ImportError
    live = ws / "no_dvclive_live"
    with caplog.at_level("WARNING"):
        m = fit(load_config(None, TINY + ["train.epochs=1"]), 0, ws / "cache", ws / "folds.csv", ws / "no_dvclive",
                resume=False, live_dir=live)
    assert m["epochs"] == 1 and (ws / "no_dvclive" / "fold0" / "best.pt").is_file()
    assert "dvclive is not installed" in caplog.text and not (live / "plots").exists()


def test_changed_params_do_not_resume(tiny_workspace, caplog):
    ws = tiny_workspace
    fit(load_config(None, TINY), 0, ws / "cache", ws / "folds.csv", ws / "p", resume=False, max_epochs=1)
    with caplog.at_level("INFO"):
        m = fit(load_config(None, TINY + ["train.epochs=1", "train.lr=0.002"]), 0, ws / "cache",
                ws / "folds.csv", ws / "p", resume=True)
    assert f"{ws / 'p' / 'fold0' / 'last.pt'} was made from other inputs (params); training afresh" in caplog.text
    assert m["epochs"] == 1


def test_a_fold_made_from_other_inputs_trains_afresh_and_says_why(tiny_workspace, tmp_path, caplog, monkeypatch):
    """Issue 48, finding 1: a finished fold whose training inputs changed (the cache's
    content with its crop run id unchanged, folds.csv, the code training imports, the
    precision `train.amp: auto` resolves to) trains afresh with one log line naming what
    differs; the same inputs resume with nothing to train; `trained_epochs` (train-folds)
    agrees with what the stage does."""
    import shutil

    import numpy as np
    import pandas as pd

    import pipeline.core.device as device
    import pipeline.training.identity as setup_module
    from pipeline.training.identity import trained_epochs

    ws = tiny_workspace
    cache, folds = tmp_path / "cache", tmp_path / "folds.csv"
    shutil.copytree(ws / "cache", cache)
    shutil.copy(ws / "folds.csv", folds)
    cfg = load_config(None, TINY + ["train.epochs=1", "train.randaug_n=0"])
    out = tmp_path / "models"
    last = out / "fold0" / "last.pt"
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda flags=None: False)  # train.amp auto: fp32 here
    fit(cfg, 0, cache, folds, out, resume=True)
    identity = load_checkpoint(last)["identity"]
    assert set(identity) == {"params", "cache", "folds", "extra_train", "code", "precision"}
    assert identity["extra_train"] == {} and identity["precision"] == "fp32"
    assert load_checkpoint(out / "fold0" / "best.pt")["identity"] == identity

    def rerun(expect_epochs: int):
        assert trained_epochs(out / "fold0", cfg, cache, folds) == expect_epochs
        before = last.read_bytes()
        caplog.clear()
        with caplog.at_level("INFO"):
            fit(cfg, 0, cache, folds, out, resume=True)
        assert trained_epochs(out / "fold0", cfg, cache, folds) == 1  # what it left is current
        return [r.getMessage() for r in caplog.records if "last.pt" in r.getMessage()], last.read_bytes() != before

    lines, changed = rerun(1)  # the same inputs: resumed, nothing trained
    assert not changed and len(lines) == 1 and "resuming" in lines[0], lines

    fold_of = pd.read_csv(folds)["fold"].to_numpy()
    kp = np.load(cache / "train" / "keypoints.npy")
    kp[np.flatnonzero(fold_of == 1)[0], 0, 0] += 3.0  # one training label moved by 3 px, same crop run id
    np.save(cache / "train" / "keypoints.npy", kp)
    lines, changed = rerun(0)
    assert changed and lines == [f"fold 0: {last} was made from other inputs (cache); training afresh"], lines

    df = pd.read_csv(folds)
    df.loc[np.flatnonzero(fold_of == 1)[1], "fold"] = 0  # one face moved from fold 1 into fold 0
    df.to_csv(folds, index=False)
    lines, changed = rerun(0)
    assert changed and lines == [f"fold 0: {last} was made from other inputs (folds); training afresh"], lines

    with monkeypatch.context() as m:  # other training code (the digest of the modules training imports)
        m.setattr(setup_module, "source_sha256", lambda *a, **k: "0" * 64)
        lines, changed = rerun(0)
    assert lines == [f"fold 0: {last} was made from other inputs (code); training afresh"], lines

    # the same params on a CPU with native bf16: train.amp auto resolves to bf16 there
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda flags=None: True)
    lines, changed = rerun(0)
    assert changed and lines == [f"fold 0: {last} was made from other inputs (code, precision); training afresh"], \
        lines
    assert load_checkpoint(last)["identity"]["precision"] == "bf16"


def test_checkpoint_contents_load_weights_only(tiny_workspace):
    ws = tiny_workspace
    fit(load_config(None, TINY + ["train.epochs=1"]), 1, ws / "cache", ws / "folds.csv", ws / "c", resume=False)
    ck = torch.load(ws / "c" / "fold1" / "best.pt", weights_only=True)
    for key in ("model_config", "model", "optimizer", "scheduler_step", "epoch", "best_mae", "config",
                "schema", "mean_shape"):
        assert key in ck
    assert ck["epoch"] == 1 and ck["config"]["train"]["epochs"] == 1
    assert (ws / "c" / "fold1" / "params.resolved.yaml").exists()
    assert (ws / "c" / "fold1" / "metrics.json").exists()


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_workspace):
    ws = tiny_workspace
    fit(load_config(None, TINY + ["train.epochs=2"]), 0, ws / "cache", ws / "folds.csv", ws / "n",
        resume=False, max_epochs=1)
    before = (ws / "n" / "fold0" / "last.pt").read_bytes()
    with pytest.raises(PipelineError, match="loss became"):
        fit(load_config(None, TINY + ["train.epochs=2", "train.lr=1e30", "train.warmup_epochs=0"]),
            0, ws / "cache", ws / "folds.csv", ws / "n", resume=False)
    assert (ws / "n" / "fold0" / "last.pt").read_bytes() == before


def test_fold_out_of_range_is_an_error(tiny_workspace):
    ws = tiny_workspace
    with pytest.raises(PipelineError, match="fold 7 out of range"):
        fit(load_config(None, TINY), 7, ws / "cache", ws / "folds.csv", ws / "x", resume=False)


def test_amp_auto_on_cpu_is_bf16_training_only_where_native():
    from pipeline.core.device import amp_dtype

    cpu = torch.device("cpu")
    assert amp_dtype("auto", cpu, "train.amp", native_cpu_bf16=False) is None
    assert amp_dtype("auto", cpu, "train.amp", native_cpu_bf16=True) == torch.bfloat16
    # inference stays fp32 on the CPU, native bf16 or not
    assert amp_dtype("auto", cpu, "predict.amp", native_cpu_bf16=True) is None
    assert amp_dtype("off", cpu, "train.amp", native_cpu_bf16=True) is None
    assert amp_dtype("off", torch.device("cuda")) is None
    assert amp_dtype("bf16", cpu, native_cpu_bf16=False) == torch.bfloat16


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    from pipeline.core.device import cpu_flags, cpu_has_native_bf16

    zen4 = tmp_path / "zen4"
    zen4.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n\n"
                    "processor\t: 1\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n")
    zen3 = tmp_path / "zen3"
    zen3.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\nbugs\t\t: avx512_bf16_lookalike\n")
    assert "avx512_bf16" in cpu_flags(str(zen4)) and cpu_has_native_bf16(cpu_flags(str(zen4)))
    assert not cpu_has_native_bf16(cpu_flags(str(zen3)))  # a flag-like word on another line does not count
    assert cpu_has_native_bf16(frozenset({"amx_bf16", "amx_tile"}))
    assert cpu_flags(str(tmp_path / "absent")) == frozenset()  # macOS, Windows: no /proc


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_amp_step(tiny_workspace):
    ws = tiny_workspace
    m = fit(load_config(None, TINY + ["train.epochs=1", "train.device=cuda"]), 0, ws / "cache",
            ws / "folds.csv", ws / "g", resume=False)
    assert math.isfinite(m["val_mae"])


def test_heatmap_regulariser_trains_through_the_maps(tiny_workspace, monkeypatch):
    """heatmap_lambda > 0: the trainer asks the model for its soft-argmax maps and the
    regulariser's gradient reaches the head."""
    from pipeline.training.losses import KeypointLoss

    seen = []
    forward = KeypointLoss.forward

    def spy(self, pred, target, probs=None, input_hw=None):
        total, parts = forward(self, pred, target, probs, input_hw)
        seen.append((probs is not None, float(parts["heatmap"])))
        return total, parts

    monkeypatch.setattr(KeypointLoss, "forward", spy)
    ws = tiny_workspace
    cfg = load_config(None, TINY + ["train.epochs=1", "train.heatmap_lambda=1.0"])
    metrics = fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "hm", resume=False)
    assert seen and all(has_maps and 0 < heat <= math.log(2) for has_maps, heat in seen)
    assert math.isfinite(metrics["val_mae"])


def test_heatmap_regulariser_is_skipped_for_a_regression_model(tiny_workspace, caplog):
    ws = tiny_workspace
    cfg = load_config(None, TINY + ["model.preset=resnet50-fc", "train.heatmap_lambda=1.0", "train.epochs=1"])
    metrics = fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "hm_fc", resume=False)
    assert math.isfinite(metrics["val_mae"])
    assert "heatmap_lambda ignored" in caplog.text


def test_ema_is_evaluated_and_best_pt_holds_the_better_weights(tiny_workspace):
    ws = tiny_workspace
    m = fit(load_config(None, TINY + ["train.ema_decay=0.5"]), 0, ws / "cache", ws / "folds.csv", ws / "e",
            resume=False)
    last = load_checkpoint(ws / "e" / "fold0" / "last.pt")
    best = load_checkpoint(ws / "e" / "fold0" / "best.pt")
    hist = last["history"]
    assert all(math.isfinite(h["val_mae_ema"]) and h["weights"] in ("raw", "ema") for h in hist)
    assert last["ema"]["updates"] == last["scheduler_step"]  # one update per optimizer step
    # every epoch's score is the better of the two, and best.pt is the best score's weights
    assert all(h["score_mae"] == min(h["val_mae"], h["val_mae_ema"]) for h in hist)
    top = min(hist, key=lambda h: h["score_mae"])
    assert m["best_epoch"] == best["epoch"] == top["epoch"] and m["best_weights"] == best["weights"] == top["weights"]
    assert m["val_mae"] == top["score_mae"] == best["best_mae"]
    if best["weights"] == "ema" and best["epoch"] == last["epoch"]:
        want = last["ema"]["model"]
    elif best["epoch"] == last["epoch"]:
        want = last["model"]
    else:
        want = None
    if want is not None:
        assert all(torch.equal(best["model"][k], v) for k, v in want.items())
    # the raw weights and the average differ: the EMA is not a copy
    assert any(not torch.equal(last["model"][k], v) for k, v in last["ema"]["model"].items())


def test_val_every_validates_every_nth_and_the_last_epoch_and_picks_best_among_them(tiny_workspace, monkeypatch):
    import pipeline.stages.train as train_stage

    calls = []
    real = train_stage.evaluate
    monkeypatch.setattr(train_stage, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    ws = tiny_workspace
    cfg = load_config(None, TINY + ["train.epochs=5", "train.val_every=2"])
    live = ws / "every2_live"
    m = fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "every2", resume=False, live_dir=live)
    last = load_checkpoint(ws / "every2" / "fold0" / "last.pt")
    hist = last["history"]
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4, 5]  # every epoch trained and checkpointed
    assert [h["epoch"] for h in hist if "val_mae" in h] == [2, 4, 5]  # every 2nd, and the last
    assert len(calls) == 3
    assert m["best_epoch"] in (2, 4, 5) and m["epochs"] == 5
    assert load_checkpoint(ws / "every2" / "fold0" / "best.pt")["epoch"] == m["best_epoch"]
    # DVCLive: the training loss every epoch, the validation only where it ran
    rows = {name: (live / "plots" / "metrics" / f"{name}.tsv").read_text().splitlines()[1:]
            for name in ("train_loss", "val_mae")}
    assert len(rows["train_loss"]) == 5 and [r.split("\t")[0] for r in rows["val_mae"]] == ["1", "3", "4"]
    # validation only reads the weights: the same training as validating every epoch
    fit(load_config(None, TINY + ["train.epochs=5"]), 0, ws / "cache", ws / "folds.csv", ws / "every1", resume=False)
    every1 = load_checkpoint(ws / "every1" / "fold0" / "last.pt")
    assert all(torch.equal(every1["model"][k], v) for k, v in last["model"].items())
    assert every1["history"][-1]["val_mae"] == hist[-1]["val_mae"]


# ------------------------------------------------------------------ extra training faces (data.extra_train)

def test_extra_faces_train_in_every_fold_and_are_never_validated(tiny_workspace, extra_ws, tmp_path):
    """Every fold's training side grows by exactly the extra faces (appended after the main
    ones, pixels and labels as cached) and its validation side stays the main faces of
    folds.csv; an extra cache the params do not name (a stale data/extra/<old>) is ignored."""
    import shutil

    import numpy as np

    from pipeline.formats.cache import load_cache
    from pipeline.training.setup import load_fold

    ws, root = tiny_workspace, tmp_path / "extra"
    shutil.copytree(extra_ws["root"], root)
    (root / "old").mkdir()
    (root / "old" / "info.json").write_text("not json")  # never read
    extra = load_cache(root / "more")
    cfg = load_config(None, TINY + extra_ws["sets"])
    vals = []
    for fold in (0, 1):
        main, train0, val0 = load_fold(ws / "cache", ws / "folds.csv", fold)
        cache, train, val = load_fold(ws / "cache", ws / "folds.csv", fold, cfg, root)
        n = len(main)
        np.testing.assert_array_equal(val, val0)
        assert val.max() < n and len(cache) == n + len(extra) == n + 12
        np.testing.assert_array_equal(train, np.concatenate([train0, np.arange(n, n + 12)]))
        np.testing.assert_array_equal(cache.faces[n:], extra.faces)
        np.testing.assert_array_equal(cache.keypoints[n:], extra.keypoints)
        np.testing.assert_array_equal(cache.faces[:n], main.faces)
        assert cache.info["extra_train"] == {"more": extra.info["run"]}
        vals.append(val)
    assert sorted(np.concatenate(vals).tolist()) == list(range(n))  # OOF: each main face once, no extra


def test_extra_faces_are_part_of_the_resume_key(tiny_workspace, extra_ws, tmp_path, caplog):
    """The checkpoint's identity names the extra caches it trained on (name -> crop run id
    and content); a run with other extra faces (none, or a folder cropped again with other
    labels) trains afresh."""
    import json
    import shutil

    import numpy as np

    from pipeline.training.identity import trained_epochs

    ws = tiny_workspace
    cfg = load_config(None, TINY + extra_ws["sets"] + ["train.epochs=2"])
    out = tmp_path / "models"
    fit(cfg, 0, ws / "cache", ws / "folds.csv", out, resume=False, max_epochs=1, extra_root=extra_ws["root"])
    run = json.loads((extra_ws["root"] / "more" / "info.json").read_text())["run"]
    ck = load_checkpoint(out / "fold0" / "last.pt")
    assert ck["identity"]["extra_train"]["more"]["run"] == run
    assert ck["config"]["data"]["extra_train"] == {"more": str(extra_ws["folder"])}
    inputs = (ws / "cache", ws / "folds.csv")
    assert trained_epochs(out / "fold0", cfg, *inputs, extra_ws["root"]) == 1
    assert trained_epochs(out / "fold0", load_config(None, TINY + ["train.epochs=2"]), *inputs) == 0
    recropped = tmp_path / "extra"  # cropped again, with one label 1 px elsewhere
    shutil.copytree(extra_ws["root"] / "more", recropped / "more")
    info = json.loads((recropped / "more" / "info.json").read_text())
    (recropped / "more" / "info.json").write_text(json.dumps({**info, "run": "another"}))
    kp = np.load(recropped / "more" / "keypoints.npy")
    kp[0, 0, 0] += 1.0
    np.save(recropped / "more" / "keypoints.npy", kp)
    assert trained_epochs(out / "fold0", cfg, *inputs, recropped) == 0
    with caplog.at_level("INFO"):
        m = fit(cfg, 0, ws / "cache", ws / "folds.csv", out, resume=True, extra_root=recropped)
    assert "other inputs (extra_train); training afresh" in caplog.text and m["epochs"] == 2
