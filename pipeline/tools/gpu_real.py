"""`python -m pipeline.tools.gpu_check --train-real PACK` (`make gpu-train`): the GPU recipe
trained for real, in one call of a few minutes on one GPU. It unpacks a face pack
(`pipeline pack`, pipeline/formats/pack.py), trains fold 0 of the recipe on it, predicts the
fold's validation faces with the recipe's TTA (the predict stage's own `run_predict`) and
writes one JSON, `<out>/train-real.json`, beside the training log `<out>/train-real.log`:

* env: the GPU, the torch build, the AMP dtype;
* budget: unless `--epochs` is given, a probe (a throwaway 3-epoch training of the same
  setup, every epoch validated and saved) times a whole epoch, and train.epochs becomes the
  most that fit `--budget-min` (never more than the recipe's): the cosine schedule must know
  its length before the first step, so the probe runs first;
* train: epochs, best epoch, img/s of the real data path per epoch (cache -> augmentation ->
  DataLoader workers -> DeviceLoader, as `pipeline train` logs it), the data-wait share, wall
  per epoch, peak GPU memory;
* val: fold 0's validation faces predicted from best.pt, NME and MAE with the recipe's TTA
  and without, and the NME of each face region (jaw, brows, nose, eyes, mouth);
* fp16 (`--fp16-too`): the same training with train.amp=fp16 (the GradScaler path of GPUs
  without bf16) and its figures, run only when it fits in what is left of `--wall-min`;
* phases_s: the wall of every phase; wall_s the whole.

The work files (the unpacked cache, checkpoints, predictions) go to a temp folder (or
`--work`), never under `--out`: what comes back from a GPU machine is one JSON and one log.
A phase that fails is recorded in the JSON (`failures`, the phase's `error`), the JSON is
still written, and the command exits 1. `--cpu` runs it all on the CPU with a tiny model at
the pack's own crop size: a dry run of the script (its test), not a measurement."""

from __future__ import annotations

import logging
import math
import re
import shutil
import tempfile
import time
from contextlib import closing, contextmanager
from pathlib import Path
from statistics import median
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import torch

from pipeline.core.config import load_config, with_overrides
from pipeline.core.device import describe_device, resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, write_json
from pipeline.core.params_schema import Config
from pipeline.formats.cache import load_cache
from pipeline.formats.pack import PACK_MARKER, read_pack_info, unpack
from pipeline.formats.predictions import read_predictions
from pipeline.keypoints.metrics import mae, nme, region_nme
from pipeline.stages.predict import run_predict
from pipeline.stages.train import fit

log = logging.getLogger(__name__)

GPU_RECIPE = "recipes/gpu.yaml"
FOLD = 0
PROBE_EPOCHS = 3  # the first epoch holds cuDNN's autotuning; the other two time a whole epoch
RESULT, LOG = "train-real.json", "train-real.log"
# --cpu: a tiny model at the pack's own crop size, a few faces a step, in the main process
CPU_DRY_SETS = ["model.preset=resunet-tiny", "train.batch_size=4", "train.num_workers=0", "train.device=cpu",
                "predict.device=cpu", "train.epochs=2", "train.warmup_epochs=1", "train.val_every=1"]
# the logger of `pipeline train` (pipeline.stages.train) and its epoch line: "fold 0 epoch 3:
# loss ... 812.4 img/s  data wait 3.1%"
TRAIN_LOGGER = "pipeline.stages.train"
EPOCH_LINE = re.compile(r"^fold (\d+) epoch (\d+): .* (\S+) img/s\s+data wait (\S+)%$")


def epochs_for_budget(budget_s: float, s_per_epoch: float, cap: int) -> int:
    """The most whole epochs of `s_per_epoch` that fit `budget_s`, at least 1, at most `cap`."""
    if not (math.isfinite(s_per_epoch) and s_per_epoch > 0):
        raise ValueError(f"an epoch of {s_per_epoch} s")
    return max(1, min(int(cap), int(budget_s // s_per_epoch)))


H = TypeVar("H", bound=logging.Handler)


@contextmanager
def logging_to(handler: H, name: str) -> Iterator[H]:
    """`handler` on logger `name`, at INFO (its level restored after), while in a `with` block."""
    logger = logging.getLogger(name)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


class EpochClock(logging.Handler):
    """The epoch lines of `pipeline train` (on TRAIN_LOGGER, `logging_to`): when each was
    logged (perf_counter), its img/s and data-wait share."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.epochs: list[dict[str, float]] = []

    def emit(self, record):
        m = EPOCH_LINE.match(record.getMessage())
        if m:
            self.epochs.append({"epoch": int(m[2]), "t": time.perf_counter(), "images_per_s": float(m[3]),
                                "data_wait_frac": float(m[4]) / 100})

    def s_per_epoch(self, first: int = 1) -> float:
        """Mean wall between the epoch lines after epoch `first` (its save, loader start,
        steps and validation): what one more epoch costs once cuDNN has tuned."""
        t = [e["t"] for e in self.epochs if e["epoch"] >= first]
        if len(t) < 2:
            raise PipelineError(None, f"{len(self.epochs)} epoch line(s) logged by pipeline.stages.train: cannot time "
                                      "an epoch (did its log line change?)")
        return (t[-1] - t[0]) / (len(t) - 1)

    def rates(self) -> dict[str, float]:
        """img/s of the real data path: the first epoch, the median of the others; mean data wait."""
        if not self.epochs:
            raise PipelineError(None, "no epoch line logged by pipeline.stages.train (did its log line change?)")
        rest = self.epochs[1:] or self.epochs
        return {"images_per_s_first_epoch": self.epochs[0]["images_per_s"],
                "images_per_s_median": median(e["images_per_s"] for e in rest),
                "data_wait_frac_mean": float(np.mean([e["data_wait_frac"] for e in rest]))}


def reset_peak_memory(device: torch.device) -> None:
    """Start `peak_memory_gib` afresh (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """The most GPU memory allocated since `reset_peak_memory`, GiB; None off CUDA."""
    return torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None


def score_fold(cache_dir: Path, predictions: Path, fold: int) -> dict[str, Any]:
    """NME and MAE of one fold's validation faces from the predict stage's oof.npz, with the
    TTA the params asked for (`tta`) and without (`plain`), and the NME per face region."""
    train = load_cache(cache_dir / "train")
    assert train.keypoints_orig is not None  # a training cache always has them
    oof = read_predictions(predictions / "oof.npz", ("fold", "tta", "plain"))
    val = oof["fold"] == fold
    truth, eyes, regions = train.keypoints_orig[val], train.schema.eyes, train.schema.regions()
    res: dict[str, Any] = {"fold": fold, "faces": int(val.sum())}
    for kind in ("tta", "plain"):
        pred = oof[kind][val]
        if not np.isfinite(pred).all():
            raise PipelineError(predictions / "oof.npz", f"non-finite {kind} predictions of fold {fold}")
        res[f"nme_{kind}"], res[f"mae_{kind}"] = nme(pred, truth, eyes), mae(pred, truth)
        res[f"regions_nme_{kind}"] = region_nme(pred, truth, regions, eyes)
    return res


class Run:
    """The phases of one call, each timed; a failed phase is recorded and ends the run. The
    JSON is rewritten after every phase, so a call killed at its time limit still leaves the
    phases it finished."""

    def __init__(self, res: dict[str, Any], path: Path, t_start: float):
        self.res, self.path, self.t_start = res, path, t_start
        self.failures: list[str] = res.setdefault("failures", [])
        self.phases: dict[str, float] = res.setdefault("phases_s", {})

    def save(self) -> None:
        self.res["wall_s"] = round(time.perf_counter() - self.t_start, 1)
        write_json(self.path, self.res)

    def phase(self, name: str, fn: Callable[[], Any], into: dict[str, Any] | None = None, key: str = "") -> Any:
        """fn(), its result kept as into[key] (when given) before the JSON is saved."""
        t0 = time.perf_counter()
        log.info("train-real: %s ...", name)
        try:
            result = fn()
            if into is not None:
                into[key] = result
            return result
        except Exception as e:  # noqa: BLE001 -- recorded in the JSON, which is still written
            self.failures.append(name)
            self.res[name] = {"error": f"{type(e).__name__}: {e.format() if isinstance(e, PipelineError) else e}"}
            log.error("train-real: %s FAILED: %s", name, self.res[name]["error"])
            raise
        finally:
            self.phases[name] = round(time.perf_counter() - t0, 2)
            self.save()


def run_train_real(pack: str | Path, out: str | Path, *, params: str | None = GPU_RECIPE, sets: tuple[str, ...] = (),
                   cpu: bool = False, budget_min: float = 6.0, epochs: int | None = None, wall_min: float = 9.0,
                   fp16_too: bool = False, work: str | Path | None = None) -> dict[str, Any]:
    """Unpack, [probe,] train fold 0, predict, score -> <out>/train-real.json (also returned).
    What is wrong before the work starts (no pack, params that crop otherwise than the pack,
    no CUDA) is a PipelineError, and nothing is written."""
    t_start = time.perf_counter()
    out = check_output(out, folder=True)
    if not cpu and not torch.cuda.is_available():
        raise PipelineError("gpu-check", f"no usable CUDA device (torch {torch.__version__}, built for CUDA "
                                         f"{torch.version.cuda}): run it on a GPU machine, or `--cpu` for a dry "
                                         "run of the script")
    info = read_pack_info(pack)
    side, expand = info["splits"]["train"]["side"], info["splits"]["train"]["expand"]
    sets = tuple(sets)
    if cpu:  # the tiny model at the pack's own crop
        sets = (*CPU_DRY_SETS, f"crop.side={side}", f"crop.expand={expand}", f"model.input_size={side}", *sets)
    cfg = load_config(params, sets)
    if (cfg.crop.side, cfg.crop.expand) != (side, expand):
        raise PipelineError(Path(pack) / PACK_MARKER, f"holds {side} px crops with expand {expand:g}, the params crop "
                                                      f"{cfg.crop.side} px with expand {cfg.crop.expand:g}: rebuild "
                                                      "the pack with `pipeline pack` and the same params")
    device = resolve_device("cpu" if cpu else "cuda")
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / LOG, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s", "%H:%M:%S"))
    with closing(handler), logging_to(handler, "pipeline"):
        tmp = None if work else tempfile.TemporaryDirectory(prefix="train-real-")
        wdir = Path(work) if work else Path(tmp.name)  # type: ignore[union-attr]
        t = cfg.train
        res: dict[str, Any] = {
            "mode": "cpu dry run" if cpu else "gpu", "params": params, "sets": list(sets),
            "env": describe_device(device),
            "pack": {"path": str(pack), "jpeg_quality": info["jpeg_quality"], "bytes": info["bytes"],
                     "splits": {n: {k: s.get(k) for k in ("faces", "side", "expand", "mean_abs_diff")}
                                for n, s in info["splits"].items()}},
            "recipe": {"preset": cfg.model.preset, "input_size": cfg.model.input_size, "batch_size": t.batch_size,
                       "optimizer": t.optimizer, "lr": t.lr, "epochs": t.epochs, "val_every": t.val_every,
                       "amp": t.amp, "num_workers": t.num_workers, "heatmap_lambda": t.heatmap_lambda,
                       "tta": cfg.predict.tta, "tta_jitter": cfg.predict.tta_jitter}}
        run = Run(res, out / RESULT, t_start)
        try:
            log.info("env: %s", res["env"])
            _phases(run, Path(pack), wdir, cfg, device, budget_min, epochs, wall_min, fp16_too, t_start)
        except Exception as e:  # noqa: BLE001 -- the JSON is still written, with what failed
            if not res["failures"]:  # not a phase's (Run.phase records those)
                res["failures"].append("run")
                res["run"] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            run.save()
            if res["failures"]:
                log.error("train-real: FAILED (%s) in %.0f s -> %s", ", ".join(res["failures"]), res["wall_s"],
                          out / RESULT)
            else:
                log.info("train-real: done in %.0f s -> %s", res["wall_s"], out / RESULT)
            if tmp is not None:
                tmp.cleanup()
    return res


def _phases(run: Run, pack: Path, wdir: Path, cfg: Config, device: torch.device, budget_min: float,
            epochs: int | None, wall_min: float, fp16_too: bool, t_start: float) -> None:
    res, t = run.res, cfg.train
    cache, folds = wdir / "cache", wdir / "folds.csv"
    run.phase("unpack", lambda: unpack(pack, cache, folds))

    if epochs is None:
        def probe() -> dict[str, Any]:
            pcfg = with_overrides(cfg, [f"train.epochs={PROBE_EPOCHS}", "train.val_every=1"])
            with logging_to(EpochClock(), TRAIN_LOGGER) as clock:
                fit(pcfg, FOLD, cache, folds, wdir / "probe", resume=False, live_dir=None)
            shutil.rmtree(wdir / "probe", ignore_errors=True)
            s = clock.s_per_epoch()
            n = epochs_for_budget(budget_min * 60, s, t.epochs)
            log.info("budget: %.2f s an epoch (probe: %d epochs, each validated and saved) -> train.epochs %d of the "
                     "recipe's %d fit %.1f min%s", s, PROBE_EPOCHS, n, t.epochs, budget_min,
                     "" if n == t.epochs else " (capped)")
            return {"budget_min": budget_min, "probe_epochs": PROBE_EPOCHS, "probe_s_per_epoch": s,
                    "probe_images_per_s": clock.rates()["images_per_s_median"], "recipe_epochs": t.epochs,
                    "epochs": n, "capped": n < t.epochs}
        run.phase("probe", probe, res, "budget")
        epochs = int(res["budget"]["epochs"])
    else:
        res["budget"] = {"epochs": int(epochs), "recipe_epochs": t.epochs, "from": "--epochs"}
    assert epochs is not None

    train_and_score(run, res, "", with_overrides(cfg, [f"train.epochs={epochs}"]), cache, folds, wdir / "models",
                    wdir / "predictions", device)
    if fp16_too:
        left = wall_min * 60 - (time.perf_counter() - t_start)
        need = run.phases["train"] + run.phases["predict"]
        if need > left:
            res["fp16"] = {"skipped": f"needs about {need:.0f} s (the bf16 run's train + predict), "
                                      f"{max(left, 0):.0f} s left of --wall-min {wall_min:g}"}
            log.info("fp16: skipped: %s", res["fp16"]["skipped"])
        else:
            res["fp16"] = {}
            fp16_cfg = with_overrides(cfg, [f"train.epochs={epochs}", "train.amp=fp16"])
            train_and_score(run, res["fp16"], "_fp16", fp16_cfg, cache, folds, wdir / "models-fp16",
                            wdir / "predictions-fp16", device)


def train_and_score(run: Run, section: dict[str, Any], suffix: str, cfg: Config, cache: Path, folds: Path,
                    models: Path, predictions: Path, device: torch.device) -> None:
    """fit fold 0, then run_predict and score_fold into section["train"] and section["val"]
    (each as soon as it is done), as phases "train<suffix>" and "predict<suffix>"."""
    def train() -> dict[str, Any]:
        reset_peak_memory(device)
        t0 = time.perf_counter()
        with logging_to(EpochClock(), TRAIN_LOGGER) as clock:
            m = fit(cfg, FOLD, cache, folds, models, resume=False, live_dir=None)
        wall = time.perf_counter() - t0
        return {"epochs": m["epochs"], "best_epoch": m["best_epoch"], "val_mae_no_tta": m["val_mae"],
                "val_nme_no_tta": m["val_nme"], "wall_s": round(wall, 1), "s_per_epoch": wall / m["epochs"],
                **clock.rates(), "peak_memory_gib": peak_memory_gib(device)}

    def predict() -> dict[str, Any]:
        reset_peak_memory(device)
        run_predict(cfg, str(cache), str(folds), str(models), str(predictions))
        return {**score_fold(cache, predictions, FOLD), "peak_memory_gib": peak_memory_gib(device)}

    log.info("train%s: %s", suffix, run.phase("train" + suffix, train, section, "train"))
    log.info("predict%s: %s", suffix, run.phase("predict" + suffix, predict, section, "val"))
