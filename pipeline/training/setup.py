"""One training run built once (`build_training` -> `TrainSetup`: model, optimizer, AMP scaler,
loss, augmenting dataset, sampler, schedule state), its epochs' loaders, the fold it trains on,
what its checkpoints carry, and resuming from them. `pipeline train` and `pipeline bench`
build the same setup."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.config import params_source, result_params
from pipeline.core.device import amp_dtype, resolve_device, use_channels_last, use_compile, use_sync_bn
from pipeline.core.digest import folder_sha256, source_sha256
from pipeline.core.errors import PipelineError
from pipeline.core.heap import keep_freed_memory, use_keep_freed_memory
from pipeline.core.params_schema import DEFAULTS, Config, TrainParams, is_runtime, section_fields
from pipeline.core.paths import EXTRA_DIR
from pipeline.formats.cache import CACHE_MARKER, PHOTOS_FILE, load_cache, read_info
from pipeline.formats.checkpoint import crop_stamp, load_checkpoint
from pipeline.formats.folds import read_folds
from pipeline.keypoints.geometry import crop_to_input
from pipeline.models import create_model
from pipeline.training.augment import TrainAugment
from pipeline.training.ema import ModelEma
from pipeline.training.extras import extras_in_order, join_training, load_extras
from pipeline.training.loader import DeviceLoader, EpochSampler, FaceDataset, make_loader
from pipeline.training.loop import StepState
from pipeline.training.losses import loss_from_params
from pipeline.training.optim import build_optimizer

log = logging.getLogger(__name__)

# A training's identity names what made its weights: a fold resumes from, or is found trained
# in, a checkpoint of the same identity, so it changes exactly when the weights would. An
# input enters when it can change the weights, in the form that decides them:
# - the data by content: the train split of the face cache, the fold of each face in
#   folds.csv, the extra caches in the order they join; less what only records where and
#   how a split was cropped (UNREAD_FILES, UNREAD_INFO; the crop run id hashes the test split
#   too). So the params that only locate or shape these inputs (data, crop, folds) stay out,
#   the inputs they make are hashed instead, and so does folds.train (which folds get a stage);
# - the params of model and train but the runtime ones, each switch as it resolves here
#   (train.amp as `precision`, sync_bn and channels_last as on/off), and the DDP world size,
#   which splits train.batch_size, pads the sampler and decides sync_bn: auto;
# - the code: the tokens of the train command's import closure.
# dvc.yaml's train stage lists these inputs as deps and these params as written (TRAIN_SECTIONS
# less TRAIN_IGNORES; data.extra_train: its names pick the extra caches and their order), and
# the fold's params.resolved.yaml records them.
TRAIN_SECTIONS = ("data", "model", "train")
TRAIN_IGNORES = (*(f"data.{k}" for k in section_fields("data") if k != "extra_train"),
                 *(f"train.{k}" for k, f in section_fields("train").items() if is_runtime(f)))
# a cache split's files that no training reads (the params it was cropped under, an extra's
# photo list) and its info.json's records of where it came from (the XML's path, an extra's
# provenance) and of the crop run (its id hashes the test split too)
UNREAD_FILES = ("params.resolved.yaml", PHOTOS_FILE)
UNREAD_INFO = ("xml", "run", "extra")
# the train stage's command module: the code a training runs is its import closure (the
# pipeline/ deps of dvc.yaml's train stage)
TRAIN_COMMAND = "pipeline.stages.train"
PRECISION_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _with_defaults(stored: dict, like: dict | None = None) -> dict:
    """Params sections stored by a checkpoint, each param they lack (added since) at its
    default, which by rule reproduces the old behaviour (train.rotate 0): adding a param
    does not throw away a resumable run. With `like`, only the params `like` holds."""
    defaults = DEFAULTS.model_dump()
    return {s: {**{k: d for k, d in defaults.get(s, {}).items() if like is None or k in like.get(s, {})}, **v}
            if isinstance(v, dict) else v for s, v in stored.items()}


def _config_key(cfg: Config | dict) -> dict:
    """The params of model and train that can change the weights, as written (of a config, or
    of the config dict a checkpoint stored)."""
    return result_params(_with_defaults(cfg) if isinstance(cfg, dict) else cfg, ("model", "train"),
                         exclude=TRAIN_IGNORES)


def _weight_params(cfg: Config, runtime: TrainRuntime) -> dict:
    """`_config_key` with train's switches as `runtime` resolved them (train.amp as the
    identity's `precision`) and the DDP world size."""
    key = _config_key(cfg)
    train = {k: v for k, v in key["train"].items() if k != "amp"}
    return {**key, "train": {**train, "channels_last": runtime.channels_last, "sync_bn": runtime.sync_bn,
                             "world": runtime.world}}


def cache_identity(split: str | Path) -> dict[str, str]:
    """A cache split's identity: its crop run id (a label: never compared) and the sha256 of
    what training reads of it (its files less UNREAD_FILES, info.json less UNREAD_INFO)."""
    info, _ = read_info(split)
    read = {k: v for k, v in info.items() if k not in UNREAD_INFO}
    h = hashlib.sha256(json.dumps(read, sort_keys=True, default=str).encode())
    h.update(bytes.fromhex(folder_sha256(split, skip=(CACHE_MARKER, *UNREAD_FILES))))
    return {"run": str(info.get("run")), "content": h.hexdigest()}


def folds_identity(folds_path: str | Path) -> str:
    """The sha256 of the fold of each face in folds.csv (cache order); its other columns name
    the faces, checked against the cache when a fold loads."""
    return hashlib.sha256(read_folds(folds_path).tobytes()).hexdigest()


def training_identity(cfg: Config, cache_dir: str | Path, folds_path: str | Path, runtime: TrainRuntime,
                      extra_root: str | Path = EXTRA_DIR) -> dict[str, Any]:
    """What made a fold's weights (the rule above), one named part each: params (with
    `runtime`'s switches and world size), cache, folds, extra_train ({name: cache identity}
    of the caches under `extra_root`, in the order they join), code and precision
    (`runtime`'s autocast dtype). Every checkpoint stores it; a run resumes only from a
    checkpoint of the same identity. An input that joins the training is one more entry here."""
    return {"params": _weight_params(cfg, runtime),
            "cache": cache_identity(Path(cache_dir) / "train"),
            "folds": folds_identity(folds_path),
            "extra_train": {name: cache_identity(Path(extra_root) / name) for name, _ in extras_in_order(cfg)},
            "code": source_sha256(TRAIN_COMMAND),
            "precision": PRECISION_NAMES[runtime.amp]}


def _compared(name: str, part: Any, ours: Any) -> Any:
    """What decides the weights in part `name` of an identity: a cache's content, not its crop
    run id; the extra caches' contents in the order they join, not their names; stored params
    with those added since (held by `ours`) at their defaults."""
    if name == "params" and isinstance(part, dict) and isinstance(ours, dict):
        return _with_defaults(part, ours)
    if name == "cache" and isinstance(part, dict):
        return part.get("content")
    if name == "extra_train" and isinstance(part, dict):
        return [v.get("content") if isinstance(v, dict) else v for v in part.values()]
    return part


def identity_mismatch(stored: Any, current: dict[str, Any]) -> list[str]:
    """The parts of `current` (a `training_identity`) that a checkpoint's stored identity
    does not match, as `_compared` reads them; a checkpoint without one (made before
    identities were stored) matches none."""
    if not isinstance(stored, dict):
        return list(current)
    return [name for name in dict.fromkeys([*current, *stored])
            if _compared(name, stored.get(name), current.get(name)) != _compared(name, current.get(name), None)]


def current_identity(cfg: Config, cache_dir: str | Path, folds_path: str | Path,
                     extra_root: str | Path = EXTRA_DIR, world: int = 1) -> dict[str, Any] | None:
    """The `training_identity` a run of `cfg` in `world` processes would have on this
    machine, on this cache, folds.csv and extra caches (train's switches resolved here);
    None when the inputs cannot be read (the training then says why)."""
    try:
        runtime = resolve_train_runtime(cfg.train, resolve_device(cfg.train.device), world)
        return training_identity(cfg, cache_dir, folds_path, runtime, extra_root)
    except (PipelineError, OSError):
        return None


def trained_epochs(out: Path, cfg: Config, cache_dir: str | Path, folds_path: str | Path,
                   extra_root: str | Path = EXTRA_DIR, identity: dict[str, Any] | None = None) -> int:
    """The epochs `resume_training` would find done in out/last.pt for a run of `cfg` on
    this cache, folds.csv and extra caches: 0 when there is no last.pt, it was made from
    other inputs, or the inputs cannot be read. `identity`: that run's `current_identity`,
    computed here when not given (a caller asking for several folds computes it once)."""
    last_path = out / "last.pt"
    if not last_path.exists():
        return 0
    if identity is None:
        identity = current_identity(cfg, cache_dir, folds_path, extra_root)
        if identity is None:
            return 0
    ck = load_checkpoint(last_path, "cpu", None)
    return 0 if identity_mismatch(ck.get("identity"), identity) else int(ck["epoch"])


@dataclass(frozen=True)
class TrainRuntime:
    """train's switches resolved for this process: what the run actually does."""

    amp: torch.dtype | None  # autocast dtype, None = fp32
    channels_last: bool
    compile: bool
    keep_freed_memory: bool  # whether the heap keeps freed memory (never on without glibc)
    sync_bn: bool
    world: int = 1  # DDP processes


def resolve_train_runtime(tcfg: TrainParams, device: torch.device, world: int = 1) -> TrainRuntime:
    """The one place train's auto/on/off params become concrete choices, once the device
    and the number of DDP processes are known (sync_bn depends on the per-rank batch)."""
    return TrainRuntime(amp=amp_dtype(tcfg.amp, device),
                        channels_last=use_channels_last(tcfg.channels_last, device),
                        compile=use_compile(tcfg.compile),
                        keep_freed_memory=use_keep_freed_memory(tcfg.keep_freed_memory),
                        sync_bn=use_sync_bn(tcfg.sync_bn, device, world, tcfg.batch_size // world), world=world)


@dataclass
class TrainSetup:
    """One training run, built once by `build_training`: the model and what updates it, the
    data it learns from and where the schedule stands. `fit` runs its epochs (one
    `make_epoch_loader` + `train_steps` each); `pipeline bench` times the same steps."""

    cfg: Config
    device: torch.device
    amp: torch.dtype | None  # autocast dtype, None = fp32
    channels_last: bool
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
    runtime: TrainRuntime | None = None  # train's switches as resolved for this run


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
    return TrainSetup(cfg, device, amp, channels_last, model, net, optimizer, scaler, loss_fn, dataset, sampler,
                      state, rank_batch, mean_shape, rank, world, ema, runtime)


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
    if not last_path.exists():
        return 0, float("inf"), []
    ck = load_checkpoint(last_path, "cpu", schema)
    differ = identity_mismatch(ck.get("identity"), identity)
    if differ:
        log.info("fold %d: %s was made from other inputs (%s); training afresh", fold, last_path, ", ".join(differ))
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

