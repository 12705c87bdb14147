"""Image and animation files the tools write: PNG (cv2.imencode) and animated GIF (MP4 is
pipeline/formats/video.py). Every writer publishes atomically (temp file, then rename).

OpenCV writes no GIF, so this module has a small GIF89a encoder: a fixed 6x6x6 colour cube
with 4x4 ordered (Bayer) dithering, LZW compression with variable code widths and a clear
code when the table is full, and the NETSCAPE2.0 loop extension."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import write_bytes

_LEVELS = np.arange(6) * 51  # 0, 51, ..., 255
# palette index r * 36 + g * 6 + b, padded with black to the 256 entries of an 8-bit table
CUBE_PALETTE = np.zeros((256, 3), dtype=np.uint8)
CUBE_PALETTE[:216] = np.stack(np.meshgrid(_LEVELS, _LEVELS, _LEVELS, indexing="ij"), -1).reshape(-1, 3)
_BAYER4 = np.array([[0, 8, 2, 10], [12, 4, 14, 6], [3, 11, 1, 9], [15, 7, 13, 5]], dtype=np.float32)


def quantize_cube(rgb: np.ndarray, dither: bool = True) -> np.ndarray:
    """RGB uint8 (H, W, 3) -> CUBE_PALETTE indices uint8 (H, W). With ordered dithering each
    channel level is floor(c * 5 / 255 + t), t the 4x4 Bayer threshold in (0, 1) of the
    pixel, so colours on the cube (multiples of 51) come out exactly."""
    v = np.asarray(rgb, dtype=np.float32) * (5.0 / 255.0)
    h, w = v.shape[:2]
    if dither:
        t = (np.tile(_BAYER4, (h // 4 + 1, w // 4 + 1))[:h, :w] + 0.5) / 16.0
        q = np.floor(v + t[..., None])
    else:
        q = np.floor(v + 0.5)
    q = np.clip(q, 0, 5).astype(np.uint8)
    return (q[..., 0] * 36 + q[..., 1] * 6 + q[..., 2]).astype(np.uint8)


def lzw_encode(indices: np.ndarray | bytes, min_code_size: int = 8) -> bytes:
    """GIF LZW: clear code first, codes packed LSB-first, the code width grows when the
    next code to assign no longer fits (up to 12 bits), a clear code and a fresh table
    when code 4095 has been assigned, then the end-of-information code."""
    data = bytes(np.asarray(indices, dtype=np.uint8).reshape(-1)) if not isinstance(indices, bytes) else indices
    clear, eoi = 1 << min_code_size, (1 << min_code_size) + 1
    out = bytearray()
    acc = nbits = 0

    def emit(code: int, width: int) -> None:
        nonlocal acc, nbits
        acc |= code << nbits
        nbits += width
        while nbits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            nbits -= 8

    table: dict[int, int] = {}  # (prefix code << 8) | byte -> code
    width, next_code = min_code_size + 1, eoi + 1
    emit(clear, width)
    if data:
        prefix = data[0]
        for b in data[1:]:
            key = (prefix << 8) | b
            code = table.get(key)
            if code is not None:
                prefix = code
                continue
            emit(prefix, width)
            table[key] = next_code
            next_code += 1
            # the decoder, one code behind, widens after it reads this code: so do we
            if next_code - 1 == 1 << width and width < 12:
                width += 1
            if next_code == 4096:
                emit(clear, width)
                width, next_code, table = min_code_size + 1, eoi + 1, {}
            prefix = b
        emit(prefix, width)
        # the decoder counts this last code as well before it reads the end code
        next_code += 1
        if next_code - 1 == 1 << width and width < 12:
            width += 1
    emit(eoi, width)
    if nbits:
        out.append(acc & 0xFF)
    return bytes(out)


def _sub_blocks(data: bytes) -> bytes:
    chunks = [bytes([len(data[i:i + 255])]) + data[i:i + 255] for i in range(0, len(data), 255)]
    return b"".join(chunks) + b"\x00"


def encode_gif(frames: Sequence[np.ndarray], delay_cs: int = 8, loop: int = 0,
               palette: np.ndarray | None = None, dither: bool = True) -> bytes:
    """GIF89a bytes of equal-size frames: RGB uint8 (H, W, 3) frames are quantised to the
    colour cube; uint8 (H, W) frames are taken as indices into `palette` (256 x 3, default
    the cube). `delay_cs` per frame in 1/100 s; `loop` 0 = forever."""
    if not len(frames):
        raise ValueError("encode_gif: no frames")
    pal = CUBE_PALETTE if palette is None else np.asarray(palette, dtype=np.uint8)
    if pal.shape != (256, 3):
        raise ValueError(f"encode_gif: palette must be (256, 3), got {pal.shape}")
    h, w = frames[0].shape[:2]
    if not (0 < w < 65536 and 0 < h < 65536):
        raise ValueError(f"encode_gif: bad frame size {w}x{h}")
    buf = bytearray(b"GIF89a")
    # logical screen: global colour table of 2^(7+1) entries, 8-bit colour resolution
    buf += struct.pack("<HHBBB", w, h, 0xF7, 0, 0)
    buf += pal.tobytes()
    # NETSCAPE2.0 application extension: loop count
    buf += b"\x21\xFF\x0BNETSCAPE2.0\x03\x01" + struct.pack("<H", loop) + b"\x00"
    for f in frames:
        f = np.asarray(f)
        if f.shape[:2] != (h, w):
            raise ValueError(f"encode_gif: frame of size {f.shape[1]}x{f.shape[0]}, expected {w}x{h}")
        idx = quantize_cube(f, dither) if f.ndim == 3 else f.astype(np.uint8)
        # graphic control extension: disposal 1 (leave in place), delay, no transparency
        buf += b"\x21\xF9\x04" + struct.pack("<BHB", 0x04, int(delay_cs), 0) + b"\x00"
        # image descriptor: full frame, no local colour table, not interlaced
        buf += b"\x2C" + struct.pack("<HHHHB", 0, 0, w, h, 0)
        buf += b"\x08" + _sub_blocks(lzw_encode(idx, 8))
    buf += b"\x3B"
    return bytes(buf)


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
