"""Image and animation files the tools write: PNG (cv2.imencode) and animated GIF (Pillow;
MP4 is pipeline/formats/video.py). Every writer publishes atomically (temp file, then rename)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
from PIL import Image

from pipeline.core.errors import PipelineError
from pipeline.core.io import write_bytes


def encode_gif(frames: Sequence[np.ndarray], delay_cs: int = 8, loop: int = 0) -> bytes:
    """GIF89a bytes of equal-size RGB uint8 (H, W, 3) frames: each frame quantised to a
    palette of its own (Pillow's fast octree), `delay_cs` per frame in 1/100 s, `loop` 0 =
    forever. A frame equal to the one before it is merged into it (their delays add up)."""
    if not len(frames):
        raise ValueError("encode_gif: no frames")
    h, w = np.asarray(frames[0]).shape[:2]
    images = []
    for f in frames:
        f = np.asarray(f, dtype=np.uint8)
        if f.shape != (h, w, 3):
            raise ValueError(f"encode_gif: frame of shape {f.shape}, expected ({h}, {w}, 3)")
        images.append(Image.fromarray(np.ascontiguousarray(f)).quantize(256, method=Image.Quantize.FASTOCTREE))
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=10 * int(delay_cs),
                   loop=int(loop))
    return buf.getvalue()


def write_gif(path: str | os.PathLike, frames: Sequence[np.ndarray], delay_cs: int = 8, loop: int = 0) -> Path:
    """An animated GIF of RGB frames, written to a temp file and renamed."""
    return write_bytes(path, encode_gif(frames, delay_cs, loop), ".gif")


def write_png(path: str | os.PathLike, rgb: np.ndarray) -> Path:
    """RGB uint8 -> PNG, written to a temp file and renamed."""
    # encoded in memory: the temp name atomic_path makes ends in '.tmp', and cv2.imwrite
    # picks its codec by the extension
    ok, buf = cv2.imencode(".png", cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if not ok:
        raise PipelineError(path, "cannot encode PNG")
    return write_bytes(path, buf.tobytes(), ".png")
