"""Atomic writes: every output goes to a temp file in the same folder, then is renamed.

A crash (or kill -9) mid-write leaves the previous file, or none, never half a file.
"""

from __future__ import annotations

import contextlib
import csv
import io
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

UMASK = os.umask(0)  # read once: os.umask can only be read by setting it
os.umask(UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds.

    `suffix` keeps an extension on the temp name for writers that insist on one
    (np.save appends .npy; the temp name always ends in .tmp, so encode images with
    cv2.imencode and write the bytes rather than cv2.imwrite on the temp path).
    """
    path = Path(path)
    made = [d for d in path.parents if not os.path.lexists(d)]  # folders a failed write removes again
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix + ".tmp")
        os.close(fd)
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600; outputs get the usual mode
    except OSError as e:
        _remove_empty(made)
        raise write_error(path, e) from None
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        _remove_empty(made)
        if isinstance(e, OSError):  # a full disk, a read-only or vanished folder: one line
            raise write_error(path, e) from None
        raise


def _remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (deepest first) while they are empty."""
    for d in folders:
        try:
            d.rmdir()
        except OSError:
            return


class WriteError(PipelineError):
    """An output could not be written (`reason`: the OS's word for why)."""

    def __init__(self, path: str | os.PathLike | None, reason: str):
        self.reason = reason
        super().__init__(path, f"cannot write ({reason})")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


def write_error(path: str | os.PathLike, e: OSError) -> WriteError:
    """The one-line error for an OS error while writing `path`."""
    return WriteError(path, e.strerror or type(e).__name__)


def _shown(text: str) -> str:
    return text.replace("\0", "\\0")  # a NUL byte would end the error line early on a terminal


def input_file(path: str | os.PathLike, missing: str, expected: str) -> Path:
    """`path` as a Path when it names an existing file, else the one line every reader gives:
    `missing` (e.g. "checkpoint not found") or "is a directory, expected <expected>"."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(path, missing)
    if path.is_dir():
        raise PipelineError(path, f"is a directory, expected {expected}")
    return path


def check_output(path: str | os.PathLike, folder: bool = False) -> Path:
    """Fail before any work when the output `path` (a file; a folder with folder=True)
    cannot be written: a name holding a NUL byte or too long, a path that exists as the
    other kind, a parent that is a file, or a location that is read-only or not writable.
    Raises PipelineError naming the path at fault; creates nothing."""
    text = os.fspath(path)
    if "\0" in text:
        raise PipelineError(_shown(text), "invalid name (holds a NUL byte)")
    path = Path(text)
    base = path  # the nearest existing path at or above `path`
    while not os.path.lexists(base) and base != base.parent:
        base = base.parent
    if base == path:
        if folder and not path.is_dir():
            raise PipelineError(path, "exists and is not a folder")
        if not folder and path.is_dir():
            raise PipelineError(path, "is a directory, expected a file")
    elif not base.is_dir():
        raise PipelineError(base, f"is a file, not a folder (cannot write {path})")
    limit = 255
    with contextlib.suppress(OSError, ValueError):
        limit = os.pathconf(base, "PC_NAME_MAX")
    for part in path.parts:
        if len(os.fsencode(part)) > limit:
            raise PipelineError(path, f"invalid name (a part is longer than {limit} bytes)")
    # the temp files and renames of the atomic writers happen in the parent; a folder
    # output that exists is also written into
    dirs = [path.parent if base == path else base] + ([path] if folder and base == path else [])
    for d in dirs:
        if not os.access(d, os.W_OK):
            rdonly = False
            with contextlib.suppress(OSError):
                rdonly = bool(os.statvfs(d).f_flag & os.ST_RDONLY)
            why = "read-only file system" if rdonly else "permission denied"
            raise PipelineError(d, f"not writable: {why}" + (f" (cannot write {path})" if d != path else ""))
    return path


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
    """torch.save, atomically. Serialised in memory first: given a file path, torch names the
    records inside its zip after that file, and the temp file's random name would make two
    saves of the same checkpoint differ (and DVC re-run every stage after it)."""
    # imported here: the stages without a network (demo-data, crop, folds, submit, evaluate)
    # then start without paying for torch's import
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    write_bytes(path, buf.getvalue())


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def check_replaceable(dest: str | os.PathLike, is_ours: Callable[[Path], bool], what: str) -> None:
    """Refuse (PipelineError naming `dest`: "exists and is not <what>; refusing to replace
    it") to replace an existing `dest` unless it is an empty folder or passes `is_ours`, so
    a mistyped output path never deletes someone's folder or file."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not is_ours(dest))):
        raise PipelineError(dest, f"exists and is not {what}; refusing to replace it")


@contextlib.contextmanager
def staging_dir(dest: str | os.PathLike, marker: str,
                is_ours: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield an empty temp folder beside `dest`; when the block succeeds it replaces `dest`
    as a whole (rename), else it is removed. An existing `dest` is only replaced when it is
    empty, holds `marker` or passes `is_ours` (i.e. it is an earlier output of the same
    stage), so a mistyped path never deletes someone's folder. Temp folders that a killed
    run (kill -9) left beside `dest` are removed first; a failed write (a full disk) is a
    PipelineError naming `dest`, and `dest` is left as it was."""
    dest = check_output(dest, folder=True)
    check_replaceable(dest, lambda d: (d / marker).exists() or bool(is_ours and is_ours(d)),
                      f"an output of this stage (no {marker})")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        stale = [*dest.parent.glob(f".{dest.name}.tmp-*"), *dest.parent.glob(f".{dest.name}.old-*")]
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    except OSError as e:
        raise write_error(dest, e) from None
    for p in stale:
        log.info("removing %s left by an interrupted run", p)
        shutil.rmtree(p, ignore_errors=True)
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes it private; the output is not
        publish_dir(tmp, dest)
    except (OSError, WriteError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        why = e.reason if isinstance(e, WriteError) else e.strerror or type(e).__name__
        raise PipelineError(dest, f"writing failed ({why}); left as it was") from None
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


def write_csv(path: str | os.PathLike, rows) -> Path:
    """Rows (lists of cells) as a CSV with "\n" line ends, written atomically."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return write_bytes(path, buf.getvalue().encode())


def read_csv_rows(path: Path) -> list[list[str]]:
    """Every row of a CSV file; an unreadable or undecodable file is a one-line error."""
    try:
        with open(path, newline="") as f:
            return list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise PipelineError(path, f"cannot read ({type(e).__name__})") from None
