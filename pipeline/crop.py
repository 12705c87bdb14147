"""Crop and cache: expand each face box, make it square, crop (padding where the box leaves
the image), resize to `crop.size`, and store every face of a split in one uint8 array with
its keypoints and the crop->original transform, so predictions map back exactly."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import click
import cv2
import numpy as np

from pipeline.cli import config_options
from pipeline.dataset import Face, load_xml, read_image, safe_image_path
from pipeline.errors import PipelineError
from pipeline.schema import KeypointSchema, get_schema, schema_from_dict

log = logging.getLogger(__name__)

DEMO_DIR = "data/demo"  # where `pipeline demo-data` writes when data.dir is null


def crop_transform(box: tuple[float, float, float, float], expand: float, size: int) -> np.ndarray:
    """(2, 3) affine crop pixel -> original pixel for a square crop of side max(w, h) * expand
    centred on the box. Pixel centres at integers: crop pixel u covers the original interval
    [E + u*s, E + (u+1)*s) in edge coordinates, so x = E + (u + 0.5) * s - 0.5."""
    left, top, w, h = box
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
    """Inverse of to_original."""
    a = np.asarray(crop_to_orig, dtype=np.float64)
    inv = np.linalg.inv(a[:, :, :2])
    return np.einsum("nij,nkj->nki", inv, np.asarray(points, dtype=np.float64) - a[:, None, :, 2])


def _crop_one(image: np.ndarray, a: np.ndarray, size: int) -> np.ndarray:
    """Warp the square region into (size, size). Large reductions are low-pass filtered first
    (sigma ~ the reduction), else bilinear sampling aliases hair and background texture."""
    s = a[0, 0]
    if s > 1.5:
        # blur only the window the crop reads (plus a margin), not the whole photo
        x0, y0 = a[0, 2], a[1, 2]
        m = int(3 * s) + 2
        xa, ya = max(0, int(x0) - m), max(0, int(y0) - m)
        xb = min(image.shape[1], int(x0 + s * size) + m)
        yb = min(image.shape[0], int(y0 + s * size) + m)
        if xb > xa and yb > ya:
            image = image[ya:yb, xa:xb]
            image = cv2.GaussianBlur(image, (0, 0), sigmaX=0.45 * s)
            a = a.copy()
            a[0, 2] -= xa
            a[1, 2] -= ya
    inv = cv2.invertAffineTransform(a)  # original -> crop, what warpAffine expects
    return cv2.warpAffine(image, inv, (size, size), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0))


def _crop_image(root: str, rel: str, boxes: list, expand: float, size: int, source: str):
    image = read_image(safe_image_path(Path(root), rel, source))
    out = []
    for box in boxes:
        a = crop_transform(box, expand, size)
        out.append((_crop_one(image, a, size), a))
    return out, image.shape[1], image.shape[0]


def crop_faces(faces: list[Face], root: str | os.PathLike, size: int, expand: float, n_jobs: int = 1,
               source: str | os.PathLike = "", progress: bool = False):
    """(faces uint8 (N, size, size, 3), crop_to_orig (N, 2, 3), image_wh (N, 2)) in face order.
    Each photo is decoded once for all of its boxes; photos are spread over joblib workers."""
    from joblib import Parallel, delayed
    from tqdm import tqdm

    by_image: dict[str, list[int]] = {}
    for i, f in enumerate(faces):
        by_image.setdefault(f.image, []).append(i)
    jobs = list(by_image.items())
    results = Parallel(n_jobs=n_jobs, batch_size=8)(
        delayed(_crop_image)(str(root), rel, [faces[i].box for i in idx], expand, size, str(source))
        for rel, idx in tqdm(jobs, desc="crop", unit="img", disable=not progress, leave=False))
    arr = np.zeros((len(faces), size, size, 3), dtype=np.uint8)
    a = np.zeros((len(faces), 2, 3))
    wh = np.zeros((len(faces), 2), dtype=np.int64)
    for (rel, idx), (crops, w, h) in zip(jobs, results):
        for i, (crop, m) in zip(idx, crops):
            arr[i], a[i], wh[i] = crop, m, (w, h)
    return arr, a, wh


@dataclass
class Cache:
    path: Path
    faces: np.ndarray  # (N, S, S, 3) uint8, memory-mapped
    keypoints: np.ndarray | None  # (N, K, 2) float32 crop px
    keypoints_orig: np.ndarray | None  # (N, K, 2) float64 original px
    crop_to_orig: np.ndarray  # (N, 2, 3)
    meta: "object"  # pandas DataFrame, one row per face
    info: dict
    schema: KeypointSchema

    def __len__(self) -> int:
        return len(self.faces)


def load_cache(path: str | os.PathLike) -> Cache:
    import pandas as pd

    path = Path(path)
    if not (path / "info.json").exists():
        raise PipelineError(path, "no face cache here (run `pipeline crop` first)")
    info = json.loads((path / "info.json").read_text())
    has_kp = info["has_keypoints"]
    return Cache(path, np.load(path / "faces.npy", mmap_mode="r"),
                 np.load(path / "keypoints.npy") if has_kp else None,
                 np.load(path / "keypoints_orig.npy") if has_kp else None,
                 np.load(path / "crop_to_orig.npy"), pd.read_csv(path / "meta.csv"), info,
                 schema_from_dict(info["schema"]))


def _write_split(out: Path, faces: list[Face], arr, a, wh, schema, xml: Path, size: int, expand: float,
                 cfg: dict) -> None:
    """Write one split into a temp folder, then swap it in: readers never see half a cache."""
    import pandas as pd

    from pipeline.config import write_resolved

    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "faces.npy", arr)
    np.save(tmp / "crop_to_orig.npy", a)
    has_kp = faces[0].keypoints is not None
    if has_kp:
        orig = np.stack([f.keypoints for f in faces])
        np.save(tmp / "keypoints_orig.npy", orig)
        np.save(tmp / "keypoints.npy", to_crop(orig, a).astype(np.float32))
    pd.DataFrame({
        "index": np.arange(len(faces)), "face_id": [f.face_id for f in faces],
        "group": [f.group for f in faces], "image": [f.image for f in faces],
        "box_left": [f.box[0] for f in faces], "box_top": [f.box[1] for f in faces],
        "box_width": [f.box[2] for f in faces], "box_height": [f.box[3] for f in faces],
        "image_width": wh[:, 0], "image_height": wh[:, 1],
    }).to_csv(tmp / "meta.csv", index=False)
    (tmp / "info.json").write_text(json.dumps({
        "size": size, "expand": expand, "n": len(faces), "has_keypoints": has_kp,
        "schema": schema.to_dict(), "xml": str(xml)}, indent=2))
    write_resolved(cfg, tmp, ["data", "crop"])
    old = out.parent / f".{out.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def run_crop(cfg: dict, out_dir: str | os.PathLike = "data/cache") -> dict[str, int]:
    dcfg, ccfg = cfg["data"], cfg["crop"]
    if ccfg["size"] < 8 or ccfg["expand"] <= 0:
        raise PipelineError("params.yaml", "crop.size must be >= 8 and crop.expand > 0")
    root = Path(dcfg["dir"] or DEMO_DIR)
    if not root.is_dir():
        raise PipelineError(root, "dataset folder not found" + (" (run `pipeline demo-data data/demo`)"
                                                                 if dcfg["dir"] is None else ""))
    schema = get_schema(dcfg)
    splits = {"train": (root / dcfg["train_xml"], True), "test": (root / dcfg["test_xml"], False)}
    # read and check both annotation files before cropping or writing anything
    faces = {name: load_xml(xml, schema, require_parts=req) for name, (xml, req) in splits.items()}
    crops = {}
    for name, (xml, _) in splits.items():
        t0 = time.perf_counter()
        crops[name] = crop_faces(faces[name], root, ccfg["size"], ccfg["expand"], ccfg["n_jobs"], xml,
                                 progress=True)
        dt = time.perf_counter() - t0
        log.info("crop %s: %d faces in %.1f s (%.0f faces/s)", name, len(faces[name]), dt,
                 len(faces[name]) / max(dt, 1e-9))
    out = Path(out_dir)
    for name, (xml, _) in splits.items():
        _write_split(out / name, faces[name], *crops[name], schema, xml, ccfg["size"], ccfg["expand"], cfg)
    return {name: len(f) for name, f in faces.items()}


@click.command("crop")
@click.option("--out", "out_dir", default="data/cache", show_default=True, help="writes <out>/train and <out>/test")
@config_options
def crop_cmd(out_dir, cfg):
    """Crop every face box of the train and test XML into the face cache."""
    counts = run_crop(cfg, out_dir)
    log.info("cached %d train and %d test faces in %s", counts["train"], counts["test"], out_dir)
