"""The competition CSV: its writer and its strict reader (submissions and solutions).

Layout: header `Id,Predicted`, one row per coordinate, image-major in test-XML order,
then keypoint-major, x before y, Ids from 0: the row of face i, point k, coordinate c
(0 = x, 1 = y) has Id `(i * K + k) * 2 + c`.

The reader is shared with `pipeline score` / `pipeline evaluate`: every malformed file
is rejected with one line naming the file and the reason (exit 2).
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file, write_text

HEADER = ("Id", "Predicted")


# value columns accepted in a solution (truth) file; extra columns (e.g. Usage) ignored
SOLUTION_VALUE_NAMES = ("Predicted", "Expected")


FLOAT_FORMAT = "{:.6f}"


_INT_RE = re.compile(r"[+-]?\d+", re.ASCII)


_FLOAT_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


_NONFINITE = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


def validate_coords(coords, source: str | os.PathLike | None = None, n_faces: int | None = None,
                    k: int | None = None) -> np.ndarray:
    """Check an (N, K, 2) coordinate array; return it as float64."""
    try:
        arr = np.asarray(coords, dtype=np.float64)
    except (TypeError, ValueError):
        raise PipelineError(source, "coordinates are not a numeric array") from None
    if arr.ndim != 3 or arr.shape[2] != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise PipelineError(source, f"coordinates must have shape (N, K, 2) with N, K >= 1, got {arr.shape}")
    if n_faces is not None and arr.shape[0] != n_faces:
        raise PipelineError(source, f"{arr.shape[0]} faces predicted, expected {n_faces}")
    if k is not None and arr.shape[1] != k:
        raise PipelineError(source, f"{arr.shape[1]} keypoints per face, expected {k}")
    bad = ~np.isfinite(arr)
    if bad.any():
        i, kk, c = (int(v) for v in np.argwhere(bad)[0])
        raise PipelineError(source, f"{int(bad.sum())} non-finite coordinate(s) (NaN/inf), first at face {i} "
                                    f"point {kk} {'xy'[c]}")
    return arr


def format_submission(coords: np.ndarray, float_format: str = FLOAT_FORMAT) -> str:
    """The CSV text of validated (N, K, 2) coordinates."""
    flat = coords.reshape(-1)  # C order == image-major, keypoint-major, x then y
    lines = [",".join(HEADER)]
    lines += [f"{i},{float_format.format(v)}" for i, v in enumerate(flat.tolist())]
    return "\n".join(lines) + "\n"


def write_submission(path: str | os.PathLike, coords, n_faces: int | None = None,
                     k: int | None = None) -> Path:
    """Validate (N, K, 2) coordinates and write the competition CSV atomically.

    Nothing is written (and no temp file is left) when validation fails."""
    path = Path(path)
    arr = validate_coords(coords, path, n_faces=n_faces, k=k)
    text = format_submission(arr)
    n_rows = text.count("\n") - 1
    if n_rows != arr.size:
        raise PipelineError(path, f"internal error: {n_rows} rows formatted for {arr.size} coordinates")
    write_text(path, text)
    return path


def _problem(path, text: str):
    return PipelineError(path, text.replace("\n", " "))


def _short(field: str, limit: int = 30) -> str:
    return repr(field if len(field) <= limit else field[:limit] + "...")


def read_submission(path: str | os.PathLike, n_rows: int | None = None,
                    value_names: Sequence[str] = (HEADER[1],), extra_columns: bool = False) -> np.ndarray:
    """Values of a competition CSV, sorted by Id: float64 array (rows,).

    Rejects (PipelineError naming the file): a missing/empty/non-text file, a wrong
    header, rows with the wrong number of fields, non-numeric Ids or values, NaN/inf,
    duplicate or missing Ids (Ids must be exactly 0..R-1), and R != n_rows when given.
    `value_names`/`extra_columns` relax the header for solution files."""
    path = input_file(path, "file not found", "a CSV file")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise PipelineError(path, "not a UTF-8 text file") from None
    if not text.strip():
        raise PipelineError(path, "empty file")
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except csv.Error as e:
        raise _problem(path, f"line 1: unreadable CSV ({e})") from None
    want = f"{HEADER[0]},{'|'.join(value_names)}"
    if (len(header) < 2 or header[0] != HEADER[0] or header[1] not in value_names
            or (len(header) > 2 and not extra_columns)):
        raise _problem(path, f"wrong header {','.join(header)[:60]!r}, expected {want!r}")
    width = len(header)
    ids: list[int] = []
    values: list[float] = []
    lines: list[int] = []
    try:
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            if len(row) != width:
                raise _problem(path, f"line {line}: expected {width} fields, got {len(row)}")
            id_s, val_s = row[0].strip(), row[1].strip()
            if not _INT_RE.fullmatch(id_s):
                raise _problem(path, f"line {line}: non-numeric Id {_short(id_s)}")
            if len(id_s.lstrip("+-").lstrip("0")) > 18:  # 10**18 and up: past any submission, near int64's end
                raise _problem(path, f"line {line}: Id {_short(id_s)} out of range")
            if _FLOAT_RE.fullmatch(val_s):
                val = float(val_s)
                if not math.isfinite(val):
                    raise _problem(path, f"line {line}: value {_short(val_s)} overflows (inf)")
            elif val_s.lower() in _NONFINITE:
                raise _problem(path, f"line {line}: non-finite value {_short(val_s)} (NaN/inf)")
            else:
                raise _problem(path, f"line {line}: non-numeric value {_short(val_s)}")
            ids.append(int(id_s))
            values.append(val)
            lines.append(line)
    except csv.Error as e:
        raise _problem(path, f"line {reader.line_num}: unreadable CSV ({e})") from None
    if not ids:
        raise PipelineError(path, "no data rows after the header")
    id_arr = np.asarray(ids, dtype=np.int64)
    order = np.argsort(id_arr, kind="stable")
    sorted_ids = id_arr[order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(dup):
        first_dup = int(dup[0])
        a, b = sorted((lines[order[first_dup]], lines[order[first_dup + 1]]))
        raise PipelineError(path, f"duplicate Id {int(sorted_ids[dup[0]])} (lines {a} and {b}); "
                                  f"{len(dup)} duplicate row(s) in all")
    r = len(sorted_ids)
    expected = np.arange(r)
    wrong = np.flatnonzero(sorted_ids != expected)
    if len(wrong):
        first = int(wrong[0])
        if sorted_ids[0] < 0:
            raise PipelineError(path, f"negative Id {int(sorted_ids[0])}; Ids must be 0..{r - 1}")
        # sorted, unique and >= 0: Id `first` is the first one missing, and every Id above
        # r - 1 leaves one more gap below it (counted, not listed: an Id may be 10**18)
        n_missing = int(sorted_ids[-1]) + 1 - r
        more = f" (and {n_missing - 1} more)" if n_missing > 1 else ""
        raise PipelineError(path, f"missing Id {first}{more}; Ids must be 0..{r - 1} for {r} rows")
    if n_rows is not None and r != n_rows:
        raise PipelineError(path, f"{r} rows, expected {n_rows}")
    return np.asarray(values, dtype=np.float64)[order]


def read_solution(path: str | os.PathLike, n_rows: int | None = None) -> np.ndarray:
    """A truth file: `Id,Predicted` or `Id,Expected`, extra columns (Usage) ignored."""
    return read_submission(path, n_rows=n_rows, value_names=SOLUTION_VALUE_NAMES, extra_columns=True)
