"""The face pack (`pipeline pack` -> `gpu-pack/`): a crop cache and its folds file in a form
small enough to copy to a GPU machine, and its reader, which turns it back into a cache that
`load_cache` reads. One writer, one reader.

Layout of a pack folder:

* `<split>/` for every split folder of the cache (train/, test/, and any other split a
  cache holds): every file of the split as it is, except `faces.npy`, whose crops are stored
  as JPEG files laid end to end in `faces.jpegs` with their byte offsets in
  `faces_offsets.npy` ((N + 1,) int64);
* `folds.csv`, the folds file, as it is;
* the cache root's other files (params.resolved.yaml), as they are;
* `pack.json`, written last: the format, the JPEG quality, the bytes of the other files and,
  per split, the faces, the crop side, the JPEG bytes and the mean absolute difference of the
  decoded crops from the cache's.

JPEG rather than raw crops: the raw uint8 crops of a few thousand faces at 224 px are
hundreds of MB, past what a GPU machine's copy of the work tree may carry; the crops are
re-cut from photos that were JPEGs already, and quality 95 keeps them within about one grey
level. The decoded crops differ from the cache's, so a pack's cache is its own data: train
and compare on one kind."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, staging_dir, write_bytes, write_json, write_npy
from pipeline.formats.cache import CACHE_MARKER, is_cache_root, load_cache
from pipeline.formats.folds import read_folds

log = logging.getLogger(__name__)

PACK_MARKER = "pack.json"  # written last: a folder holding it is a complete pack
PACK_FORMAT = "pipeline face pack"
PACK_VERSION = 1
FOLDS_NAME = "folds.csv"
FACES = "faces.npy"
JPEGS, OFFSETS = "faces.jpegs", "faces_offsets.npy"
DEFAULT_QUALITY = 95


def cache_splits(cache_root: str | os.PathLike) -> list[str]:
    """The split folders of a cache root (those holding info.json), train first."""
    root = Path(cache_root)
    if not root.is_dir():
        raise PipelineError(root, "no face cache here (run `pipeline crop` first)")
    names = sorted(p.name for p in root.iterdir() if (p / CACHE_MARKER).is_file())
    if "train" not in names:
        raise PipelineError(root, "no train/ split with info.json (run `pipeline crop` first)")
    return ["train"] + [n for n in names if n != "train"]


def encode_faces(faces: np.ndarray, quality: int) -> tuple[bytes, np.ndarray]:
    """RGB crops (N, S, S, 3) uint8 -> JPEG files end to end and their (N + 1,) offsets."""
    parts, offsets = [], [0]
    for face in faces:
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(np.ascontiguousarray(face), cv2.COLOR_RGB2BGR),
                               [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        if not ok:
            raise PipelineError(None, "OpenCV could not encode a crop as JPEG")
        parts.append(buf.tobytes())
        offsets.append(offsets[-1] + len(parts[-1]))
    return b"".join(parts), np.asarray(offsets, dtype=np.int64)


def decode_faces(data: bytes, offsets: np.ndarray, side: int, where: str | os.PathLike) -> np.ndarray:
    """The inverse of encode_faces: (N, side, side, 3) uint8 RGB."""
    n = len(offsets) - 1
    out = np.empty((n, side, side, 3), dtype=np.uint8)
    buf = np.frombuffer(data, dtype=np.uint8)
    for i in range(n):
        img = cv2.imdecode(buf[offsets[i]:offsets[i + 1]], cv2.IMREAD_COLOR)
        if img is None or img.shape != (side, side, 3):
            got = "undecodable" if img is None else f"shape {img.shape}"
            raise PipelineError(where, f"face {i} is {got}, expected a {side} x {side} colour JPEG")
        out[i] = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return out


def write_pack(cache_root: str | os.PathLike, folds_path: str | os.PathLike, dest: str | os.PathLike,
               quality: int = DEFAULT_QUALITY) -> dict[str, Any]:
    """Pack every split of `cache_root` and the folds file into `dest` (replaced as a whole;
    only an earlier pack or an empty folder is replaced). Returns pack.json's content."""
    if not 1 <= int(quality) <= 100:
        raise PipelineError(None, f"JPEG quality must be 1..100, got {quality}")
    root = Path(cache_root)
    splits = cache_splits(root)
    caches = {name: load_cache(root / name) for name in splits}
    read_folds(Path(folds_path), caches["train"].meta, root / "train")  # the folds must be this cache's
    info: dict[str, Any] = {"format": PACK_FORMAT, "version": PACK_VERSION, "jpeg_quality": int(quality),
                            "folds": FOLDS_NAME, "splits": {}}
    with staging_dir(dest, PACK_MARKER) as tmp:
        for p in root.iterdir():  # the root's own files (params.resolved.yaml)
            if p.is_file():
                shutil.copy2(p, tmp / p.name)
        for name, cache in caches.items():
            (tmp / name).mkdir()
            data, offsets = encode_faces(cache.faces, quality)
            (tmp / name / JPEGS).write_bytes(data)
            write_npy(tmp / name / OFFSETS, offsets)
            side = int(cache.faces.shape[1])
            diff = np.abs(decode_faces(data, offsets, side, tmp / name / JPEGS).astype(np.int16)
                          - np.asarray(cache.faces, dtype=np.int16))
            for p in sorted((root / name).iterdir()):
                if p.is_file() and p.name not in (FACES, CACHE_MARKER):
                    shutil.copy2(p, tmp / name / p.name)
            shutil.copy2(root / name / CACHE_MARKER, tmp / name / CACHE_MARKER)
            info["splits"][name] = {"faces": len(cache), "side": side, "expand": cache.info.get("expand"),
                                    "bytes": len(data), "raw_bytes": int(cache.faces.nbytes),
                                    "mean_abs_diff": float(diff.mean()) if diff.size else 0.0}
        shutil.copy2(folds_path, tmp / FOLDS_NAME)
        info["bytes"] = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
        write_json(tmp / PACK_MARKER, info)
    return info


def read_pack_info(pack: str | os.PathLike) -> dict[str, Any]:
    """pack.json of a pack folder (checked)."""
    path = Path(pack) / PACK_MARKER
    if not path.is_file():
        raise PipelineError(Path(pack), f"not a face pack (no {PACK_MARKER}: run `pipeline pack` first)")
    try:
        info = json.loads(path.read_text())
    except Exception as e:
        raise PipelineError(path, f"unreadable pack info ({type(e).__name__}: {e})") from None
    if not isinstance(info, dict) or info.get("format") != PACK_FORMAT or not isinstance(info.get("splits"), dict) \
            or "train" not in info["splits"]:
        raise PipelineError(path, f"not a {PACK_FORMAT} (format, splits with train)")
    if info.get("version") != PACK_VERSION:
        raise PipelineError(path, f"pack version {info.get('version')}, this code reads {PACK_VERSION} "
                                  "(rebuild it with `pipeline pack`)")
    return info


def unpack(pack: str | os.PathLike, cache_root: str | os.PathLike, folds_path: str | os.PathLike) -> dict[str, Any]:
    """A pack back into a face cache at `cache_root` (every split; replaced as a whole, only
    an earlier cache or an empty folder) and its folds file at `folds_path`. Returns pack.json."""
    pack = Path(pack)
    info = read_pack_info(pack)
    if not (pack / FOLDS_NAME).is_file():
        raise PipelineError(pack / FOLDS_NAME, "missing from the pack (rebuild it with `pipeline pack`)")
    check_output(folds_path)
    with staging_dir(cache_root, CACHE_MARKER, is_ours=is_cache_root) as tmp:
        for p in pack.iterdir():
            if p.is_file() and p.name not in (PACK_MARKER, FOLDS_NAME):
                shutil.copy2(p, tmp / p.name)
        for name, split in info["splits"].items():
            src, dst = pack / name, tmp / name
            for f in (JPEGS, OFFSETS, CACHE_MARKER):
                if not (src / f).is_file():
                    raise PipelineError(src / f, "missing from the pack (rebuild it with `pipeline pack`)")
            offsets = np.load(src / OFFSETS, allow_pickle=False)
            data = (src / JPEGS).read_bytes()
            if offsets.ndim != 1 or len(offsets) != split["faces"] + 1 or offsets[0] != 0 \
                    or offsets[-1] != len(data) or (np.diff(offsets) <= 0).any():
                raise PipelineError(src / OFFSETS, f"offsets do not fit {src / JPEGS} ({split['faces']} faces, "
                                                   f"{len(data)} bytes)")
            dst.mkdir()
            write_npy(dst / FACES, decode_faces(data, offsets, int(split["side"]), src / JPEGS))
            for p in sorted(src.iterdir()):
                if p.is_file() and p.name not in (JPEGS, OFFSETS, CACHE_MARKER):
                    shutil.copy2(p, dst / p.name)
            shutil.copy2(src / CACHE_MARKER, dst / CACHE_MARKER)  # last: it marks the split complete
    write_bytes(folds_path, (pack / FOLDS_NAME).read_bytes())
    read_folds(Path(folds_path), load_cache(Path(cache_root) / "train").meta, Path(cache_root) / "train")
    log.info("unpacked %s: %s -> %s", pack, ", ".join(f"{n} {s['faces']} faces" for n, s in info["splits"].items()),
             cache_root)
    return info
