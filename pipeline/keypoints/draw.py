"""The drawing kit shared by the picture commands (show, heatmaps, filters, predict-image,
morph): part colours, sub-pixel points, lines and boxes, labels, contact sheets and the
atomic PNG writer. Images are RGB uint8 in memory (docs/design.md) and converted to BGR
only when written."""

from __future__ import annotations

import math
from typing import Sequence

import cv2
import numpy as np

from pipeline.keypoints.geometry import box_corners

# one colour per face part (RGB), in the order of schema.groups
PART_COLORS = [(255, 200, 0), (0, 200, 255), (255, 90, 200), (80, 255, 80), (255, 80, 80), (160, 120, 255),
               (255, 255, 255), (255, 160, 60)]
TRUTH_COLOR = (40, 230, 40)
PRED_COLOR = (255, 50, 50)
BOX_COLOR = (255, 230, 0)
SHEET_BG = (24, 24, 24)
HEADER_H = 20
GAP = 2
FONT = cv2.FONT_HERSHEY_SIMPLEX


def point_colors(schema, k: int | None = None) -> list[tuple[int, int, int]]:
    """RGB colour of each keypoint by face part (schema.groups); one colour without groups."""
    k = schema.k if k is None else k
    colors = [PART_COLORS[0]] * k
    for g, idx in enumerate(getattr(schema, "groups", {}).values()):
        for i in idx:
            if i < k:
                colors[i] = PART_COLORS[g % len(PART_COLORS)]
    return colors


def _fix(v: float) -> int:
    return int(round(float(v) * 16))  # 4 fractional bits (shift=4): sub-pixel drawing


def draw_points(img: np.ndarray, pts: np.ndarray, colors, radius: float = 1.5) -> np.ndarray:
    """Filled anti-aliased dots at (K, 2) pixel-centre coordinates, in place. `colors` is one
    colour or one per point. Non-finite points are skipped."""
    pts = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
    if isinstance(colors, tuple):
        colors = [colors] * len(pts)
    r = max(1, _fix(radius))
    for (x, y), c in zip(pts, colors):
        if np.isfinite(x) and np.isfinite(y):
            cv2.circle(img, (_fix(x), _fix(y)), r, tuple(int(v) for v in c), -1, cv2.LINE_AA, shift=4)
    return img


def draw_lines(img: np.ndarray, a: np.ndarray, b: np.ndarray, color, thickness: int = 1) -> np.ndarray:
    for p, q in zip(np.asarray(a).reshape(-1, 2), np.asarray(b).reshape(-1, 2)):
        if np.all(np.isfinite(p)) and np.all(np.isfinite(q)):
            cv2.line(img, (_fix(p[0]), _fix(p[1])), (_fix(q[0]), _fix(q[1])), color, thickness, cv2.LINE_AA, shift=4)
    return img


def draw_box(img: np.ndarray, corners: np.ndarray, color=BOX_COLOR, thickness: int = 1) -> np.ndarray:
    """Rectangle from two pixel-centre corners [[x0, y0], [x1, y1]], in place."""
    (x0, y0), (x1, y1) = np.asarray(corners, dtype=np.float64)
    cv2.rectangle(img, (_fix(x0), _fix(y0)), (_fix(x1), _fix(y1)), color, thickness, cv2.LINE_AA, shift=4)
    return img


def fit_scale(text: str, scale: float, max_width: int, min_scale: float = 0.25) -> float:
    """The largest font scale <= `scale` (down to min_scale) at which `text` fits max_width px."""
    while scale > min_scale and cv2.getTextSize(text, FONT, scale, 1)[0][0] > max_width:
        scale = max(min_scale, scale - 0.02)
    return scale


def put_label(img: np.ndarray, text: str, org: tuple[int, int] = (2, 2), scale: float = 0.35,
              color=(255, 255, 255), bg=(0, 0, 0)) -> np.ndarray:
    """Text with a filled background box; `org` is the box's top-left corner; the font
    shrinks (to a point) to fit the image width. In place."""
    scale = fit_scale(text, scale, img.shape[1] - org[0] - 4)
    (tw, th), base = cv2.getTextSize(text, FONT, scale, 1)
    x, y = org
    cv2.rectangle(img, (x, y), (x + tw + 3, y + th + base + 2), bg, -1)
    cv2.putText(img, text, (x + 1, y + th + 1), FONT, scale, color, 1, cv2.LINE_AA)
    return img


def sheet_size(n: int, tile: int | tuple[int, int], cols: int, title: bool) -> tuple[int, int]:
    """(height, width) of `contact_sheet` for n tiles."""
    th, tw = (tile, tile) if isinstance(tile, int) else tile
    rows = max(1, math.ceil(n / cols))
    return (HEADER_H if title else 0) + rows * th + (rows + 1) * GAP, cols * tw + (cols + 1) * GAP


def contact_sheet(tiles: Sequence[np.ndarray], cols: int | None = None, title: str | None = None,
                  bg=SHEET_BG) -> np.ndarray:
    """Equal-size RGB tiles in a grid (row-major), GAP px apart, with an optional title strip."""
    if not len(tiles):
        raise ValueError("contact_sheet: no tiles")
    th, tw = tiles[0].shape[:2]
    cols = cols or math.ceil(math.sqrt(len(tiles)))
    h, w = sheet_size(len(tiles), (th, tw), cols, title is not None)
    sheet = np.empty((h, w, 3), dtype=np.uint8)
    sheet[:] = bg
    y0 = HEADER_H if title is not None else 0
    if title is not None:
        scale = fit_scale(title, 0.4, w - 2 * GAP - 2)
        cv2.putText(sheet, title, (GAP + 1, HEADER_H - 6), FONT, scale, (235, 235, 235), 1, cv2.LINE_AA)
    for i, t in enumerate(tiles):
        r, c = divmod(i, cols)
        y, x = y0 + GAP + r * (th + GAP), GAP + c * (tw + GAP)
        sheet[y:y + th, x:x + tw] = t
    return sheet


def draw_faces(image: np.ndarray, faces, schema) -> np.ndarray:
    """A copy of the image with each face's box, keypoints (coloured by part) and label:
    faces = [(label, box [left, top, w, h], (K, 2) points)]; line widths follow the box size."""
    out = image.copy()
    colors = point_colors(schema)
    for label, box, pts in faces:
        side = max(box[2], box[3])
        draw_box(out, box_corners(box), thickness=max(1, round(side / 150)))
        draw_points(out, pts, colors, radius=max(1.2, side / 90))
        put_label(out, str(label), (max(0, int(box[0])), max(0, int(box[1]) - 14)))
    return out
