"""The `crop` stage: expand each face box, make it square, crop (padding where the box
leaves the image), resize to `crop.side`, and store every face of a split in the face
cache (pipeline/formats/cache.py) with its keypoints and the crop->original transform
(pipeline/keypoints/geometry.py), so predictions map back exactly. Both annotation files are read
and every image decoded and cropped before anything is written; both splits are then
built in one temp folder renamed into place, so a reader never sees half a cache.

`crop-extra NAME` (a DVC stage per entry of data.extra_train) crops the training faces of
one extra folder the same way into a training-only split (data/extra/NAME/), after
refusing any photo the main folder also holds."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import click

from pipeline.core.config import config_options, params_source, result_params, write_resolved
from pipeline.core.digest import file_sha256
from pipeline.core.errors import PipelineError
from pipeline.core.faults import kill_point
from pipeline.core.io import check_output, check_replaceable, staging_dir
from pipeline.core.params_schema import Config
from pipeline.core.paths import CACHE_DIR, EXTRA_DIR
from pipeline.formats.annotations import crop_faces, load_xml, safe_image_path
from pipeline.formats.cache import (
    CACHE_MARKER,
    EXTRA_CROP_IGNORES,
    MAIN_CROP_IGNORES,
    dataset_root,
    extra_crop_params,
    is_cache_root,
    read_info,
    read_meta,
    write_cache_split,
)
from pipeline.keypoints.schema import get_schema

log = logging.getLogger(__name__)


def run_crop(cfg: Config, out_dir: str | os.PathLike = CACHE_DIR) -> dict[str, int]:
    """The `crop` stage: both splits of data.dir (or the demo set) into out_dir/{train,test}."""
    check_output(out_dir, folder=True)
    dcfg, ccfg = cfg.data, cfg.crop  # ranges checked on loading (crop.side, crop.expand, crop.n_jobs)
    root = dataset_root(dcfg)
    if not root.is_dir():
        hint = " (run `pipeline demo-data data/demo`, or set data.dir)" if dcfg.dir is None else ""
        raise PipelineError(root, "dataset folder not found" + hint)
    schema = get_schema(dcfg)
    splits = {"train": (root / dcfg.train_xml, True), "test": (root / dcfg.test_xml, False)}
    out = Path(out_dir)
    check_replaceable(out, is_cache_root, "a face cache (only train/, test/ and params.resolved.yaml may be there)")
    for name in splits:  # fail before the work when an output cannot be replaced
        check_replaceable(out / name, lambda d: (d / CACHE_MARKER).exists(), f"a face cache (no {CACHE_MARKER})")
    # read and check both annotation files before cropping or writing anything
    faces = {name: load_xml(xml, schema, require_parts=req) for name, (xml, req) in splits.items()}
    crops, timing = {}, {}
    for name, (xml, _) in splits.items():
        t0 = time.perf_counter()
        crops[name] = crop_faces(faces[name], root, ccfg.side, ccfg.expand, ccfg.n_jobs, xml,
                                 progress=True, return_sizes=True)
        timing[name] = time.perf_counter() - t0
    # both splits (and the params) go to one temp folder that replaces `out` as a whole: a
    # crash or a full disk never leaves a train cache and a test cache of different runs
    # less the speed-only params (crop.n_jobs), where the data set lies (its files are hashed),
    # the truth file crop never reads and the extra folders (data/extra's caches)
    run = crop_run_id(result_params(cfg, ["data", "crop"], exclude=("data.dir", "data.solution", *MAIN_CROP_IGNORES)),
                      root, splits, faces)
    with staging_dir(out, CACHE_MARKER, is_ours=is_cache_root) as tmp:
        for name, (xml, _) in splits.items():
            (tmp / name).mkdir()
            # before the split's info.json marks it complete
            write_resolved(cfg, tmp / name, ["data", "crop"], exclude=MAIN_CROP_IGNORES)
            arr, to_orig, sizes = crops[name]
            write_cache_split(tmp / name, faces[name], arr, to_orig, sizes, schema, xml, ccfg.side, ccfg.expand,
                              float(dcfg.label_origin), run)
            kill_point(f"crop:{name}")  # tests only (pipeline/core/faults.py)
        write_resolved(cfg, tmp, ["data", "crop"], exclude=MAIN_CROP_IGNORES)
    for name, dt in timing.items():  # logged once the cache is written: a failure is its only line
        log.info("crop %s: %d faces in %.2f s (%.0f faces/s, %d jobs)", name, len(faces[name]), dt,
                 len(faces[name]) / max(dt, 1e-9), ccfg.n_jobs)
    return {name: len(f) for name, f in faces.items()}


def crop_run_id(shaping: dict, root: Path, splits: dict, faces: dict) -> str:
    """The id both splits of one crop run carry: a hash of what the run read (`shaping`, the
    params that shape the cache, each annotation file's bytes and each photo's bytes), so
    the same inputs give byte-identical caches (DVC then skips the stages downstream) while
    caches of different inputs still differ (the mixed-cache check)."""
    h = hashlib.sha256()
    h.update(json.dumps(shaping, sort_keys=True, default=str).encode())

    def add(label: str, data: bytes) -> None:  # length-prefixed: no two inputs hash alike
        h.update(f"\0{label}\0{len(data)}\0".encode() + data)

    for name, (xml, _) in splits.items():
        add(name, Path(xml).read_bytes())
        for rel in dict.fromkeys(f.image for f in faces[name]):  # each photo once, in XML order
            add(rel, safe_image_path(root, rel, xml).read_bytes())
    return h.hexdigest()[:32]


def run_crop_extra(cfg: Config, name: str, out_dir: str | os.PathLike | None = None,
                   cache_dir: str | os.PathLike = CACHE_DIR) -> int:
    """The `crop-extra` stage: the training faces of data.extra_train's `name` into out_dir
    (default data/extra/<name>), one training split of the face cache with the crop
    geometry, schema and label origin of the main set. A photo that the main folder also
    holds (same bytes; the main cache at `cache_dir` lists them) is refused: its faces would
    be trained on and validated. Returns the number of faces."""
    dcfg, ccfg = cfg.data, cfg.crop
    if name not in dcfg.extra_train:
        known = ", ".join(dcfg.extra_train) or "none"
        raise PipelineError(params_source("data.extra_train"), f"no extra '{name}' in data.extra_train ({known})")
    out = check_output(Path(out_dir) if out_dir is not None else Path(EXTRA_DIR) / name, folder=True)
    root = Path(dcfg.extra_train[name])
    if not root.is_dir():
        raise PipelineError(root, f"extra training folder not found (data.extra_train.{name})")
    check_replaceable(out, lambda d: (d / CACHE_MARKER).exists(), f"an extra face cache (no {CACHE_MARKER})")
    schema = get_schema(dcfg)
    xml = root / dcfg.train_xml
    faces = load_xml(xml, schema, require_parts=True)
    main_run, main_photos = _main_photos(cfg, Path(cache_dir))
    photos = {rel: file_sha256(safe_image_path(root, rel, xml), "image not found", "image")
              for rel in dict.fromkeys(f.image for f in faces)}
    for rel, digest in photos.items():
        if digest in main_photos:
            raise PipelineError(safe_image_path(root, rel, xml), f"the same photo as {main_photos[digest]} of "
                                f"data.dir: its faces would be trained on and validated; drop it from "
                                f"data.extra_train.{name}")
    t0 = time.perf_counter()
    arr, to_orig, sizes = crop_faces(faces, root, ccfg.side, ccfg.expand, ccfg.n_jobs, xml, progress=True,
                                     return_sizes=True)
    dt = time.perf_counter() - t0
    shaping = extra_crop_params(cfg)
    run = crop_run_id(shaping, root, {"train": (xml, True)}, {"train": faces})
    # what train checks before it trusts the split: the folder it came from, the params that
    # shaped it and the main crop it was checked against
    extra = {"name": name, "folder": dcfg.extra_train[name], "main_run": main_run, "params": shaping}
    with staging_dir(out, CACHE_MARKER) as tmp:
        write_resolved(cfg, tmp, ["data", "crop"], exclude=EXTRA_CROP_IGNORES)
        write_cache_split(tmp, faces, arr, to_orig, sizes, schema, xml, ccfg.side, ccfg.expand,
                          float(dcfg.label_origin), run, extra, photos)
    log.info("crop-extra %s: %d faces of %d photos in %.2f s (%.0f faces/s, %d jobs)", name, len(faces), len(photos),
             dt, len(faces) / max(dt, 1e-9), ccfg.n_jobs)
    return len(faces)


def _main_photos(cfg: Config, cache_dir: Path) -> tuple[str, dict[str, Path]]:
    """(run id of the main crop, {sha256: path} of every photo it cropped, train and test)."""
    info, _ = read_info(cache_dir / "train")
    root = dataset_root(cfg.data)
    photos: dict[str, Path] = {}
    for split in ("train", "test"):
        for rel in dict.fromkeys(read_meta(cache_dir / split, columns=("image",))["image"]):
            path = safe_image_path(root, rel, cache_dir / split / "meta.csv")
            photos.setdefault(file_sha256(path, "image not found", "image"), path)
    return str(info.get("run")), photos


@click.command("crop")
@click.option("--out", "out_dir", default=CACHE_DIR, show_default=True, help="writes <out>/train and <out>/test")
@config_options
def crop_cmd(out_dir, cfg):
    """Crop every face box of the train and test XML into the face cache."""
    t0 = time.perf_counter()
    counts = run_crop(cfg, out_dir)
    dt = time.perf_counter() - t0
    n = counts["train"] + counts["test"]
    log.info("cached %d train and %d test faces in %s (%.1f s, %.0f faces/s overall)",
             counts["train"], counts["test"], out_dir, dt, n / max(dt, 1e-9))


@click.command("crop-extra")
@click.argument("name")
@click.option("--out", "out_dir", default=None, help=f"writes this folder  [default: {EXTRA_DIR}/NAME]")
@click.option("--cache", "cache_dir", default=CACHE_DIR, show_default=True,
              help="the main face cache: a photo of its folder is refused")
@config_options
def crop_extra_cmd(name, out_dir, cache_dir, cfg):
    """Crop the training faces of data.extra_train's NAME into a training-only face cache."""
    run_crop_extra(cfg, name, out_dir, cache_dir)
