"""Automatic face morphing with predicted keypoints, written as an animated GIF.

Each face is framed the same way (a square around its box), the model's keypoints plus
the frame's corners and edge midpoints are triangulated once (Delaunay, cv2.Subdiv2D, on
the average of the two shapes), and frame t in [0, 1] warps every triangle of A and of B
onto the shape (1 - t) A + t B (cv2.getAffineTransform + warpAffine inside a triangle
mask) and cross-dissolves the two.

The GIF (and MP4) writers are in pipeline/formats/images.py."""

from __future__ import annotations

import logging
from pathlib import Path

import click
import cv2
import numpy as np

from pipeline.core.config import config_options
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output
from pipeline.core.params_schema import Config
from pipeline.core.paths import CACHE_DIR
from pipeline.formats.cache import dataset_root
from pipeline.formats.images import write_gif
from pipeline.formats.video import write_mp4
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.options import model_options
from pipeline.inference.photos import PhotoReader, cache_face, face_in_photo, is_index, meta_box
from pipeline.keypoints.geometry import crop_face, to_crop

log = logging.getLogger(__name__)


def border_points(size: int) -> np.ndarray:
    """The frame's 4 corners and 4 edge midpoints (pixel-centre coordinates), (8, 2)."""
    e, m = size - 1, (size - 1) / 2
    return np.array([[0, 0], [m, 0], [e, 0], [e, m], [e, e], [m, e], [0, e], [0, m]], dtype=np.float64)


def delaunay(points: np.ndarray, size: int) -> np.ndarray:
    """Delaunay triangles (T, 3) as indices into `points` (clipped into the frame)."""
    pts = np.clip(np.asarray(points, dtype=np.float64), 0, size - 1)
    subdiv = cv2.Subdiv2D((0, 0, size, size))
    for x, y in pts:
        subdiv.insert((float(x), float(y)))
    found = []
    for t in np.asarray(subdiv.getTriangleList()).reshape(-1, 3, 2):
        if np.any(t < -0.5) or np.any(t > size - 0.5):
            continue  # a triangle on Subdiv2D's virtual outer vertices
        d = np.linalg.norm(pts[None, :, :] - t[:, None, :], axis=-1)  # (3, P)
        idx = d.argmin(1)
        if d[np.arange(3), idx].max() < 1e-2 and len(set(idx.tolist())) == 3:
            found.append(sorted(idx.tolist()))
    tris = np.unique(np.array(found, dtype=np.int64).reshape(-1, 3), axis=0)
    if not len(tris):
        raise PipelineError(None, "Delaunay triangulation of the keypoints gave no triangle")
    return tris


def _area(t: np.ndarray) -> float:
    return 0.5 * abs((t[1, 0] - t[0, 0]) * (t[2, 1] - t[0, 1]) - (t[2, 0] - t[0, 0]) * (t[1, 1] - t[0, 1]))


def triangle_labels(dst: np.ndarray, tris: np.ndarray, size: int) -> np.ndarray:
    """(size, size) int32: which triangle of `dst` each pixel lies in (-1: none); every
    pixel belongs to one triangle, so masked warps tile the frame without seams."""
    lab = np.full((size, size), -1, dtype=np.int32)
    for i, t in enumerate(tris):
        cv2.fillConvexPoly(lab, np.round(dst[t] * 16).astype(np.int32), int(i), cv2.LINE_8, 4)
    return lab


def warp_to(src: np.ndarray, src_pts: np.ndarray, dst_pts: np.ndarray, tris: np.ndarray,
            labels: np.ndarray) -> np.ndarray:
    """Warp float image `src` so that its points src_pts move to dst_pts: one affine per
    triangle (cv2.getAffineTransform on the triangle's corners, cv2.warpAffine of its
    bounding rectangle), kept inside the triangle's mask. Pixels of no triangle stay src."""
    size = src.shape[0]
    out = src.copy()
    for i, t in enumerate(tris):
        s, d = src_pts[t].astype(np.float32), dst_pts[t].astype(np.float32)
        if _area(d) < 1e-3 or _area(s) < 1e-3:
            continue
        x0, y0, w, h = cv2.boundingRect(np.round(d).astype(np.int32))
        x0, y0 = max(0, x0 - 1), max(0, y0 - 1)
        x1, y1 = min(size, x0 + w + 2), min(size, y0 + h + 2)
        mask = labels[y0:y1, x0:x1] == i
        if not mask.any():
            continue
        # affine from src to the rectangle's own coordinates; warp the whole source
        m = cv2.getAffineTransform(s, d - np.array([x0, y0], dtype=np.float32))
        patch = cv2.warpAffine(src, m, (x1 - x0, y1 - y0), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_REFLECT_101)
        out[y0:y1, x0:x1][mask] = patch[mask]
    return out


def morph_frames(a: np.ndarray, b: np.ndarray, pa: np.ndarray, pb: np.ndarray, n_frames: int) -> list[np.ndarray]:
    """n_frames RGB uint8 frames from face a (t = 0) to face b (t = 1). a, b: (S, S, 3)
    uint8; pa, pb: (K, 2) keypoints in their pixels."""
    size = a.shape[0]
    if a.shape != b.shape or a.shape[0] != a.shape[1]:
        raise PipelineError(None, f"morph: faces must be equal squares, got {a.shape} and {b.shape}")
    border = border_points(size)
    pa = np.clip(np.vstack([pa, border]), 0, size - 1)
    pb = np.clip(np.vstack([pb, border]), 0, size - 1)
    ok = np.isfinite(pa).all(1) & np.isfinite(pb).all(1)
    pa, pb = pa[ok], pb[ok]
    tris = delaunay((pa + pb) / 2, size)
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    frames = []
    for t in np.linspace(0.0, 1.0, n_frames) if n_frames > 1 else [0.0]:
        pt = (1 - t) * pa + t * pb
        labels = triangle_labels(pt, tris, size)
        wa = warp_to(fa, pa, pt, tris, labels) if t < 1 else None
        wb = warp_to(fb, pb, pt, tris, labels) if t > 0 else None
        f = wa if wb is None else wb if wa is None else (1 - t) * wa + t * wb
        assert f is not None  # t < 1 or t > 0
        frames.append(np.clip(np.round(f), 0, 255).astype(np.uint8))
    return frames


def morph_face(source: str, landmarker: Landmarker, cfg: Config, cache_dir: str, split: str, size: int,
               expand: float, data_dir: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    """(face frame (size, size, 3) RGB, its keypoints (K, 2) frame px, description) for a
    photo path (largest detected face) or an index into the cache split (its photo and box)."""
    if is_index(source):
        cache, i = cache_face(cache_dir, split, int(source))
        row = cache.meta.iloc[i]
        root = dataset_root(cfg.data, data_dir)
        image = PhotoReader(root, cache.info.get("xml", root))(row.image)
        box, what = np.array(meta_box(row)), f"{split} face {i}"
    else:
        image, box = face_in_photo(source)
        what = Path(source).name
    pts = landmarker.predict(image, box[None])[0]
    face, a = crop_face(image, box, expand, size)
    return face, to_crop(pts[None], a[None])[0], what


def run_morph(a: str, b: str, checkpoints, out: str, n_frames: int, fps: float, size: int, expand: float,
              cache: str, split: str, data_dir: str | None, mp4: bool, device: str, backend: str,
              cfg: Config) -> list[Path]:
    """Frames morphing face A into face B -> GIF (and MP4); returns the files written."""
    if n_frames < 2:
        raise PipelineError(None, f"--frames must be >= 2, got {n_frames}")
    if size < 16 or expand <= 0 or fps <= 0:
        raise PipelineError(None, "--size must be >= 16, --expand and --fps > 0")
    landmarker = Landmarker.from_checkpoints(checkpoints, backend=backend, device=resolve_device(device), tta="flip")
    fa, pa, wa = morph_face(a, landmarker, cfg, cache, split, size, expand, data_dir)
    fb, pb, wb = morph_face(b, landmarker, cfg, cache, split, size, expand, data_dir)
    frames = morph_frames(fa, fb, pa, pb, n_frames)
    written = [write_gif(out, frames, delay_cs=max(2, round(100 / fps)))]
    log.info("morph %s -> %s: %d frames of %dx%d -> %s", wa, wb, len(frames), size, size, written[0])
    if mp4:
        written.append(write_mp4(Path(out).with_suffix(".mp4"), frames, fps))
    return written


@click.command("morph")
@click.argument("a")
@click.argument("b")
@model_options
@click.option("--out", default="morph.gif", show_default=True, help="animated GIF")
@click.option("--frames", "n_frames", default=20, show_default=True, help="frames from A to B")
@click.option("--fps", default=10.0, show_default=True)
@click.option("--size", default=192, show_default=True, help="frame side in pixels")
@click.option("--expand", default=1.6, show_default=True, help="frame side / face box side")
@click.option("--cache", default=CACHE_DIR, show_default=True, help="face cache, for integer A / B")
@click.option("--split", type=click.Choice(["test", "train"]), default="test", show_default=True)
@click.option("--data-dir", default=None, help="dataset folder with the photos [default: params data.dir]")
@click.option("--mp4", is_flag=True, help="also write the same frames as <out>.mp4 (cv2.VideoWriter, mp4v)")
@config_options
def morph_cmd(a, b, checkpoints, out, n_frames, fps, size, expand, cache, split, data_dir, mp4, device, backend, cfg):
    """Morph face A into face B (photo paths or test-cache indices) as an animated GIF."""

    check_output(out)
    for path in run_morph(a, b, checkpoints, out, n_frames, fps, size, expand, cache, split, data_dir, mp4, device,
                          backend, cfg):
        click.echo(str(path))
