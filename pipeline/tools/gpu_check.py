"""`python -m pipeline.tools.gpu_check` (`make gpu-check`): the first run of the GPU path, one
script of a few minutes on one GPU. It exits 0 when every check passes, 1 when any check
fails (a crash, a non-finite loss or prediction, a mismatch), 2 when there is no usable
CUDA device. `--cpu` runs the same checks on the CPU at tiny sizes: a dry run of the
script itself (what its test runs), not a check of a GPU. `--train-real PACK` trains the GPU
recipe on real faces instead of running the checks (pipeline/tools/gpu_real.py).

Checks, in order (figures in <out>/gpu-check.json, and logged):

* env: torch and CUDA versions, device name and capability, the wheel's arch list,
  native bf16, the AMP dtype `train.amp=auto` picks.
* setup: the training setup of the GPU recipe (ResUNet-72 at 224 px, batch 64, JS
  regulariser on) after a short epoch on the demo faces: cudnn.benchmark on, fused
  optimizer, scaler only for fp16, channels_last weights and BlurPool outputs, finite
  loss; then the same batch in eval with and without autocast: max |AMP - fp32| of the
  coordinates in px.
* throughput_channels_last / throughput_nchw: `pipeline bench`'s training steps
  (tools/bench/training.py `bench_train`) with channels_last on and off: img/s over the last steps through
  the real data path (cache -> augmentation -> DataLoader workers -> DeviceLoader) and on a
  synthetic batch already on the device, and the peak GPU memory.
* resume_<amp>: a 2-epoch fold-0 training of the demo data, killed mid-epoch 2 by
  PIPELINE_KILL_AT_STEP (a real `pipeline train` process, SIGKILL), resumed, compared
  with an unkilled run; with train.amp=auto (bf16 where native) and fp16 (the
  GradScaler path, whose state must come back from the checkpoint).
* predict: flip-TTA prediction with the fold-0 checkpoint: finite test and OOF figures.
* ddp: with 2 or more GPUs, a 1-epoch `torchrun --nproc-per-node 2` NCCL training, while
  nvidia-smi must show no second process of the run on GPU 0.

A GPU run is not bit-reproducible (cudnn.benchmark picks kernels per process, some CUDA
backward kernels add with atomics), so the resumed run must match the unkilled one within
RESUME_TOL, not bit for bit; on the CPU `tests/test_faults.py` checks bit equality."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np
import torch

import pipeline
from pipeline.core.config import load_config
from pipeline.core.device import describe_device, resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.faults import KILL_AT_STEP
from pipeline.core.io import write_json
from pipeline.core.params_schema import Config
from pipeline.formats.cache import load_cache
from pipeline.formats.checkpoint import load_checkpoint
from pipeline.inference.tta import predict_crops
from pipeline.models.layers import BlurPool2d
from pipeline.stages.crop import run_crop
from pipeline.stages.folds import run_folds
from pipeline.stages.predict import run_predict
from pipeline.stages.train import fit
from pipeline.synth.layout import generate_demo
from pipeline.tools.bench.training import bench_train
from pipeline.tools.gpu_real import GPU_RECIPE, logging_to, peak_memory_gib, reset_peak_memory, run_train_real
from pipeline.training.loop import train_steps
from pipeline.training.setup import build_training, make_epoch_loader

log = logging.getLogger(__name__)

# The GPU recipe's model, input and batch (recipes/gpu.yaml), at a size that runs in
# minutes: 320 demo faces, 5 folds (256 training faces of fold 0: 4 steps an epoch).
GPU = {"preset": "resunet72", "input_size": 224, "batch": 64, "steps": 10, "warmup": 5, "n_train": 320,
       "n_test": 16, "k": 5, "workers": 8, "crop_jobs": 8,
       "sets": ["optimizer=sgd", "lr=0.8", "momentum=0.9", "weight_decay=1e-5", "heatmap_lambda=1.0"]}
# --cpu: the same checks at toy sizes (the script's own test)
CPU_DRY = {"preset": "resunet-tiny", "input_size": 32, "batch": 4, "steps": 2, "warmup": 1, "n_train": 24,
           "n_test": 4, "k": 2, "workers": 0, "crop_jobs": 1, "sets": ["heatmap_lambda=1.0"]}

AMP_TOL_PX = 1.0  # max |AMP - fp32| coordinate difference accepted, crop px
# a resumed run against the unkilled one: |val MAE difference| <= rel * MAE + abs px
RESUME_TOL = {"rel": 0.02, "abs": 0.05}


class CheckFailed(Exception):
    """A check ran and found a wrong result (non-finite, mismatch)."""


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


class Context:
    """What every check reads: the device, the sizes, the work folder, the demo data."""

    def __init__(self, out: Path, cpu: bool):
        self.cpu = cpu
        self.size: dict[str, Any] = CPU_DRY if cpu else GPU  # mixed value types
        if not cpu and not torch.cuda.is_available():
            raise PipelineError("gpu-check", f"no usable CUDA device (torch {torch.__version__}, built for CUDA "
                                             f"{torch.version.cuda}): run it on a GPU machine, or `--cpu` for a dry "
                                             "run of the script")
        self.device = resolve_device("cpu" if cpu else "cuda")  # also: kernels for this GPU in the wheel
        self.out = out
        self.work = out / "work"
        self.cache = self.work / "cache"
        self.folds = self.work / "folds.csv"

    def sets(self, *extra: str) -> list[str]:
        """--set overrides of the GPU recipe (or the toy sizes) for this demo data."""
        s = self.size
        base = [f"data.dir={self.work / 'demo'}", f"crop.side={s['input_size']}", f"crop.n_jobs={s['crop_jobs']}",
                f"folds.k={s['k']}", "folds.train=[0]", f"model.preset={s['preset']}",
                f"model.input_size={s['input_size']}", f"train.batch_size={s['batch']}", "train.epochs=2",
                "train.warmup_epochs=1", f"train.num_workers={s['workers']}",
                f"train.device={self.device.type}", f"predict.device={self.device.type}",
                "predict.batch_size=64", "predict.tta=flip"]
        return base + [f"train.{x}" for x in s["sets"]] + list(extra)

    def cfg(self, *extra: str) -> Config:
        return load_config(None, self.sets(*extra))


# ------------------------------------------------------------------------------ checks

def check_env(ctx: Context) -> dict[str, Any]:
    res = {**describe_device(ctx.device), "cuda_available": torch.cuda.is_available()}
    res["dvclive"] = importlib.util.find_spec("dvclive") is not None  # without it, no per-epoch log (a warning)
    return res


def make_demo(ctx: Context) -> dict[str, Any]:
    """demo-data, crop and folds (the stages' own functions) into the work folder."""
    s = ctx.size
    generate_demo(ctx.work / "demo", n_train=s["n_train"], n_test=s["n_test"], seed=0)
    cfg = ctx.cfg()
    counts = run_crop(cfg, ctx.cache)
    fold = run_folds(cfg, ctx.cache, ctx.folds)
    return {"faces": counts, "fold0_val": int((fold == 0).sum()), "fold0_train": int((fold != 0).sum())}


def check_setup(ctx: Context) -> dict[str, Any]:
    """The training setup after one epoch on the demo faces (train.amp=auto; on the CPU dry
    run bf16, to take the autocast path), then AMP against fp32 on one batch in eval."""
    cache = load_cache(ctx.cache / "train")
    cfg = ctx.cfg("train.amp=bf16" if ctx.cpu else "train.amp=auto", "train.channels_last=on")
    setup = build_training(cfg, cache, np.arange(len(cache)), ctx.device)
    cuda = ctx.device.type == "cuda"
    fused = setup.optimizer.param_groups[0].get("fused")
    if cuda:
        _require(torch.backends.cudnn.benchmark, "torch.backends.cudnn.benchmark is off")
        _require(bool(fused), "the optimizer is not fused on CUDA")
    _require(setup.amp is not None, "train.amp=auto chose fp32 on CUDA")
    _require((setup.scaler is not None) == (setup.amp == torch.float16), "GradScaler without fp16, or fp16 without")
    _require(all(p.is_contiguous(memory_format=torch.channels_last) for p in setup.model.parameters() if p.dim() == 4),
             "weights are not channels_last")
    layouts: list[bool] = []
    hooks = [m.register_forward_hook(lambda m, i, o: layouts.append(o.is_contiguous(memory_format=torch.channels_last)))
             for m in setup.model.modules() if isinstance(m, BlurPool2d)]
    try:
        tr = train_steps(setup, make_epoch_loader(setup, 0), progress=False)
    finally:
        for h in hooks:
            h.remove()
    _require(math.isfinite(tr["loss"]), f"training loss {tr['loss']}")
    _require(not layouts or all(layouts), f"{layouts.count(False)} of {len(layouts)} BlurPool outputs not channels_last")

    faces = cache.faces[:ctx.size["batch"]]
    kw: dict[str, Any] = {"input_size": cfg.model.input_size, "in_chans": cfg.model.in_chans, "flip_perm": None,
          "batch_size": len(faces), "device": ctx.device, "channels_last": True}
    fp32 = predict_crops(setup.model, faces, amp=None, **kw)["plain"]
    amp = predict_crops(setup.model, faces, amp=setup.amp, **kw)["plain"]
    _require(bool(np.isfinite(fp32).all() and np.isfinite(amp).all()), "non-finite coordinates in eval")
    diff = float(np.abs(amp - fp32).max())
    _require(diff <= AMP_TOL_PX, f"max |AMP - fp32| = {diff:.3f} px > {AMP_TOL_PX} px")
    return {"amp": str(setup.amp), "scaler": setup.scaler is not None, "fused_optimizer": bool(fused),
            "cudnn_benchmark": torch.backends.cudnn.benchmark, "train_loss": tr["loss"],
            "images_per_s_epoch": tr["images_per_s"], "blurpool_channels_last": f"{sum(layouts)}/{len(layouts)}",
            "max_abs_amp_minus_fp32_px": diff, "mean_abs_amp_minus_fp32_px": float(np.abs(amp - fp32).mean())}


def check_throughput(ctx: Context, channels_last: bool) -> dict[str, Any]:
    """bench_train (pipeline bench's training steps) with channels_last on or off; a
    non-finite loss stops it (NonFiniteLoss)."""
    s = ctx.size
    cfg = ctx.cfg("train.amp=auto", f"train.channels_last={'on' if channels_last else 'off'}")
    reset_peak_memory(ctx.device)
    res = bench_train(cfg, s["preset"], ctx.cache, s["steps"], s["batch"], s["input_size"], ctx.device,
                      rounds=1, warmup=s["warmup"])
    peak = peak_memory_gib(ctx.device)
    if peak is not None:  # CUDA only: no key on the CPU
        res["peak_memory_gib"] = peak
    for k in ("images_per_s_real", "images_per_s_synthetic"):
        _require(math.isfinite(res[k]) and res[k] > 0, f"{k} = {res[k]}")
    return res


def _env(**extra: str) -> dict[str, str]:
    root = str(Path(pipeline.__file__).resolve().parents[1])  # the code under check, in the child processes too
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1",
            **extra}


def _train_cmd(ctx: Context, out: Path, sets: list[str], *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "pipeline", "train", "--fold", "0", "--cache", str(ctx.cache),
           "--folds", str(ctx.folds), "--out", str(out), "--live", str(out / "live"), *extra]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def check_resume(ctx: Context, amp: str) -> dict[str, Any]:
    """A `pipeline train` process killed (SIGKILL) after the first step of epoch 2, resumed,
    against an unkilled run of the same params."""
    sets = ctx.sets(f"train.amp={amp}")
    cfg = load_config(None, sets)
    ref_dir, cut_dir = ctx.work / f"ref-{amp}", ctx.work / f"cut-{amp}"
    ref = fit(cfg, 0, ctx.cache, ctx.folds, ref_dir, resume=False)
    want = load_checkpoint(ref_dir / "fold0" / "last.pt")
    steps_per_epoch = want["scheduler_step"] // 2
    _require(steps_per_epoch >= 2, f"{steps_per_epoch} step(s) an epoch: no mid-epoch kill possible")

    r = subprocess.run(_train_cmd(ctx, cut_dir, sets, "--no-resume"), cwd=ctx.work, capture_output=True,
                       text=True, env=_env(**{KILL_AT_STEP: str(steps_per_epoch + 1)}), timeout=600)
    _require(r.returncode == -signal.SIGKILL, f"the killed run exited {r.returncode}: {r.stderr[-1500:]}")
    killed = load_checkpoint(cut_dir / "fold0" / "last.pt")
    _require(killed["epoch"] == 1, f"the killed run's last.pt is at epoch {killed['epoch']}, not 1")

    logs = _LogCapture()
    with logging_to(logs, "pipeline.training.setup"):
        got_metrics = fit(cfg, 0, ctx.cache, ctx.folds, cut_dir, resume=True)
    _require("resuming from" in logs.text, "the resumed run did not resume from last.pt")
    got = load_checkpoint(cut_dir / "fold0" / "last.pt")
    _require(got["epoch"] == want["epoch"] == 2 and got["scheduler_step"] == want["scheduler_step"],
             f"resumed run at epoch {got['epoch']} step {got['scheduler_step']}, unkilled at "
             f"{want['epoch']} step {want['scheduler_step']}")
    a, b = got_metrics["last_val_mae"], ref["last_val_mae"]
    _require(math.isfinite(a) and math.isfinite(b), f"val MAE resumed {a}, unkilled {b}")
    tol = RESUME_TOL["rel"] * b + RESUME_TOL["abs"]
    _require(abs(a - b) <= tol, f"val MAE resumed {a:.4f} vs unkilled {b:.4f} px (tolerance {tol:.4f})")
    weight_diff = max(float((got["model"][k].float() - v.float()).abs().max()) for k, v in want["model"].items()
                      if v.is_floating_point())
    res = {"amp": amp, "steps_per_epoch": steps_per_epoch, "val_mae_resumed": a, "val_mae_unkilled": b,
           "max_abs_weight_diff": weight_diff, "bit_identical": weight_diff == 0.0}
    if amp == "fp16":
        _require(bool(killed["scaler"]) and bool(got["scaler"]), "fp16 checkpoints hold no GradScaler state")
        _require(got["scaler"]["_growth_tracker"] == want["scaler"]["_growth_tracker"]
                 and got["scaler"]["scale"] == want["scaler"]["scale"],
                 f"GradScaler state resumed {got['scaler']} vs unkilled {want['scaler']}")
        res["scaler"] = got["scaler"]
    return res


def check_predict(ctx: Context) -> dict[str, Any]:
    """`predict` with flip TTA from the fold-0 checkpoint of check_resume(auto)."""
    out = ctx.work / "predictions"
    run_predict(ctx.cfg(), str(ctx.cache), str(ctx.folds), str(ctx.work / "ref-auto"), str(out))
    test, oof = np.load(out / "test.npz"), np.load(out / "oof.npz")
    val = oof["fold"] == 0
    ens = test["ensemble"]
    _require(bool(np.isfinite(ens).all()), "non-finite test predictions")
    _require(bool(np.isfinite(oof["tta"][val]).all() and np.isfinite(oof["plain"][val]).all()),
             "non-finite OOF predictions of fold 0")
    return {"test_faces": int(ens.shape[0]), "oof_faces": int(val.sum()),
            "mean_abs_tta_minus_plain_px": float(np.abs(oof["tta"][val] - oof["plain"][val]).mean())}


def check_ddp(ctx: Context) -> dict[str, Any]:
    """torchrun, 2 NCCL processes, 1 epoch; nvidia-smi (when present) must never list more
    than one of the run's processes on GPU 0."""
    if ctx.device.type != "cuda" or torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count() if ctx.device.type == 'cuda' else 0} GPU(s); needs 2"}
    out = ctx.work / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pipeline",
           "train", "--fold", "0", "--cache", str(ctx.cache), "--folds", str(ctx.folds), "--out", str(out),
           "--live", str(out / "live"), "--no-resume"]
    for s in ctx.sets("train.epochs=1", "train.sync_bn=on"):  # SyncBatchNorm: CUDA DDP only
        cmd += ["--set", s]
    watch = _GpuProcesses() if shutil.which("nvidia-smi") else None
    proc = subprocess.Popen(cmd, cwd=ctx.work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    if watch:
        watch.start(exclude={os.getpid()})
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        if watch:
            watch.stop()
    _require(proc.returncode == 0, f"torchrun exited {proc.returncode}: {output[-1500:]}")
    metrics = json.loads((out / "fold0" / "metrics.json").read_text())
    _require(math.isfinite(metrics["val_mae"]), f"DDP val MAE {metrics['val_mae']}")
    res = {"val_mae": metrics["val_mae"], "images_per_s": metrics.get("images_per_s")}
    if watch:
        res["max_processes_on_gpu0"] = watch.max_on_first
        _require(watch.max_on_first <= 1, f"{watch.max_on_first} processes of the run on GPU 0 (one per GPU expected)")
    return res


# ------------------------------------------------------------------------------ helpers

class _LogCapture(logging.Handler):
    """The messages of the logger it is on (`logging_to`)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = list[str]()

    def emit(self, record):
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class _GpuProcesses:
    """Polls nvidia-smi for the compute processes on the first GPU; keeps the most seen at once."""

    def __init__(self):
        self.max_on_first, self._stop = 0, threading.Event()

    def start(self, exclude: set[int]):
        self.exclude = exclude
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        first = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                               text=True).stdout.split()[:1]
        while not self._stop.wait(0.5):
            r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                               capture_output=True, text=True)
            pids = {int(p) for p, _, uuid in (line.partition(",") for line in r.stdout.splitlines())
                    if p.strip().isdigit() and uuid.strip() in first and int(p) not in self.exclude}
            self.max_on_first = max(self.max_on_first, len(pids))

    def stop(self):
        self._stop.set()
        self.thread.join()


CHECKS: list[tuple[str, Callable[[Context], dict]]] = [
    ("setup", check_setup),
    ("throughput_channels_last", lambda ctx: check_throughput(ctx, True)),
    ("throughput_nchw", lambda ctx: check_throughput(ctx, False)),
    ("resume_auto", lambda ctx: check_resume(ctx, "auto")),
    ("resume_fp16", lambda ctx: check_resume(ctx, "fp16")),
    ("predict", check_predict),
    ("ddp", check_ddp),
]


def run_gpu_check(out: str | os.PathLike, cpu: bool = False) -> dict[str, Any]:
    """Every check; {name: figures or {"error": ...}, "failures": [...]} also written to
    <out>/gpu-check.json. Raises PipelineError when there is no CUDA device (and not cpu)."""
    out = Path(out)
    ctx = Context(out, cpu)
    if ctx.work.exists():
        shutil.rmtree(ctx.work)
    ctx.work.mkdir(parents=True)
    t_start = time.perf_counter()
    res: dict[str, Any] = {"mode": "cpu dry run" if cpu else "gpu", "sizes": {k: v for k, v in ctx.size.items()}}
    res["env"] = check_env(ctx)
    log.info("env: %s", json.dumps(res["env"]))
    failures: list[str] = []
    checks = [("demo", make_demo), *CHECKS]
    for name, fn in checks:
        t0 = time.perf_counter()
        try:
            res[name] = fn(ctx)
        except Exception as e:  # noqa: BLE001 -- a crash is a failed check; the others still run
            kind = "mismatch" if isinstance(e, CheckFailed) else type(e).__name__
            res[name] = {"error": f"{kind}: {e}"}
            failures.append(name)
            log.error("%s FAILED (%s): %s", name, kind, e)
            if name == "demo":  # every later check needs the data
                break
        else:
            log.info("%s ok (%.1f s): %s", name, time.perf_counter() - t0, json.dumps(res[name], default=str))
        res[name + "_s"] = round(time.perf_counter() - t0, 2)
    res["failures"], res["wall_s"] = failures, round(time.perf_counter() - t_start, 1)
    write_json(out / "gpu-check.json", res)
    if failures:
        log.error("gpu-check: %d of %d checks FAILED (%s) in %.0f s -> %s", len(failures), len(checks),
                  ", ".join(failures), res["wall_s"], out / "gpu-check.json")
    else:
        log.info("gpu-check: all %d checks passed in %.0f s -> %s", len(checks), res["wall_s"], out / "gpu-check.json")
    return res


@click.command("gpu-check")
@click.option("--out", default="gpu-check", show_default=True, help="folder for gpu-check.json and the work files "
                                                                   "(--train-real: train-real.json and its log only)")
@click.option("--cpu", is_flag=True, help="dry run on the CPU at toy sizes (checks the script, not a GPU)")
@click.option("--train-real", "pack", default=None, metavar="PACK",
              help="instead of the checks: train fold 0 of --params on this face pack (`pipeline pack`), predict "
                   "its validation faces with the recipe's TTA, write train-real.json (pipeline/tools/gpu_real.py)")
@click.option("--params", "params_path", default=GPU_RECIPE, show_default=True, help="--train-real: the recipe")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="--train-real: override a param")
@click.option("--budget-min", default=6.0, show_default=True, type=click.FloatRange(min=0.1),
              help="--train-real: train.epochs = the most that fit this many minutes (timed by a 3-epoch probe), "
                   "at most the recipe's")
@click.option("--epochs", default=None, type=click.IntRange(min=1), help="--train-real: these epochs, no probe")
@click.option("--wall-min", default=9.0, show_default=True, type=click.FloatRange(min=0.1),
              help="--train-real: the whole call's limit; --fp16-too runs only if it fits")
@click.option("--fp16-too", is_flag=True, help="--train-real: then the same training with train.amp=fp16")
@click.option("--work", default=None, help="--train-real: keep the work files here (default: a temp folder)")
def gpu_check_cmd(out: str, cpu: bool, pack: str | None, params_path: str, overrides: tuple[str, ...],
                  budget_min: float, epochs: int | None, wall_min: float, fp16_too: bool, work: str | None) -> None:
    """The first run of the GPU path: device, AMP training steps, kill and resume, flip-TTA
    predict, DDP. With --train-real PACK: the GPU recipe trained on real faces instead.
    Exit 0: all passed; 1: a check (a phase) failed; 2: no CUDA device."""
    if pack is not None:
        res = run_train_real(pack, out, params=params_path, sets=overrides, cpu=cpu, budget_min=budget_min,
                             epochs=epochs, wall_min=wall_min, fp16_too=fp16_too, work=work)
    else:
        res = run_gpu_check(out, cpu)
    if res["failures"]:
        raise click.exceptions.Exit(1)


def main(argv=None) -> None:
    """As `pipeline`'s main: a PipelineError is one `error:` line and exit 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        code = gpu_check_cmd.main(args=argv, standalone_mode=False)  # click returns Exit's code here
    except PipelineError as e:
        click.echo(f"error: {e.format()}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
