"""The CUDA paths, checked on the CPU: the choices made for a GPU (AMP dtype, kernels for
the GPU, SyncBatchNorm, one GPU per DDP rank) with torch.cuda mocked, and the numerics
of mixed precision under CPU autocast (dtypes, GradScaler state through a checkpoint)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import pipeline.inference.tta as inference
import pipeline.training.losses as losses
from pipeline.core.config import load_config
from pipeline.core.device import _arch_runs_on, amp_dtype, resolve_device, use_channels_last, use_compile, use_sync_bn
from pipeline.core.errors import PipelineError
from pipeline.formats.cache import load_cache
from pipeline.formats.checkpoint import load_checkpoint
from pipeline.models import head as head_module
from pipeline.models.head import SoftArgmaxHead
from pipeline.models.layers import BlurPool2d, reflect_pad1
from pipeline.stages.train import fit
from pipeline.training.distributed import init_distributed
from pipeline.training.identity import training_identity
from pipeline.training.loader import seed_worker
from pipeline.training.loop import evaluate, train_steps
from pipeline.training.setup import build_training, load_fold, make_epoch_loader, resume_training

TINY = ["crop.side=32", "model.input_size=32", "train.batch_size=8", "train.epochs=2",
        "train.warmup_epochs=1", "folds.k=2", "folds.train=[0,1]", "train.randaug_n=1", "train.heatmap_lambda=1.0"]
CUDA = torch.device("cuda")


def _fake_gpu(monkeypatch, capability: tuple[int, int], archs=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                                                 "sm_120", "compute_120")):
    """torch.cuda as on a machine with one GPU of `capability` and a wheel built for `archs`:
    is_bf16_supported behaves as torch's own (emulated bf16 counts unless excluded)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(archs))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"fake sm_{capability[0]}{capability[1]}")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: capability[0] >= 8 or including_emulation)


@pytest.mark.parametrize("capability, want", [((7, 5), torch.float16), ((7, 0), torch.float16),
                                              ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_amp_auto_takes_bf16_only_where_it_is_native(monkeypatch, capability, want):
    _fake_gpu(monkeypatch, capability)
    assert amp_dtype("auto", CUDA) == want and amp_dtype("on", CUDA) == want
    assert amp_dtype("fp16", CUDA) == torch.float16 and amp_dtype("bf16", CUDA) == torch.bfloat16
    assert amp_dtype("off", CUDA) is None


def test_amp_error_names_the_param_read():
    with pytest.raises(PipelineError, match="amp must be"):
        amp_dtype("fp8", CUDA, "predict.amp")
    with pytest.raises(PipelineError, match="'predict.amp' must be"):
        load_config(None, ["predict.amp=fp8"])


@pytest.mark.parametrize("capability, ok", [((6, 0), False), ((7, 0), False), ((7, 5), True), ((8, 9), True),
                                            ((9, 0), True), ((12, 1), True), ((13, 0), True)])
def test_a_gpu_without_kernels_in_the_wheel_is_a_clear_error(monkeypatch, capability, ok):
    """sm_XY binaries run on the same major and a minor >= Y; PTX (compute_120) on anything newer."""
    _fake_gpu(monkeypatch, capability)
    if ok:
        assert resolve_device("cuda:0") == torch.device("cuda:0")
        # with an index: torch.cuda.set_device (the DeviceLoader's producer thread) rejects bare 'cuda'
        assert resolve_device("auto") == torch.device("cuda:0") and resolve_device("cuda") == torch.device("cuda:0")
    else:
        for name in ("cuda:0", "auto"):  # auto too: the GPU is there, the wheel cannot use it
            with pytest.raises(PipelineError, match=f"sm_{capability[0]}{capability[1]}.*install a torch build"):
                resolve_device(name)


def test_arch_list_parsing():
    assert _arch_runs_on("sm_86", 8, 9) and not _arch_runs_on("sm_86", 8, 0) and not _arch_runs_on("sm_80", 9, 0)
    assert _arch_runs_on("sm_90a", 9, 0) and _arch_runs_on("compute_90", 10, 0) and not _arch_runs_on("compute_90", 8, 9)
    assert not _arch_runs_on("gfx90a", 9, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_requested_without_cuda_says_which_build(monkeypatch):
    with pytest.raises(PipelineError, match=r"CUDA is not available \(torch .* is built for CUDA"):
        resolve_device("cuda")


def test_channels_last_and_compile_rules():
    cpu = torch.device("cpu")
    assert use_channels_last("auto", cpu) and use_channels_last("auto", CUDA) and not use_channels_last("off", cpu)
    assert not use_compile("auto") and use_compile("on") and not use_compile("off")


def test_sync_bn_rule():
    assert not use_sync_bn("auto", CUDA, 1, 4)  # one process: nothing to sync
    assert use_sync_bn("auto", CUDA, 8, 8) and not use_sync_bn("auto", CUDA, 2, 32)
    assert use_sync_bn("on", CUDA, 2, 32) and not use_sync_bn("off", CUDA, 8, 8)
    assert not use_sync_bn("auto", torch.device("cpu"), 2, 4)  # gloo: SyncBatchNorm is CUDA only
    with pytest.raises(PipelineError, match="needs CUDA"):
        use_sync_bn("on", torch.device("cpu"), 2, 4)


def test_every_rank_binds_its_own_gpu(monkeypatch):
    """Under torchrun, rank r sets cuda:LOCAL_RANK current and binds NCCL to it before
    anything touches CUDA (else every rank opens a context on GPU 0)."""

    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    assert init_distributed("cuda") == (1, 2, "cuda:1")
    assert calls == [("set_device", 1), ("nccl", {"device_id": torch.device("cuda", 1)})]


def test_reflect_pad_keeps_channels_last_and_values():
    x = torch.randn(2, 8, 7, 6).to(memory_format=torch.channels_last).requires_grad_()
    y = reflect_pad1(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, F.pad(x, (1, 1, 1, 1), mode="reflect"))
    g = torch.randn_like(y)
    (ga,) = torch.autograd.grad(y, x, g)
    (gb,) = torch.autograd.grad(F.pad(x, (1, 1, 1, 1), mode="reflect"), x, g)
    assert torch.allclose(ga, gb, atol=1e-6)
    pool = BlurPool2d(8)
    assert pool(x).shape == (2, 8, 4, 3)


def test_dataloader_workers_run_opencv_single_threaded():

    before = cv2.getNumThreads()
    try:
        seed_worker(0)
        assert cv2.getNumThreads() == 1
    finally:
        cv2.setNumThreads(before)


def test_validation_runs_as_predict_auto_and_predict_follows_its_amp_setting(tiny_workspace, monkeypatch):
    """Validation is scored as predict scores out of fold (predict.amp auto: fp32 on a CPU),
    also on a CPU whose native bf16 makes train.amp auto train in bf16; predict follows
    predict.amp."""
    import pipeline.core.device as device

    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda flags=None: True)
    assert device.amp_dtype("auto", torch.device("cpu"), "train.amp") == torch.bfloat16
    seen = []

    def spy(model, faces, **kw):
        seen.append(kw["amp"])
        n = len(faces)
        return {"plain": np.zeros((n, 68, 2)), "flip": np.zeros((n, 68, 2)), "tta": np.zeros((n, 68, 2))}

    monkeypatch.setattr(inference, "predict_crops", spy)
    cache = load_cache(tiny_workspace / "cache" / "train")
    ckpt = {"model_config": {"input_size": 32, "in_chans": 3}, "schema": cache.schema.to_dict(),
            "crop": {"size": 32, "expand": 1.25, "label_origin": 0.0}}
    cpu = torch.device("cpu")
    evaluate(None, cache, np.arange(2), ckpt, 8, cpu)
    inference.predict_original(None, ckpt, cache.faces[:2], cache.crop_to_orig[:2], "flip", 8, cpu, amp="fp16")
    inference.predict_original(None, ckpt, cache.faces[:2], cache.crop_to_orig[:2], "flip", 8, cpu)
    assert seen == [None, torch.float16, None]


def test_bf16_autocast_steps_keep_the_softmax_and_the_regulariser_in_fp32(tiny_workspace, monkeypatch):
    """A few training steps under CPU bf16 autocast (the CUDA path's numerics): the body
    runs in bf16, the head's 1x1 conv, the soft-argmax softmax and the JS regulariser in
    fp32, weights and gradients stay fp32, and the loss is finite."""
    ws = tiny_workspace
    cfg = load_config(None, TINY + ["train.amp=bf16", "train.device=cpu"])
    cache, train_idx, _ = load_fold(ws / "cache", ws / "folds.csv", 0)
    setup = build_training(cfg, cache, train_idx, torch.device("cpu"))
    assert setup.amp == torch.bfloat16 and setup.scaler is None

    dtypes: dict[str, set] = {"body": set(), "head_in": set(), "logits": set(), "probs": set(), "js": set()}
    first_conv = next(m for m in setup.model.modules() if isinstance(m, torch.nn.Conv2d))
    head = next(m for m in setup.model.modules() if isinstance(m, SoftArgmaxHead))

    def record(name, of_input=False, item=None):
        def hook(module, inputs, output):  # returns None: the output is not replaced
            t = inputs[0] if of_input else output
            dtypes[name].add((t if item is None else t[item]).dtype)
        return hook

    first_conv.register_forward_hook(record("body"))
    head.register_forward_hook(record("head_in", of_input=True))
    head.register_forward_hook(record("probs", item=1))
    soft_argmax = head_module.soft_argmax

    def soft_argmax_spy(logits, input_hw=None):
        dtypes["logits"].add(logits.dtype)
        return soft_argmax(logits, input_hw)

    monkeypatch.setattr(head_module, "soft_argmax", soft_argmax_spy)
    js = losses.gaussian_js

    def js_spy(probs, target, input_hw, sigma):
        out, inside = js(probs, target, input_hw, sigma)
        dtypes["js"].add((probs.dtype, out.dtype))
        return out, inside

    monkeypatch.setattr(losses, "gaussian_js", js_spy)
    tr = train_steps(setup, make_epoch_loader(setup, 0), progress=False)
    assert math.isfinite(tr["loss"]) and tr["loss"] > 0
    assert dtypes["body"] == {torch.bfloat16} and dtypes["head_in"] == {torch.bfloat16}
    assert dtypes["logits"] == {torch.float32} and dtypes["probs"] == {torch.float32}
    assert dtypes["js"] == {(torch.float32, torch.float32)}
    for p in setup.model.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
        assert torch.isfinite(p).all()


def test_fp16_gradscaler_state_goes_through_the_checkpoint(tiny_workspace):
    """train.amp=fp16: a GradScaler on the run's device (here the CPU), its state saved in
    last.pt, restored on resume, and the resumed run ends where the uninterrupted one does."""
    ws = tiny_workspace
    cfg = load_config(None, TINY + ["train.amp=fp16", "train.device=cpu"])
    fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "fp16cut", resume=False, max_epochs=1)
    ck = load_checkpoint(ws / "fp16cut" / "fold0" / "last.pt")
    steps = ck["scheduler_step"]
    assert ck["scaler"]["scale"] == 65536.0 and ck["scaler"]["_growth_tracker"] == steps > 0

    cache, train_idx, _ = load_fold(ws / "cache", ws / "folds.csv", 0)
    setup = build_training(cfg, cache, train_idx, torch.device("cpu"))
    assert setup.scaler is not None and setup.scaler.is_enabled()
    identity = training_identity(cfg, ws / "cache", ws / "folds.csv", setup.runtime)
    assert resume_training(setup, ws / "fp16cut" / "fold0", cache.schema, 0, identity)[0] == 1
    assert setup.scaler.state_dict() == ck["scaler"]

    resumed = fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "fp16cut", resume=True)
    full = fit(cfg, 0, ws / "cache", ws / "folds.csv", ws / "fp16full", resume=False)
    a, b = (load_checkpoint(ws / d / "fold0" / "last.pt") for d in ("fp16cut", "fp16full"))
    assert a["scaler"] == b["scaler"] and a["scaler"]["_growth_tracker"] == 2 * steps
    assert resumed["last_val_mae"] == full["last_val_mae"]
    for k, v in b["model"].items():
        assert torch.equal(a["model"][k], v), k
