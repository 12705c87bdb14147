"""The `crop` stage: expand each face box, make it square, crop (padding where the box
leaves the image), resize to `crop.side`, and store every face of a split in the face
cache (pipeline/formats/cache.py) with its keypoints and the crop->original transform
(pipeline/keypoints/geometry.py), so predictions map back exactly. Both annotation files are read
and every image decoded and cropped before anything is written; both splits are then
built in one temp folder renamed into place, so a reader never sees half a cache."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import click

from pipeline.core.config import Config, config_options, result_params, write_resolved
from pipeline.core.errors import PipelineError
from pipeline.core.faults import kill_point
from pipeline.core.io import check_output, check_replaceable, staging_dir
from pipeline.core.paths import CACHE_DIR
from pipeline.formats.annotations import crop_faces, load_xml, safe_image_path
from pipeline.formats.cache import CACHE_MARKER, dataset_root, is_cache_root, write_cache_split
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
    run = crop_run_id(cfg, root, splits, faces)
    with staging_dir(out, CACHE_MARKER, is_ours=is_cache_root) as tmp:
        for name, (xml, _) in splits.items():
            (tmp / name).mkdir()
            write_resolved(cfg, tmp / name, ["data", "crop"])  # before the split's info.json marks it complete
            arr, to_orig, sizes = crops[name]
            write_cache_split(tmp / name, faces[name], arr, to_orig, sizes, schema, xml, ccfg.side, ccfg.expand,
                              float(dcfg.label_origin), run)
            kill_point(f"crop:{name}")  # tests only (pipeline/core/faults.py)
        write_resolved(cfg, tmp, ["data", "crop"])
    for name, dt in timing.items():  # logged once the cache is written: a failure is its only line
        log.info("crop %s: %d faces in %.2f s (%.0f faces/s, %d jobs)", name, len(faces[name]), dt,
                 len(faces[name]) / max(dt, 1e-9), ccfg.n_jobs)
    return {name: len(f) for name, f in faces.items()}


def crop_run_id(cfg: Config, root: Path, splits: dict, faces: dict) -> str:
    """The id both splits of one crop run carry: a hash of what the run read (the params
    that shape the cache, each annotation file's bytes and each photo's bytes), so the same
    inputs give byte-identical caches (DVC then skips the stages downstream) while caches of
    different inputs still differ (the mixed-cache check)."""
    h = hashlib.sha256()
    # less the speed-only params (crop.n_jobs), where the data set lies (its files are hashed
    # below) and the truth file crop never reads
    shaping = result_params(cfg, ["data", "crop"], exclude=("data.dir", "data.solution"))
    h.update(json.dumps(shaping, sort_keys=True, default=str).encode())

    def add(label: str, data: bytes) -> None:  # length-prefixed: no two inputs hash alike
        h.update(f"\0{label}\0{len(data)}\0".encode() + data)

    for name, (xml, _) in splits.items():
        add(name, Path(xml).read_bytes())
        for rel in dict.fromkeys(f.image for f in faces[name]):  # each photo once, in XML order
            add(rel, safe_image_path(root, rel, xml).read_bytes())
    return h.hexdigest()[:32]


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
