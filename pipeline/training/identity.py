"""What made a fold's weights: `training_identity` (the rule below), the switches of train as
they resolve on this machine (`resolve_train_runtime`, which the identity holds), and whether a
checkpoint was made from the same inputs (`identity_mismatch`, `resumable`, `trained_epochs`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.core.config import result_params
from pipeline.core.device import amp_dtype, resolve_device, use_channels_last, use_compile, use_sync_bn
from pipeline.core.digest import folder_sha256, source_sha256
from pipeline.core.errors import PipelineError
from pipeline.core.heap import use_keep_freed_memory
from pipeline.core.params_schema import DEFAULTS, Config, TrainParams, is_runtime, section_fields
from pipeline.core.paths import EXTRA_DIR
from pipeline.formats.cache import CACHE_MARKER, PHOTOS_FILE, read_info
from pipeline.formats.checkpoint import load_checkpoint
from pipeline.formats.folds import read_folds
from pipeline.training.extras import extras_in_order

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
    ck, _ = resumable(last_path, identity)
    return 0 if ck is None else int(ck["epoch"])


def resumable(last_path: Path, identity: dict[str, Any], schema=None) -> tuple[dict[str, Any] | None, list[str]]:
    """(the checkpoint at `last_path`, []) when a run of `identity` may resume from it;
    (None, the identity parts it does not match) when it was made from other inputs, and
    (None, []) when there is none."""
    if not last_path.exists():
        return None, []
    ck = load_checkpoint(last_path, "cpu", schema)
    differ = identity_mismatch(ck.get("identity"), identity)
    return (None, differ) if differ else (ck, [])


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
