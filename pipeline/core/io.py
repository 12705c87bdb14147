"""Atomic writes: every output goes to a temp file in the same folder, then is renamed.

A crash (or kill -9) mid-write leaves the previous file, or none, never half a file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds.

    `suffix` keeps an extension on the temp name for writers that insist on one
    (np.save appends .npy; the temp name always ends in .tmp, so encode images with
    cv2.imencode and write the bytes rather than cv2.imwrite on the temp path).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix + ".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual mode
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def remove_stale_temps(folder: str | os.PathLike, names) -> list[Path]:
    """Delete the temp files that `atomic_path` left for `names` in `folder` when its
    process was killed mid-write (kill -9 skips the cleanup). Call it only where no other
    process writes those names at the same time (e.g. a stage's own output folder)."""
    removed = []
    for name in names:
        for p in Path(folder).glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def write_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, array)


def torch_save(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        # imported here: the stages without a network (demo-data, crop, folds, submit,
        # evaluate) then start without torch's import (about 1.5 s)
        import torch

        torch.save(obj, tmp)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


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


def write_bytes(path: str | os.PathLike, data: bytes, suffix: str = "") -> Path:
    """Write bytes atomically (temp file + rename); `suffix` as in atomic_path."""
    path = Path(path)
    with atomic_path(path, suffix=suffix) as tmp:
        tmp.write_bytes(data)
    return path
