"""The face cache format (`pipeline crop` -> `<cache>/{train,test}/`), its one writer and
its readers: `load_cache` for the whole split, and narrow readers of single files for
stages whose DVC deps name only those files (folds: train meta.csv; submit: test
meta.csv and info.json; evaluate: train keypoints_orig.npy and info.json, test
meta.csv). All of them share the checks below.

Files per split (docs/design.md, "Face cache"): faces.npy, keypoints.npy,
keypoints_orig.npy (labelled sets), crop_to_orig.npy, meta.csv, info.json; an extra
training split (`pipeline crop-extra` -> data/extra/<name>/) also photos.json and, in
info.json, `extra`: where it came from and what it was checked against."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core.config import result_params
from pipeline.core.errors import PipelineError
from pipeline.core.io import write_json, write_npy, write_text
from pipeline.core.params_schema import Config, DataParams
from pipeline.core.paths import DEMO_DIR
from pipeline.keypoints.geometry import to_crop
from pipeline.keypoints.schema import KeypointSchema, schema_from_dict

CACHE_MARKER = "info.json"  # written last: a folder holding it is a complete cache split
PHOTOS_FILE = "photos.json"  # an extra split's {photo path: sha256 of its bytes}

# params the main crop does not read (left out of its run id and params.resolved.yaml, so
# its cache is byte-identical with or without extras), and those an extra split does not
# depend on (it reads data.dir's photos only to refuse duplicates: checked, not cropped)
MAIN_CROP_IGNORES = ("data.extra_train",)
EXTRA_CROP_IGNORES = ("data.dir", "data.test_xml", "data.solution", "data.extra_train")


def extra_crop_params(cfg: Config) -> dict[str, dict]:
    """The params that shape an extra training split (its schema, labels' origin and crop
    geometry): recorded in its info.json and hashed into its run id; a split recorded
    under other values is stale."""
    return result_params(cfg, ["data", "crop"], exclude=EXTRA_CROP_IGNORES)


def dataset_root(data_cfg: DataParams, override: str | os.PathLike | None = None) -> Path:
    """The dataset folder: `override` (a command's --data-dir), else data.dir, else the
    demo set."""
    return Path(override or data_cfg.dir or DEMO_DIR)


META_COLUMNS = ["index", "face_id", "group", "image", "box_left", "box_top", "box_width", "box_height",
                "image_width", "image_height"]
# meta.csv columns read as text: ids like "0001" and paths must not become numbers
_META_TEXT = {"face_id": str, "group": str, "image": str}


@dataclass
class Cache:
    path: Path
    faces: np.ndarray  # (N, S, S, 3) uint8, memory-mapped
    keypoints: np.ndarray | None  # (N, K, 2) float32 crop px (None: unlabelled split)
    keypoints_orig: np.ndarray | None  # (N, K, 2) float64 original px, exactly as in the XML
    crop_to_orig: np.ndarray  # (N, 2, 3) float64: orig = A @ [u, v, 1]
    meta: Any  # pandas DataFrame, one row per face (META_COLUMNS)
    info: dict  # info.json: size, expand, n, has_keypoints, schema, xml, run, label_origin
    schema: KeypointSchema

    def __len__(self) -> int:
        return len(self.faces)


# ------------------------------------------------------------------------------ writer

def write_cache_split(folder: Path, faces: list, crops: np.ndarray, crop_to_orig: np.ndarray,
                      image_sizes: np.ndarray, schema: KeypointSchema, xml: Path, side: int, expand: float,
                      label_origin: float, run: str, extra: dict | None = None,
                      photos: dict[str, str] | None = None) -> None:
    """One split into `folder` (new, or holding only the caller's own files, such as the
    run's params): `faces` (dataset.Face list, in XML order),
    their crops (N, side, side, 3) uint8, transforms (N, 2, 3), photo (width, height)
    (N, 2); `run` ties the split to the other split of the same crop run. An extra training
    split also gets `extra` (info.json's `extra`) and `photos` ({photo: sha256}, photos.json)."""
    folder.mkdir(exist_ok=True)
    write_npy(folder / "faces.npy", crops)
    write_npy(folder / "crop_to_orig.npy", crop_to_orig)
    has_kp = faces[0].keypoints is not None
    if has_kp:
        orig = np.stack([f.keypoints for f in faces]).astype(np.float64)
        write_npy(folder / "keypoints_orig.npy", orig)
        # crop pixels are 0-based pixel centres: labels move to that grid before the
        # transform, predictions move back in inference.predict_original
        write_npy(folder / "keypoints.npy", to_crop(orig - label_origin, crop_to_orig).astype(np.float32))
    meta = pd.DataFrame({
        "index": np.arange(len(faces)), "face_id": [f.face_id for f in faces],
        "group": [f.group for f in faces], "image": [f.image for f in faces],
        "box_left": [f.box[0] for f in faces], "box_top": [f.box[1] for f in faces],
        "box_width": [f.box[2] for f in faces], "box_height": [f.box[3] for f in faces],
        "image_width": image_sizes[:, 0], "image_height": image_sizes[:, 1],
    }, columns=META_COLUMNS)
    write_text(folder / "meta.csv", meta.to_csv(index=False))
    if photos is not None:
        write_json(folder / PHOTOS_FILE, photos)
    info = {"size": side, "expand": expand, "n": len(faces), "has_keypoints": has_kp, "schema": schema.to_dict(),
            "xml": str(xml), "run": run, "label_origin": label_origin}
    if extra is not None:
        info["extra"] = extra
    # info.json last: it marks a complete split
    write_json(folder / CACHE_MARKER, info)


def is_cache_root(folder: Path) -> bool:
    """An earlier `pipeline crop` output: only train/ and test/ caches and the params file."""
    for p in folder.iterdir():
        if p.name in ("train", "test"):
            if p.is_dir() and any(p.iterdir()) and not (p / CACHE_MARKER).exists():
                return False
        elif p.name != "params.resolved.yaml":
            return False
    return True


# ------------------------------------------------------------------------------ readers

def read_info(split: str | os.PathLike) -> tuple[dict, KeypointSchema]:
    """info.json of a cache split and its keypoint schema (checked)."""
    path = Path(split) / CACHE_MARKER
    if not path.exists():
        raise PipelineError(Path(split), "no face cache here (run `pipeline crop` first)")
    try:
        info = json.loads(path.read_text())
        schema = schema_from_dict(info["schema"])
    except PipelineError:
        raise
    except Exception as e:
        raise PipelineError(path, f"unreadable cache info ({type(e).__name__}: {e})") from None
    return info, schema


def read_meta(split: str | os.PathLike, columns=("index", "face_id", "group")):
    """meta.csv of a cache split (pandas DataFrame, text columns kept as text)."""
    path = Path(split) / "meta.csv"
    if not path.exists():
        raise PipelineError(path, "not found (run `pipeline crop` first)")
    try:
        meta = pd.read_csv(path, dtype=_META_TEXT, keep_default_na=False)
    except Exception as e:
        raise PipelineError(path, f"unreadable CSV ({type(e).__name__})") from None
    missing = [c for c in columns if c not in meta.columns]
    if missing:
        raise PipelineError(path, f"missing column(s) {missing}")
    return meta


def read_array(split: str | os.PathLike, name: str, mmap: bool = False, shape_k: int | None = None) -> np.ndarray:
    """One .npy of a cache split (`faces`, `crop_to_orig`, `keypoints`, `keypoints_orig`);
    keypoint arrays must be (N, K, 2) (K = shape_k when given)."""
    path = Path(split) / f"{name}.npy"
    if not path.exists():
        raise PipelineError(path, "missing from the face cache (rerun `pipeline crop`)")
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as e:
        raise PipelineError(path, f"not a readable .npy file ({type(e).__name__})") from None
    if name.startswith("keypoints") and (arr.ndim != 3 or arr.shape[2] != 2
                                         or (shape_k is not None and arr.shape[1] != shape_k)):
        want = f"(N, {shape_k if shape_k is not None else 'K'}, 2)"
        raise PipelineError(path, f"expected shape {want}, got {arr.shape}")
    return arr


def read_photos(split: str | os.PathLike) -> dict[str, str]:
    """photos.json of an extra training split: {photo path in its folder: sha256}."""
    path = Path(split) / PHOTOS_FILE
    if not path.exists():
        raise PipelineError(path, "missing from the extra face cache (rerun `pipeline crop-extra`)")
    try:
        photos = json.loads(path.read_text())
    except Exception as e:
        raise PipelineError(path, f"unreadable photo list ({type(e).__name__})") from None
    if not isinstance(photos, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in photos.items()):
        raise PipelineError(path, "not a photo list (expects {photo: sha256})")
    return photos


def face_count(split: str | os.PathLike) -> int | None:
    """How many faces a cache split holds (meta.csv rows); None when there is no split."""
    return len(read_meta(split, columns=())) if (Path(split) / "meta.csv").exists() else None


def split_schema(split: str | os.PathLike) -> KeypointSchema | None:
    """The keypoint schema a cache split was cropped with; None when there is no split."""
    return read_info(split)[1] if (Path(split) / CACHE_MARKER).exists() else None


def load_cache(path: str | os.PathLike) -> Cache:
    """One split of the face cache (`<cache>/train` or `<cache>/test`); faces memory-mapped."""
    path = Path(path)
    info, schema = read_info(path)
    if "has_keypoints" not in info:
        raise PipelineError(path / CACHE_MARKER, "unreadable cache info (no 'has_keypoints')")
    has_kp = bool(info["has_keypoints"])
    faces = read_array(path, "faces", mmap=True)
    a = read_array(path, "crop_to_orig")
    kp = read_array(path, "keypoints", shape_k=schema.k) if has_kp else None
    kp_orig = read_array(path, "keypoints_orig", shape_k=schema.k) if has_kp else None
    meta = read_meta(path, columns=META_COLUMNS[:4])
    n = len(faces)
    if faces.dtype != np.uint8 or faces.ndim != 4 or faces.shape[3] != 3:
        raise PipelineError(path / "faces.npy", f"expected uint8 (N, S, S, 3), got {faces.dtype} {faces.shape}")
    if a.shape != (n, 2, 3) or len(meta) != n:
        raise PipelineError(path, f"inconsistent cache: {n} faces, crop_to_orig {a.shape}, meta {len(meta)} rows")
    for name, arr in (("keypoints.npy", kp), ("keypoints_orig.npy", kp_orig)):
        if arr is not None and len(arr) != n:
            raise PipelineError(path / name, f"expected shape {(n, schema.k, 2)}, got {arr.shape}")
    return Cache(path, faces, kp, kp_orig, a, meta, info, schema)


def check_same_run(train: Cache, test: Cache) -> None:
    """Train and test caches must come from one `pipeline crop` run (same geometry too)."""
    if train.info.get("run") != test.info.get("run") or train.info.get("size") != test.info.get("size") \
            or train.info.get("expand") != test.info.get("expand"):
        raise PipelineError(train.path.parent, "train/ and test/ caches come from different `pipeline crop` runs "
                                               "(rerun `pipeline crop`)")
