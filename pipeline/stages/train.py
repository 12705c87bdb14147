"""Train one fold: `build_optimizer`, pure `get_lr(step)`, `train_one_epoch`, `evaluate`; `fit` =
`load_fold` + `build_training` (a `TrainSetup`, which bench builds too) + per epoch
`make_epoch_loader` and `train_steps`.

Checkpoints go to models/fold{K}/last.pt every epoch and best.pt at the lowest validation
MAE (in original-image pixels). `--resume` continues from last.pt when it was written by
the same configuration; a run whose params changed starts afresh."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from pipeline.core.config import config_options, params_source
from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

# The params sections a fold's training depends on: a checkpoint made under other values
# of these is not resumed.
TRAIN_SECTIONS = ("data", "crop", "folds", "model", "train")


def get_lr(step: int, total_steps: int, warmup_steps: int, peak_lr: float) -> float:
    """Linear warm-up from 0 to peak over `warmup_steps`, then cosine decay to 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: torch.nn.Module, tcfg: dict[str, Any]) -> torch.optim.Optimizer:
    """SGD (Nesterov-free, momentum) or AdamW; no weight decay on norms and biases."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": tcfg["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    if tcfg["optimizer"] == "sgd":
        return torch.optim.SGD(groups, lr=tcfg["lr"], momentum=tcfg["momentum"])
    if tcfg["optimizer"] == "adamw":
        return torch.optim.AdamW(groups, lr=tcfg["lr"], betas=(tcfg["momentum"], 0.999))
    raise PipelineError(params_source("train.optimizer"),
                        f"train.optimizer must be sgd|adamw, got '{tcfg['optimizer']}'")


@dataclass
class StepState:
    step: int  # optimizer steps taken so far
    total_steps: int
    warmup_steps: int
    peak_lr: float


class NonFiniteLoss(PipelineError):
    pass


def train_one_epoch(model, loader, loss_fn, optimizer, scaler, state: StepState, device, amp,
                    grad_clip: float = 0.0, desc: str = "train", progress: bool = True,
                    read_every: int | None = None) -> dict[str, float]:
    """One pass over `loader` (a DeviceLoader, or anything iterable with len() and
    `wait_s`). `progress` False hides the bar (DDP ranks other than 0).

    The step losses stay on the device and are read every `read_every` steps and at the
    end of the epoch: by default every 10 steps on CUDA (each read waits for the device; a
    read per step would stall the CUDA queue every step) and every step elsewhere, where a
    read costs nothing, so no step runs after a non-finite loss. A non-finite loss stops
    training at the next read, naming the step where it appeared; the caller has not yet
    checkpointed this epoch, so the last good checkpoint is kept."""
    if read_every is None:
        read_every = 10 if torch.device(device).type == "cuda" else 1
    from tqdm import tqdm

    from pipeline.core.device import autocast
    from pipeline.core.faults import maybe_kill

    model.train()
    running = _RunningLoss(state.step)
    seen, t0, lr = 0, time.perf_counter(), 0.0
    batches = iter(loader)
    try:
        bar = tqdm(batches, total=len(loader), desc=desc, unit="batch", leave=False, dynamic_ncols=True,
                   disable=not progress)
        for images, target, _ in bar:  # (B, C, H, W) float, (B, K, 2) input px
            lr = get_lr(state.step, state.total_steps, state.warmup_steps, state.peak_lr)
            for g in optimizer.param_groups:
                g["lr"] = lr
            with autocast(device, amp):
                if loss_fn.needs_maps:  # the heatmap regulariser also needs the soft-argmax maps
                    pred, probs = model(images, return_maps=True)  # (B, K, 2), (B, K, h, w)
                else:
                    pred, probs = model(images), None  # (B, K, 2) input px
            loss, _ = loss_fn(pred.float(), target, probs, tuple(images.shape[-2:]))
            seen += images.shape[0]
            running.add(loss, images.shape[0])
            if running.pending() >= read_every:  # before backward: read each step, no step runs on a NaN
                running.read()
                bar.set_postfix(loss=f"{running.mean():.3f}", ips=f"{seen / (time.perf_counter() - t0):.1f}")
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            state.step += 1
            maybe_kill(state.step)  # tests only: PIPELINE_KILL_AT_STEP (pipeline/core/faults.py)
        running.read()
    finally:
        close = getattr(batches, "close", None)
        if close is not None:  # stops a DeviceLoader's producer thread on every way out
            close()
    elapsed = time.perf_counter() - t0
    return {"loss": running.mean(), "images_per_s": seen / elapsed,
            "data_wait_frac": loader.wait_s / elapsed if elapsed > 0 else 0.0, "lr": lr}


class _RunningLoss:
    """The epoch's mean loss, with the step losses kept on the device until read()."""

    def __init__(self, first_step: int):
        self.step = first_step  # the optimizer step of the first unread loss
        self.unread: list[tuple[torch.Tensor, int]] = []  # (0-d loss on the device, batch size)
        self.total, self.count = 0.0, 0

    def add(self, loss: torch.Tensor, batch: int) -> None:
        self.unread.append((loss.detach(), batch))

    def pending(self) -> int:
        return len(self.unread)

    def read(self) -> None:
        """Bring the unread losses to the host (one device sync); raise NonFiniteLoss at
        the first one that is not finite."""
        if not self.unread:
            return
        values = torch.stack([loss.float() for loss, _ in self.unread]).tolist()
        for value, (_, batch) in zip(values, self.unread):
            if not math.isfinite(value):
                raise NonFiniteLoss(None, f"loss became {value} at step {self.step}; training stopped, "
                                          "the last good checkpoint is kept (lower train.lr?)")
            self.total += value * batch
            self.count += batch
            self.step += 1
        self.unread.clear()

    def mean(self) -> float:
        return self.total / max(1, self.count)


def evaluate(model, cache, val_idx: np.ndarray, ckpt_like: dict, batch_size: int, device) -> dict[str, float]:
    """Validation MAE and NME in original-image pixels (no TTA, to keep epochs short)."""
    from pipeline.inference.tta import predict_original
    from pipeline.keypoints.metrics import mae, nme

    if len(val_idx) == 0:
        return {"mae": float("nan"), "nme": float("nan")}
    pred = predict_original(model, ckpt_like, cache.faces[val_idx], cache.crop_to_orig[val_idx], "none",
                            batch_size, device)["final"]
    truth = cache.keypoints_orig[val_idx]
    eyes = cache.schema.eyes
    return {"mae": float(mae(pred, truth)),
            "nme": float(nme(pred, truth, eyes)) if eyes is not None else float("nan")}


def init_distributed(device_name: str) -> tuple[int, int, str]:
    """(rank, world size, device name) under torchrun; (0, 1, device_name) otherwise.

    torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; CPUs use gloo, GPUs NCCL with one GPU per
    process (cuda:LOCAL_RANK)."""
    import os

    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, device_name
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda and local >= torch.cuda.device_count():
        raise PipelineError("torchrun", f"LOCAL_RANK {local} needs cuda:{local} but {torch.cuda.device_count()} "
                                        "CUDA device(s) are visible: lower --nproc-per-node")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return rank, world, (f"cuda:{local}" if use_cuda else "cpu")


def _config_key(cfg: dict) -> dict:
    """The part of the config that must match for a checkpoint to be resumed. device,
    workers and AMP choices change speed, not the result's meaning."""
    key = {s: dict(cfg[s]) for s in TRAIN_SECTIONS}
    for k in ("device", "num_workers"):
        key["train"].pop(k, None)
    return key


@dataclass
class TrainSetup:
    """One training run, built once by `build_training`: the model and what updates it, the
    data it learns from and where the schedule stands. `fit` runs its epochs (one
    `make_epoch_loader` + `train_steps` each); `pipeline bench` times the same steps."""

    cfg: dict
    device: torch.device
    amp: torch.dtype | None  # autocast dtype, None = fp32
    channels_last: bool
    model: torch.nn.Module  # the weights that are saved
    net: torch.nn.Module  # what trains: the model, or its DDP wrapper (same parameters)
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


def build_training(cfg: dict, cache, train_idx: np.ndarray, device: torch.device, rank: int = 0,
                   world: int = 1) -> TrainSetup:
    """Model (seeded by train.seed), optimizer, AMP scaler, loss, augmenting dataset and
    sampler for training on the faces `train_idx` of `cache`, with the lr schedule over
    train.epochs. Under DDP (world > 1) the model is wrapped and each rank takes its share
    of every batch."""
    from pipeline.training.augment import TrainAugment
    from pipeline.training.loader import EpochSampler, FaceDataset
    from pipeline.core.device import amp_dtype, use_channels_last
    from pipeline.keypoints.geometry import crop_to_input
    from pipeline.training.losses import loss_from_params
    from pipeline.models import create_model

    tcfg, mcfg = cfg["train"], cfg["model"]
    if tcfg["batch_size"] % world:
        raise PipelineError(params_source("train.batch_size"),
                            f"train.batch_size {tcfg['batch_size']} is not divisible by "
                            f"the {world} DDP processes")
    # train.batch_size is the global batch: each rank takes its share, so the lr and the
    # schedule do not change with the number of processes
    rank_batch = tcfg["batch_size"] // world
    torch.manual_seed(tcfg["seed"])
    amp = amp_dtype(tcfg["amp"], device)
    channels_last = use_channels_last(tcfg["channels_last"], device)
    schema, cache_size, input_size = cache.schema, cache.faces.shape[1], mcfg["input_size"]

    model = create_model(mcfg["preset"], schema.k, in_chans=mcfg["in_chans"], input_size=input_size,
                         **mcfg["options"]).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = build_optimizer(model, tcfg)
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None

    # the mean shape of the training faces (input px) fixes the structure-loss neighbours
    mean_shape = crop_to_input(cache.keypoints[train_idx].mean(0).astype(np.float64), cache_size, input_size)
    neighbours = torch.as_tensor(schema.neighbours(mean_shape), device=device)
    heatmap_model = hasattr(model, "forward_maps")
    if tcfg["heatmap_lambda"] > 0 and not heatmap_model:
        log.warning("%s regresses coordinates directly: train.heatmap_lambda ignored", mcfg["preset"])
    loss_fn = loss_from_params(tcfg, input_size, neighbours, heatmap_model)

    steps_per_epoch = math.ceil(math.ceil(len(train_idx) / world) / rank_batch)
    state = StepState(0, steps_per_epoch * tcfg["epochs"],
                      round(tcfg["warmup_epochs"] * steps_per_epoch), tcfg["lr"])
    augment = TrainAugment(schema, cache_size, input_size, tcfg["scale_min"], tcfg["scale_max"],
                           tcfg["flip"], tcfg["randaug_n"], tcfg["randaug_m"])
    dataset = FaceDataset(cache.faces, cache.keypoints, train_idx, augment, mcfg["in_chans"])
    sampler = EpochSampler(len(dataset), tcfg["seed"], rank=rank, world=world)
    return TrainSetup(cfg, device, amp, channels_last, model, net, optimizer, scaler, loss_fn, dataset, sampler,
                      state, rank_batch, mean_shape, rank, world)


def make_epoch_loader(setup: TrainSetup, epoch: int):
    """The DeviceLoader of epoch `epoch` (0-based): the sampler's order and the augmentation
    draws are fixed by (train.seed, epoch, rank), so a resumed run sees exactly the batches
    the uninterrupted one saw.

    Seeds torch's global RNG, which the augmentation draws from when train.num_workers is
    0 (in the loader's producer thread): nothing else may draw from it during the epoch."""
    from pipeline.training.loader import DeviceLoader, make_loader

    tcfg = setup.cfg["train"]
    # per rank too, or every DDP rank would draw the same augmentation sequence
    epoch_seed = tcfg["seed"] * 1000 + epoch + 1_000_003 * setup.rank
    torch.manual_seed(epoch_seed)
    setup.sampler.set_epoch(epoch)
    loader = make_loader(setup.dataset, setup.batch_size, setup.sampler, setup.device, tcfg["num_workers"],
                         drop_last=False, seed=epoch_seed)
    return DeviceLoader(loader, setup.device, setup.channels_last)


def train_steps(setup: TrainSetup, loader, desc: str = "train", progress: bool = True) -> dict[str, float]:
    """`train_one_epoch` of the setup's network over `loader`."""
    return train_one_epoch(setup.net, loader, setup.loss_fn, setup.optimizer, setup.scaler, setup.state,
                           setup.device, setup.amp, setup.cfg["train"]["grad_clip"], desc=desc, progress=progress)


def load_fold(cache_dir: str | Path, folds_path: str | Path, fold: int):
    """(training cache, train indices, validation indices) of fold `fold`."""
    from pipeline.formats.cache import load_cache
    from pipeline.formats.folds import read_folds

    cache = load_cache(Path(cache_dir) / "train")
    if cache.keypoints is None:
        raise PipelineError(Path(cache_dir) / "train", "training cache has no keypoints")
    fold_of = read_folds(folds_path, cache.meta, Path(cache_dir) / "train")  # rows must be the cache's faces
    k = int(fold_of.max()) + 1
    if not 0 <= fold < k:
        raise PipelineError(folds_path, f"fold {fold} out of range: folds are 0..{k - 1}")
    return cache, np.flatnonzero(fold_of != fold), np.flatnonzero(fold_of == fold)


def checkpoint_meta(setup: TrainSetup, cache, fold: int) -> dict[str, Any]:
    """What every checkpoint of this run carries besides the weights and the step state."""
    # "crop": the geometry of the cache the model actually saw (params may name another
    # size than the cache on disk); standalone prediction must crop new faces the same way
    return {"model_config": setup.model.config, "schema": cache.schema.to_dict(), "config": setup.cfg,
            "crop": {"size": int(cache.faces.shape[1]), "expand": float(cache.info["expand"]),
                     "label_origin": float(cache.info.get("label_origin", 0.0))},
            "mean_shape": setup.mean_shape.tolist(), "fold": fold}


def resume_training(setup: TrainSetup, out: Path, schema, fold: int) -> tuple[int, float, list[dict]]:
    """Load out/last.pt into the setup when it was made with the same params: (epochs done,
    best val MAE, history); (0, inf, []) when there is nothing to resume."""
    from pipeline.formats.checkpoint import load_checkpoint

    last_path = out / "last.pt"
    if not last_path.exists():
        return 0, float("inf"), []
    ck = load_checkpoint(last_path, "cpu", schema)
    if "config" not in ck or _config_key(ck["config"]) != _config_key(setup.cfg):
        log.info("fold %d: %s was trained with other params; starting afresh", fold, last_path)
        return 0, float("inf"), []
    setup.model.load_state_dict(ck["model"])
    setup.optimizer.load_state_dict(ck["optimizer"])
    if setup.scaler is not None and ck.get("scaler"):
        setup.scaler.load_state_dict(ck["scaler"])
    setup.state.step = ck["scheduler_step"]
    best_mae, history = ck["best_mae"], list(ck.get("history", []))
    if not (out / "best.pt").exists():
        best_mae = float("inf")  # best.pt was removed: the next epoch rewrites it
    log.info("fold %d: resuming from %s at epoch %d", fold, last_path, ck["epoch"])
    return ck["epoch"], best_mae, history


def fit(cfg: dict, fold: int, cache_dir: str | Path = "data/cache", folds_path: str | Path = "folds/folds.csv",
        out_root: str | Path = "models", resume: bool = True, live_dir: str | Path | None = None,
        max_epochs: int | None = None) -> dict[str, float]:
    """Train fold `fold`; returns the final metrics. `max_epochs` stops early (for tests of
    interruption): the schedule still follows train.epochs."""
    from pipeline.formats.checkpoint import save_checkpoint
    from pipeline.core.config import write_resolved
    from pipeline.core.device import resolve_device
    from pipeline.core.io import remove_stale_temps, write_json

    tcfg = cfg["train"]
    out = Path(out_root) / f"fold{fold}"
    cache, train_idx, val_idx = load_fold(cache_dir, folds_path, fold)
    rank, world, device_name = init_distributed(tcfg["device"])
    is_main = rank == 0  # only rank 0 writes checkpoints, metrics and DVCLive logs
    if not is_main:  # and only rank 0 logs progress: the other ranks report warnings only
        log.setLevel(logging.WARNING)
    setup = build_training(cfg, cache, train_idx, resolve_device(device_name), rank, world)
    meta = checkpoint_meta(setup, cache, fold)
    start_epoch, best_mae, history = resume_training(setup, out, cache.schema, fold) if resume else (0, float("inf"), [])

    last_path = out / "last.pt"
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        # temp files of a run killed mid-write (kill -9) are never renamed onto an output
        for p in remove_stale_temps(out, (last_path.name, "best.pt", "metrics.json", "params.resolved.yaml")):
            log.info("fold %d: removed %s left by an interrupted run", fold, p)
        write_resolved(cfg, out, TRAIN_SECTIONS)
    live = _open_live(live_dir, resume=start_epoch > 0) if is_main else None
    log.info("fold %d: %d train / %d val faces, %s on %s, amp=%s, %d epochs", fold, len(train_idx),
             len(val_idx), cfg["model"]["preset"], setup.device, setup.amp, tcfg["epochs"])
    end_epoch = tcfg["epochs"] if max_epochs is None else min(tcfg["epochs"], max_epochs)
    for epoch in range(start_epoch, end_epoch):
        tr = train_steps(setup, make_epoch_loader(setup, epoch), desc=f"fold {fold} epoch {epoch + 1}/{tcfg['epochs']}",
                         progress=is_main)
        tr["images_per_s"] *= world  # every rank trains on its own share at the same pace
        ev = evaluate(setup.model, cache, val_idx, meta, 64, setup.device)
        row = {"epoch": epoch + 1, "train_loss": tr["loss"], "val_mae": ev["mae"], "val_nme": ev["nme"],
               "data_wait_frac": tr["data_wait_frac"], "images_per_s": tr["images_per_s"], "lr": tr["lr"]}
        history.append(row)
        log.info("fold %d epoch %d: loss %.4f  val MAE %.3f px  NME %.2f%%  %.1f img/s  data wait %.1f%%",
                 fold, epoch + 1, tr["loss"], ev["mae"], 100 * ev["nme"], tr["images_per_s"],
                 100 * tr["data_wait_frac"])
        improved = ev["mae"] < best_mae or not math.isfinite(best_mae)
        best_mae = min(best_mae, ev["mae"]) if math.isfinite(ev["mae"]) else best_mae
        ckpt = {**meta, "model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
                "scaler": setup.scaler.state_dict() if setup.scaler is not None else {},
                "scheduler_step": setup.state.step, "epoch": epoch + 1, "best_mae": best_mae, "history": history}
        if is_main:
            if improved:
                save_checkpoint(out / "best.pt", ckpt)
            save_checkpoint(last_path, ckpt)
        if world > 1:
            torch.distributed.barrier()
        if live is not None:
            for name, value in row.items():
                if name != "epoch":
                    live.log_metric(name, value)
            live.next_step()
    if not history:
        raise PipelineError(last_path, "no epochs trained (train.epochs is 0?)")
    best = min(history, key=lambda r: r["val_mae"] if math.isfinite(r["val_mae"]) else float("inf"))
    metrics = {"fold": fold, "epochs": history[-1]["epoch"], "val_mae": best["val_mae"], "val_nme": best["val_nme"],
               "best_epoch": best["epoch"], "last_val_mae": history[-1]["val_mae"],
               "images_per_s": history[-1]["images_per_s"], "data_wait_frac": history[-1]["data_wait_frac"]}
    if is_main:
        write_json(out / "metrics.json", metrics)
    if live is not None:
        live.end()
    if world > 1:
        torch.distributed.destroy_process_group()
    return metrics


def _open_live(live_dir, resume: bool):
    if live_dir is None:
        return None
    from dvclive import Live

    return Live(dir=str(live_dir), resume=resume, save_dvc_exp=False, dvcyaml=None, report=None)


@click.command("train")
@click.option("--fold", type=int, required=True, help="fold to hold out for validation")
@click.option("--cache", default="data/cache", show_default=True)
@click.option("--folds", "folds_path", default="folds/folds.csv", show_default=True)
@click.option("--out", "out_root", default="models", show_default=True, help="writes <out>/fold{K}/")
@click.option("--live", "live_dir", default=None, help="DVCLive folder (default dvclive/fold{K})")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="continue from <out>/fold{K}/last.pt when it was made with the same params")
@config_options
def train_cmd(fold, cache, folds_path, out_root, live_dir, resume, cfg):
    """Train one fold from the crop cache and the folds file."""
    metrics = fit(cfg, fold, cache, folds_path, out_root, resume, live_dir or f"dvclive/fold{fold}")
    log.info("fold %d done: best val MAE %.3f px (epoch %d)", fold, metrics["val_mae"], metrics["best_epoch"])
