"""The extra training faces of data.extra_train: each named extra's cache (`pipeline
crop-extra NAME` -> data/extra/NAME/) checked against the params, the main cache and the
other extras, then appended to the main training cache on the training side of every fold.
They are never validated: folds.csv, validation and OOF stay on the main faces. Only the
extras the params name are read (a data/extra/<old> folder left behind is ignored)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import Config
from pipeline.core.paths import EXTRA_DIR
from pipeline.formats.cache import CACHE_MARKER, Cache, extra_crop_params, load_cache, read_photos

log = logging.getLogger(__name__)


def _rerun(name: str) -> str:
    return f"run `dvc repro`, or `pipeline crop-extra {name}`"


def _json(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _stale(info: dict, folder: str, cfg: Config, main: Cache) -> str | None:
    """Why an extra split does not belong with these params and this main cache (None: it does)."""
    extra = info.get("extra")
    if not isinstance(extra, dict):
        return "not an extra face cache"
    if os.path.realpath(str(extra.get("folder"))) != os.path.realpath(folder):
        return f"cropped from {extra.get('folder')}, not {folder}"
    if _json(extra.get("params")) != _json(extra_crop_params(cfg)):
        return "cropped with other data or crop params"
    if extra.get("main_run") != main.info.get("run"):
        return f"checked against another crop of data.dir than {main.path}"
    geometry = ("size", "expand", "label_origin", "schema")
    if _json([info.get(k) for k in geometry]) != _json([main.info.get(k) for k in geometry]):
        return (f"{info.get('size')} px crops with expand {info.get('expand')}, but {main.path} holds "
                f"{main.info.get('size')} px crops with expand {main.info.get('expand')}")
    return None


def extras_in_order(cfg: Config) -> list[tuple[str, str]]:
    """(name, folder) of data.extra_train in the order their faces join the training: by
    name, so that the order the params list them in (a mapping's, which DVC compares as
    unordered) changes nothing."""
    return sorted(cfg.data.extra_train.items())


def load_extras(cfg: Config, main: Cache, extra_root: str | os.PathLike = EXTRA_DIR) -> list[tuple[str, Cache]]:
    """(name, cache) of every extra of data.extra_train (`extras_in_order`), checked:
    present, made from the folder and with the params named now, against the main crop
    `main`, labelled, and no photo in two extras (same bytes; crop-extra already refused
    photos of data.dir). Each problem is a one-line error."""
    out: list[tuple[str, Cache]] = []
    seen: dict[str, tuple[str, Path]] = {}  # sha256 -> (extra, photo)
    for name, folder in extras_in_order(cfg):
        split = Path(extra_root) / name
        if not (split / CACHE_MARKER).exists():
            raise PipelineError(split, f"no face cache of data.extra_train.{name} ({_rerun(name)})")
        cache = load_cache(split)
        why = _stale(cache.info, folder, cfg, main)
        if why:
            raise PipelineError(split, f"stale face cache of data.extra_train.{name}: {why} ({_rerun(name)})")
        if cache.keypoints is None:
            raise PipelineError(split, "extra face cache has no keypoints")
        photos = read_photos(split)
        for rel, digest in photos.items():  # against the other extras (one folder may hold a photo twice)
            if digest in seen:
                other, other_photo = seen[digest]
                raise PipelineError(Path(folder) / rel, f"the same photo as {other_photo} (data.extra_train.{other} "
                                                        f"and .{name}): its faces would be trained on twice; drop it "
                                                        "from one of the two")
        for rel, digest in photos.items():
            seen.setdefault(digest, (name, Path(folder) / rel))
        out.append((name, cache))
    if out:
        log.info("extra training faces: %s", ", ".join(f"{len(c)} of {name}" for name, c in out))
    return out


def join_training(main: Cache, extras: list[tuple[str, Cache]]) -> Cache:
    """`main` with the extras' faces appended after its own (so the main faces keep their
    indices, those of folds.csv), in RAM; its info is main's plus `extra_train` {name: crop
    run id}, and the extras' face ids are prefixed `<name>:`, unique beside main's."""
    if not extras:
        return main
    parts = [main, *(c for _, c in extras)]
    metas = [main.meta] + [c.meta.assign(face_id=f"{name}:" + c.meta["face_id"].astype(str)) for name, c in extras]
    meta = pd.concat(metas, ignore_index=True)
    meta["index"] = np.arange(len(meta))
    # every part is labelled: load_fold checks the main cache, load_extras the extras
    return Cache(main.path, np.concatenate([c.faces for c in parts]),
                 np.concatenate([c.keypoints for c in parts]),
                 np.concatenate([c.keypoints_orig for c in parts]),
                 np.concatenate([c.crop_to_orig for c in parts]), meta,
                 {**main.info, "extra_train": {name: str(c.info.get("run")) for name, c in extras}}, main.schema)
