"""One training run built once (`build_training` -> `TrainSetup`: model, optimizer, AMP scaler,
loss, augmenting dataset, sampler, schedule state), its epochs' loaders, the fold it trains on,
what its checkpoints carry, and resuming from them. `pipeline train` and `pipeline bench`
build the same setup; what made a run's weights is pipeline/training/identity.py."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.config import params_source
from pipeline.core.errors import PipelineError
from pipeline.core.heap import keep_freed_memory
from pipeline.core.params_schema import Config
from pipeline.core.paths import EXTRA_DIR
from pipeline.formats.cache import load_cache
from pipeline.formats.checkpoint import crop_stamp
from pipeline.formats.folds import read_folds
from pipeline.keypoints.geometry import crop_to_input
from pipeline.models import create_model
from pipeline.training.augment import TrainAugment
from pipeline.training.ema import ModelEma
from pipeline.training.extras import join_training, load_extras
from pipeline.training.identity import TrainRuntime, resolve_train_runtime, resumable
from pipeline.training.loader import DeviceLoader, EpochSampler, FaceDataset, make_loader
from pipeline.training.loop import StepState
from pipeline.training.losses import loss_from_params
from pipeline.training.optim import build_optimizer

log = logging.getLogger(__name__)

@dataclass
class TrainSetup:
    """One training run, built once by `build_training`: the model and what updates it, the
    data it learns from and where the schedule stands. `fit` runs its epochs (one
    `make_epoch_loader` + `train_steps` each); `pipeline bench` times the same steps."""

    cfg: Config
    device: torch.device
    runtime: TrainRuntime  # train's switches as resolved for this run
    model: torch.nn.Module  # the weights that are saved
    net: torch.nn.Module  # what trains: the model, or its DDP / compiled wrapper (same parameters)
    optimizer: torch.optim.Optimizer
    scaler: Any  # torch.amp.GradScaler for fp16 autocast, else None
    loss_fn: torch.nn.Module
    dataset: Any  # data.FaceDataset of the training faces, with TrainAugment
    sampler: Any  # data.EpochSampler
    state: StepState
    batch_size: int  # per rank: train.batch_size / world
    mean_shape: np.ndarray  # (K, 2) mean training shape, input px
    rank: int = 0
    world: int = 1
    ema: ModelEma | None = None  # the weights' moving average (train.ema_decay > 0)

    @property
    def amp(self) -> torch.dtype | None:
        """The autocast dtype, None = fp32."""
        return self.runtime.amp

    @property
    def channels_last(self) -> bool:
        return self.runtime.channels_last


def build_training(cfg: Config, cache, train_idx: np.ndarray, device: torch.device, rank: int = 0,
                   world: int = 1) -> TrainSetup:
    """Model (seeded by train.seed), optimizer, AMP scaler, loss, augmenting dataset and
    sampler for training on the faces `train_idx` of `cache`, with the lr schedule over
    train.epochs. Under DDP (world > 1) the model is wrapped and each rank takes its share
    of every batch."""
    tcfg, mcfg = cfg.train, cfg.model
    if tcfg.batch_size % world:
        raise PipelineError(params_source("train.batch_size"),
                            f"train.batch_size {tcfg.batch_size} is not divisible by "
                            f"the {world} DDP processes")
    # train.batch_size is the global batch: each rank takes its share, so the lr and the
    # schedule do not change with the number of processes
    rank_batch = tcfg.batch_size // world
    torch.manual_seed(tcfg.seed)
    if device.type == "cuda":
        # fixed input shapes: cuDNN times its algorithms once per shape and keeps the
        # fastest (not bit-reproducible between runs; see docs/scaling.md, Determinism)
        torch.backends.cudnn.benchmark = True
    runtime = resolve_train_runtime(tcfg, device, world)
    amp, channels_last = runtime.amp, runtime.channels_last
    keep_freed_memory(runtime.keep_freed_memory)
    schema, cache_size, input_size = cache.schema, cache.faces.shape[1], mcfg.input_size

    model = create_model(mcfg.preset, schema.k, in_chans=mcfg.in_chans, input_size=input_size,
                         **mcfg.options).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if runtime.sync_bn:
        # same state_dict keys as BatchNorm2d: checkpoints load into the plain model
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if runtime.compile:
        # compiled on the first step (and again for an epoch's smaller last batch); the
        # parameters stay the model's, so checkpoints and evaluation use the plain module
        net = torch.compile(net)  # type: ignore[assignment]  # of a Module: an OptimizedModule, a Module
    # the average starts from the seeded initial weights (before any step)
    ema = ModelEma(model, tcfg.ema_decay) if tcfg.ema_decay > 0 else None
    optimizer = build_optimizer(model, tcfg)
    # fp16 only (bf16 has fp32's range); on the run's device (a "cuda" scaler on a CPU run
    # disables itself and fp16 gradients would underflow unscaled)
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None

    # the mean shape of the training faces (input px) fixes the structure-loss neighbours
    mean_shape = crop_to_input(cache.keypoints[train_idx].mean(0).astype(np.float64), cache_size, input_size)
    neighbours = torch.as_tensor(schema.neighbours(mean_shape), device=device)
    heatmap_model = hasattr(model, "forward_maps")
    if tcfg.heatmap_lambda > 0 and not heatmap_model:
        log.warning("%s regresses coordinates directly: train.heatmap_lambda ignored", mcfg.preset)
    loss_fn = loss_from_params(tcfg, input_size, neighbours, heatmap_model)

    steps_per_epoch = math.ceil(math.ceil(len(train_idx) / world) / rank_batch)
    state = StepState(0, steps_per_epoch * tcfg.epochs,
                      round(tcfg.warmup_epochs * steps_per_epoch), tcfg.lr)
    augment = TrainAugment.from_config(schema, cache_size, cfg)  # model.input_size and the train section
    # each sample's augmentation from its own generator (train.seed, epoch, sample): the same
    # batches whatever train.num_workers, so the worker count is a runtime param
    dataset = FaceDataset(cache.faces, cache.keypoints, train_idx, augment, mcfg.in_chans, seed=tcfg.seed)
    sampler = EpochSampler(len(dataset), tcfg.seed, rank=rank, world=world)
    return TrainSetup(cfg, device, runtime, model, net, optimizer, scaler, loss_fn, dataset, sampler,
                      state, rank_batch, mean_shape, rank, world, ema)


def make_epoch_loader(setup: TrainSetup, epoch: int):
    """The DeviceLoader of epoch `epoch` (0-based): the sampler's order is fixed by
    (train.seed, epoch) and each sample's augmentation by (train.seed, epoch, sample), so a
    resumed run sees exactly the batches the uninterrupted one saw, at any
    train.num_workers. Torch's global RNG (and each worker's) is seeded per epoch and rank
    as well, for anything else that may draw from it."""
    tcfg = setup.cfg.train
    epoch_seed = tcfg.seed * 1000 + epoch + 1_000_003 * setup.rank
    torch.manual_seed(epoch_seed)
    setup.sampler.set_epoch(epoch)
    setup.dataset.set_epoch(epoch)
    loader = make_loader(setup.dataset, setup.batch_size, setup.sampler, setup.device, tcfg.num_workers,
                         drop_last=False, seed=epoch_seed)
    return DeviceLoader(loader, setup.device, setup.channels_last)


def load_fold(cache_dir: str | Path, folds_path: str | Path, fold: int, cfg: Config | None = None,
              extra_root: str | Path = EXTRA_DIR):
    """(training cache, train indices, validation indices) of fold `fold`. With `cfg`, the
    faces of its data.extra_train (caches under `extra_root`) follow the main faces in the
    returned cache, and all of them are on the training side; the validation faces are
    always the main ones of folds.csv."""
    cache = load_cache(Path(cache_dir) / "train")
    if cache.keypoints is None:
        raise PipelineError(Path(cache_dir) / "train", "training cache has no keypoints")
    fold_of = read_folds(folds_path, cache.meta, Path(cache_dir) / "train")  # rows must be the cache's faces
    k = int(fold_of.max()) + 1
    if not 0 <= fold < k:
        raise PipelineError(folds_path, f"fold {fold} out of range: folds are 0..{k - 1}")
    train_idx, val_idx = np.flatnonzero(fold_of != fold), np.flatnonzero(fold_of == fold)
    extras = load_extras(cfg, cache, extra_root) if cfg is not None else []
    if extras:
        n_main = len(cache)
        cache = join_training(cache, extras)
        train_idx = np.concatenate([train_idx, np.arange(n_main, len(cache))])
    return cache, train_idx, val_idx


def checkpoint_meta(setup: TrainSetup, cache, fold: int, identity: dict[str, Any]) -> dict[str, Any]:
    """What every checkpoint of this run carries besides the weights and the step state:
    `identity` is the run's `training_identity`."""
    # "crop": the geometry of the cache the model actually saw (params may name another
    # size than the cache on disk); standalone prediction must crop new faces the same way
    return {"model_config": setup.model.config, "schema": cache.schema.to_dict(), "config": setup.cfg.model_dump(),
            "crop": crop_stamp(cache.faces.shape[1], cache.info["expand"], cache.info.get("label_origin", 0.0)),
            "mean_shape": setup.mean_shape.tolist(), "fold": fold, "identity": identity}


def resume_training(setup: TrainSetup, out: Path, schema, fold: int,
                    identity: dict[str, Any]) -> tuple[int, float, list[dict]]:
    """Load out/last.pt into the setup when it was made from the same inputs (`identity`,
    the run's `training_identity`): (epochs done, best val MAE, history); (0, inf, []) when
    there is nothing to resume, with one log line saying which inputs differ."""
    last_path = out / "last.pt"
    ck, differ = resumable(last_path, identity, schema)
    if ck is None:
        if differ:
            log.info("fold %d: %s was made from other inputs (%s); training afresh", fold, last_path,
                     ", ".join(differ))
        return 0, float("inf"), []
    setup.model.load_state_dict(ck["model"])
    fused = [g.get("fused") for g in setup.optimizer.param_groups]
    setup.optimizer.load_state_dict(ck["optimizer"])
    for g, f in zip(setup.optimizer.param_groups, fused):  # this run's device decides, not the checkpoint's
        g["fused"] = f
    if setup.scaler is not None and ck.get("scaler"):
        setup.scaler.load_state_dict(ck["scaler"])
    if setup.ema is not None:
        setup.ema.load_state_dict(ck["ema"])
    setup.state.step = ck["scheduler_step"]
    best_mae, history = ck["best_mae"], list(ck.get("history", []))
    if not (out / "best.pt").exists():
        best_mae = float("inf")  # best.pt was removed: the next epoch rewrites it
    log.info("fold %d: resuming from %s at epoch %d", fold, last_path, ck["epoch"])
    return ck["epoch"], best_mae, history

