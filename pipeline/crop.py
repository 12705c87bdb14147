"""Crop and cache: expand each face box, make it square, crop (padding where the box leaves
the image), resize to `crop.side`, and store every face of a split in one uint8 array with
its keypoints and the crop->original transform, so predictions map back exactly.

Files per split (docs/design.md, "Face cache"): faces.npy, keypoints.npy,
keypoints_orig.npy (labelled sets), crop_to_orig.npy, meta.csv, info.json, plus the
params.resolved.yaml of the run. Both annotation files are read and every image decoded
and cropped before anything is written; each split folder is then built in a temp folder
and renamed into place, so a reader never sees half a cache."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import click
import cv2
import numpy as np

from pipeline.cli import config_options
from pipeline.dataset import Face, load_xml, read_image, safe_image_path
from pipeline.config import params_source
from pipeline.errors import PipelineError
from pipeline.io import write_json, write_npy, write_text
from pipeline.schema import KeypointSchema, get_schema, schema_from_dict

log = logging.getLogger(__name__)

DEMO_DIR = "data/demo"  # where `pipeline demo-data` writes; used when data.dir is null
CACHE_MARKER = "info.json"  # a folder holding this is a cache split we may replace


# --------------------------------------------------------------------------------------
# whole-folder atomic replacement (used by crop and demo-data)


@contextlib.contextmanager
def staging_dir(dest: str | os.PathLike, marker: str,
                is_ours: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield an empty temp folder beside `dest`; when the block succeeds it replaces `dest`
    as a whole (rename), else it is removed. An existing `dest` is only replaced when it is
    empty, holds `marker` or passes `is_ours` (i.e. it is an earlier output of the same
    stage), so a mistyped path never deletes someone's folder. Temp folders that a killed
    run (kill -9) left beside `dest` are removed first; a failed write (a full disk) is a
    PipelineError naming `dest`, and `dest` is left as it was."""
    dest = Path(dest)
    if dest.exists():
        if not dest.is_dir():
            raise PipelineError(dest, "exists and is not a folder")
        if any(dest.iterdir()) and not (dest / marker).exists() and not (is_ours and is_ours(dest)):
            raise PipelineError(dest, f"exists and is not an output of this stage (no {marker}); "
                                      "refusing to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*dest.parent.glob(f".{dest.name}.tmp-*"), *dest.parent.glob(f".{dest.name}.old-*")]:
        log.info("removing %s left by an interrupted run", stale)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the output is not
        publish_dir(tmp, dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PipelineError(dest, f"writing failed ({e.strerror or type(e).__name__}); left as it was") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_dir(tmp: Path, dest: Path) -> None:
    """Rename the finished folder `tmp` onto `dest` (the old one is moved aside first)."""
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
        os.replace(dest, old / "x")
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------------------
# geometry


def crop_transform(box: tuple[float, float, float, float], expand: float, size: int) -> np.ndarray:
    """(2, 3) affine crop pixel -> original pixel for a square crop of side max(w, h) * expand
    centred on the box. Pixel centres at integers: crop pixel u covers the original interval
    [E + u*s, E + (u+1)*s) in edge coordinates, so x = E + (u + 0.5) * s - 0.5."""
    left, top, w, h = (float(v) for v in box)
    side = max(w, h) * expand
    s = side / size
    cx, cy = left + w / 2, top + h / 2  # box centre in edge coordinates
    ex, ey = cx - side / 2, cy - side / 2
    return np.array([[s, 0.0, ex + 0.5 * s - 0.5], [0.0, s, ey + 0.5 * s - 0.5]])


def to_original(points: np.ndarray, crop_to_orig: np.ndarray) -> np.ndarray:
    """(N, K, 2) crop pixels -> original pixels through each face's (2, 3) affine."""
    pts = np.asarray(points, dtype=np.float64)
    a = np.asarray(crop_to_orig, dtype=np.float64)
    return np.einsum("nij,nkj->nki", a[:, :, :2], pts) + a[:, None, :, 2]


def to_crop(points: np.ndarray, crop_to_orig: np.ndarray) -> np.ndarray:
    """Inverse of to_original: (N, K, 2) original pixels -> crop pixels."""
    a = np.asarray(crop_to_orig, dtype=np.float64)
    inv = np.linalg.inv(a[:, :, :2])
    return np.einsum("nij,nkj->nki", inv, np.asarray(points, dtype=np.float64) - a[:, None, :, 2])


def crop_one(image: np.ndarray, a: np.ndarray, size: int) -> np.ndarray:
    """Warp the square region of `image` that the crop->original affine `a` covers into
    (size, size), black where it leaves the image. Large reductions are low-pass filtered
    first (sigma ~ 0.45 x the reduction, INTER_AREA-like), else bilinear sampling aliases
    hair and background texture."""
    s = float(a[0, 0])
    if s > 1.5:
        # blur only the window the crop reads (plus a margin), not the whole photo
        x0, y0 = a[0, 2], a[1, 2]
        m = int(3 * s) + 2
        xa, ya = max(0, int(np.floor(x0)) - m), max(0, int(np.floor(y0)) - m)
        xb = min(image.shape[1], int(np.ceil(x0 + s * size)) + m)
        yb = min(image.shape[0], int(np.ceil(y0 + s * size)) + m)
        if xb > xa and yb > ya:
            image = cv2.GaussianBlur(image[ya:yb, xa:xb], (0, 0), sigmaX=0.45 * s)
            a = a.copy()
            a[0, 2] -= xa
            a[1, 2] -= ya
    return cv2.warpAffine(image, np.ascontiguousarray(a, dtype=np.float64), (size, size),
                          flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0))


MAX_BOX_SCALE = 3.0  # a face box may be at most this many times the image's larger side


def check_box(box, width: int, height: int) -> str | None:
    """Why a face box cannot be cropped from a width x height image (None if it can): it
    must overlap the image and be at most MAX_BOX_SCALE x the image's larger side (a box
    far outside the image would cache an all-black face; a huge one stalls the crop)."""
    left, top, w, h = (float(v) for v in box)

    def n(v: float) -> str:
        return str(int(v)) if v == int(v) else f"{v:.6g}"

    if max(w, h) > MAX_BOX_SCALE * max(width, height):
        return (f"box {n(w)}x{n(h)} is more than {MAX_BOX_SCALE:g}x the image ({width}x{height} px): "
                "not a face of this image")
    if left >= width or top >= height or left + w <= 0 or top + h <= 0:
        return f"box (left {n(left)}, top {n(top)}, {n(w)}x{n(h)}) lies outside the image ({width}x{height} px)"
    return None


def _crop_image(path: str, boxes: list, expand: float, size: int, rel: str = ""):
    """Worker: one photo's crops. PipelineError does not survive joblib's pickling, so it
    comes back as a value and is raised again in the parent (path None: the annotation
    file is at fault, not the image)."""
    try:
        image = read_image(path)
    except PipelineError as e:
        return ("error", e.path, e.problem, e.where)
    for j, box in enumerate(boxes):
        bad = check_box(box, image.shape[1], image.shape[0])
        if bad:
            return ("error", None, bad, f"image {rel or path} box {j}")
    out = []
    for box in boxes:
        a = crop_transform(box, expand, size)
        out.append((crop_one(image, a, size), a))
    return ("ok", out, image.shape[1], image.shape[0])


def crop_faces(faces: list[Face], root: str | os.PathLike, size: int, expand: float, n_jobs: int = 1,
               source: str | os.PathLike = "", progress: bool = False, return_sizes: bool = False):
    """(faces uint8 (N, size, size, 3), crop_to_orig float64 (N, 2, 3)) in face order, plus
    image (width, height) (N, 2) with return_sizes. Each photo is decoded once for all of
    its boxes; photos are spread over `n_jobs` joblib workers (1 = in this process)."""
    from joblib import Parallel, delayed
    from tqdm import tqdm

    if size < 1 or expand <= 0:
        raise PipelineError(params_source("crop.side", "crop.expand"),
                            f"crop.side must be >= 1 and crop.expand > 0, got {size}, {expand}")
    root = Path(root)
    by_image: dict[str, list[int]] = {}
    for i, f in enumerate(faces):
        by_image.setdefault(f.image, []).append(i)
    jobs = list(by_image.items())
    paths = [str(safe_image_path(root, rel, source or root)) for rel, _ in jobs]
    tasks = (delayed(_crop_image)(p, [faces[i].box for i in idx], expand, size, rel)
             for p, (rel, idx) in zip(paths, jobs))
    n_jobs = max(1, min(int(n_jobs), len(jobs))) if n_jobs > 0 else n_jobs
    results = Parallel(n_jobs=n_jobs, batch_size=8, return_as="generator")(tasks)
    arr = np.zeros((len(faces), size, size, 3), dtype=np.uint8)
    a = np.zeros((len(faces), 2, 3))
    wh = np.zeros((len(faces), 2), dtype=np.int64)
    # the bar only on a terminal (disable=None): logs and CI output stay clean
    bar = tqdm(results, total=len(jobs), desc=f"crop {Path(source).name}".strip(), unit="img",
               disable=None if progress else True, leave=False)
    for (rel, idx), res in zip(jobs, bar):
        if res[0] == "error":
            _, path, problem, where = res
            with warnings.catch_warnings():  # joblib warns about the photos it now drops
                warnings.simplefilter("ignore")
                bar.close()
                results.close()
            if path is None:  # a bad box: the annotation file is at fault
                raise PipelineError(source or root, problem, where)
            raise PipelineError(path, problem, where or (f"listed in {source}" if source else None))
        _, crops, w, h = res
        for i, (crop, m) in zip(idx, crops):
            arr[i], a[i], wh[i] = crop, m, (w, h)
    return (arr, a, wh) if return_sizes else (arr, a)


# --------------------------------------------------------------------------------------
# the cache


@dataclass
class Cache:
    path: Path
    faces: np.ndarray  # (N, S, S, 3) uint8, memory-mapped
    keypoints: np.ndarray | None  # (N, K, 2) float32 crop px (None: unlabelled split)
    keypoints_orig: np.ndarray | None  # (N, K, 2) float64 original px, exactly as in the XML
    crop_to_orig: np.ndarray  # (N, 2, 3) float64: orig = A @ [u, v, 1]
    meta: Any  # pandas DataFrame, one row per face (docs/design.md columns)
    info: dict
    schema: KeypointSchema

    def __len__(self) -> int:
        return len(self.faces)


META_COLUMNS = ["index", "face_id", "group", "image", "box_left", "box_top", "box_width", "box_height",
                "image_width", "image_height"]


def _load_npy(path: Path, mmap: bool = False) -> np.ndarray:
    if not path.exists():
        raise PipelineError(path, "missing from the face cache (rerun `pipeline crop`)")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as e:
        raise PipelineError(path, f"not a readable .npy file ({type(e).__name__})") from None


def load_cache(path: str | os.PathLike) -> Cache:
    """One split of the face cache (`<cache>/train` or `<cache>/test`); faces memory-mapped."""
    import pandas as pd

    path = Path(path)
    info_path = path / "info.json"
    if not info_path.exists():
        raise PipelineError(path, "no face cache here (run `pipeline crop` first)")
    try:
        info = json.loads(info_path.read_text())
        has_kp = bool(info["has_keypoints"])
        schema = schema_from_dict(info["schema"])
    except PipelineError:
        raise
    except Exception as e:
        raise PipelineError(info_path, f"unreadable cache info ({type(e).__name__}: {e})") from None
    faces = _load_npy(path / "faces.npy", mmap=True)
    a = _load_npy(path / "crop_to_orig.npy")
    kp = _load_npy(path / "keypoints.npy") if has_kp else None
    kp_orig = _load_npy(path / "keypoints_orig.npy") if has_kp else None
    try:
        meta = pd.read_csv(path / "meta.csv", dtype={"face_id": str, "group": str, "image": str},
                           keep_default_na=False)
    except Exception as e:
        raise PipelineError(path / "meta.csv", f"unreadable ({type(e).__name__})") from None
    n = len(faces)
    if faces.dtype != np.uint8 or faces.ndim != 4 or faces.shape[3] != 3:
        raise PipelineError(path / "faces.npy", f"expected uint8 (N, S, S, 3), got {faces.dtype} {faces.shape}")
    if a.shape != (n, 2, 3) or len(meta) != n:
        raise PipelineError(path, f"inconsistent cache: {n} faces, crop_to_orig {a.shape}, meta {len(meta)} rows")
    for name, arr in (("keypoints.npy", kp), ("keypoints_orig.npy", kp_orig)):
        if arr is not None and arr.shape != (n, schema.k, 2):
            raise PipelineError(path / name, f"expected shape {(n, schema.k, 2)}, got {arr.shape}")
    return Cache(path, faces, kp, kp_orig, a, meta, info, schema)


def _write_split(tmp: Path, faces: list[Face], arr: np.ndarray, a: np.ndarray, wh: np.ndarray,
                 schema: KeypointSchema, xml: Path, size: int, expand: float, cfg: dict, run: str) -> None:
    """One split into the (new, empty) folder `tmp`; `run` ties it to the other split."""
    import pandas as pd

    from pipeline.config import write_resolved

    label_origin = float(cfg["data"]["label_origin"])
    tmp.mkdir()
    write_npy(tmp / "faces.npy", arr)
    write_npy(tmp / "crop_to_orig.npy", a)
    has_kp = faces[0].keypoints is not None
    if has_kp:
        orig = np.stack([f.keypoints for f in faces]).astype(np.float64)
        write_npy(tmp / "keypoints_orig.npy", orig)
        # crop pixels are 0-based pixel centres: labels move to that grid before the
        # transform, predictions move back in predict_original
        write_npy(tmp / "keypoints.npy", to_crop(orig - label_origin, a).astype(np.float32))
    meta = pd.DataFrame({
        "index": np.arange(len(faces)), "face_id": [f.face_id for f in faces],
        "group": [f.group for f in faces], "image": [f.image for f in faces],
        "box_left": [f.box[0] for f in faces], "box_top": [f.box[1] for f in faces],
        "box_width": [f.box[2] for f in faces], "box_height": [f.box[3] for f in faces],
        "image_width": wh[:, 0], "image_height": wh[:, 1],
    }, columns=META_COLUMNS)
    write_text(tmp / "meta.csv", meta.to_csv(index=False))
    write_resolved(cfg, tmp, ["data", "crop"])
    # info.json last: it marks a complete split
    write_json(tmp / "info.json", {"size": size, "expand": expand, "n": len(faces), "has_keypoints": has_kp,
                                   "schema": schema.to_dict(), "xml": str(xml), "run": run,
                                   "label_origin": label_origin})


def _is_cache_root(folder: Path) -> bool:
    """An earlier `pipeline crop` output: only train/ and test/ caches and the params file."""
    for p in folder.iterdir():
        if p.name in ("train", "test"):
            if p.is_dir() and any(p.iterdir()) and not (p / CACHE_MARKER).exists():
                return False
        elif p.name != "params.resolved.yaml":
            return False
    return True


def check_same_run(train: Cache, test: Cache) -> None:
    """Train and test caches must come from one `pipeline crop` run (same geometry too)."""
    if train.info.get("run") != test.info.get("run") or train.info.get("size") != test.info.get("size") \
            or train.info.get("expand") != test.info.get("expand"):
        raise PipelineError(train.path.parent, "train/ and test/ caches come from different `pipeline crop` runs "
                                               "(rerun `pipeline crop`)")


def run_crop(cfg: dict, out_dir: str | os.PathLike = "data/cache") -> dict[str, int]:
    """The `crop` stage: both splits of data.dir (or the demo set) into out_dir/{train,test}."""
    from pipeline.config import write_resolved

    dcfg, ccfg = cfg["data"], cfg["crop"]
    if ccfg["side"] < 8 or ccfg["expand"] <= 0:
        raise PipelineError(params_source("crop.side", "crop.expand"),
                            f"crop.side must be >= 8 and crop.expand > 0, got "
                            f"{ccfg['side']} and {ccfg['expand']}")
    if ccfg["n_jobs"] == 0:
        raise PipelineError(params_source("crop.n_jobs"), "crop.n_jobs must be >= 1 (or negative: all cores but n+1)")
    root = Path(dcfg["dir"] or DEMO_DIR)
    if not root.is_dir():
        hint = " (run `pipeline demo-data data/demo`, or set data.dir)" if dcfg["dir"] is None else ""
        raise PipelineError(root, "dataset folder not found" + hint)
    schema = get_schema(dcfg)
    splits = {"train": (root / dcfg["train_xml"], True), "test": (root / dcfg["test_xml"], False)}
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not _is_cache_root(out))):
        raise PipelineError(out, "exists and is not a face cache (only train/, test/ and params.resolved.yaml "
                                 "may be there); refusing to replace it")
    for name in splits:  # fail before the work when an output cannot be replaced
        d = out / name
        if d.exists() and (not d.is_dir() or (any(d.iterdir()) and not (d / CACHE_MARKER).exists())):
            raise PipelineError(d, f"exists and is not a face cache (no {CACHE_MARKER}); refusing to replace it")
    # read and check both annotation files before cropping or writing anything
    faces = {name: load_xml(xml, schema, require_parts=req) for name, (xml, req) in splits.items()}
    crops, timing = {}, {}
    for name, (xml, _) in splits.items():
        t0 = time.perf_counter()
        crops[name] = crop_faces(faces[name], root, ccfg["side"], ccfg["expand"], ccfg["n_jobs"], xml,
                                 progress=True, return_sizes=True)
        timing[name] = time.perf_counter() - t0
    for name, dt in timing.items():  # logged once everything is known to be good
        log.info("crop %s: %d faces in %.2f s (%.0f faces/s, %d jobs)", name, len(faces[name]), dt,
                 len(faces[name]) / max(dt, 1e-9), ccfg["n_jobs"])
    # both splits (and the params) go to one temp folder that replaces `out` as a whole: a
    # crash or a full disk never leaves a train cache and a test cache of different runs
    import uuid

    from pipeline.faults import kill_point

    run = uuid.uuid4().hex
    with staging_dir(out, CACHE_MARKER, is_ours=_is_cache_root) as tmp:
        for name, (xml, _) in splits.items():
            _write_split(tmp / name, faces[name], *crops[name], schema, xml, ccfg["side"], ccfg["expand"], cfg, run)
            kill_point(f"crop:{name}")  # tests only (pipeline/faults.py)
        write_resolved(cfg, tmp, ["data", "crop"])
    return {name: len(f) for name, f in faces.items()}


@click.command("crop")
@click.option("--out", "out_dir", default="data/cache", show_default=True, help="writes <out>/train and <out>/test")
@config_options
def crop_cmd(out_dir, cfg):
    """Crop every face box of the train and test XML into the face cache."""
    t0 = time.perf_counter()
    counts = run_crop(cfg, out_dir)
    dt = time.perf_counter() - t0
    n = counts["train"] + counts["test"]
    log.info("cached %d train and %d test faces in %s (%.1f s, %.0f faces/s overall)",
             counts["train"], counts["test"], out_dir, dt, n / max(dt, 1e-9))
