"""Helpers the tests share (fixtures stay in conftest.py): import with `from helpers import ...`."""

import numpy as np

from pipeline.core.config import SECTIONS, is_speed_only, section_fields


def speed_only_keys() -> set[str]:
    """The params marked speed_only (pipeline/core/config.py), as 'section.key'."""
    return {f"{s}.{k}" for s in SECTIONS for k, f in section_fields(s).items() if is_speed_only(f)}


def read_gif(data: bytes):
    """An animated GIF read with Pillow: (width, height, loop, [(delay in 1/100 s, RGB (H, W, 3))])."""
    import io

    from PIL import Image

    im = Image.open(io.BytesIO(data))
    assert im.format == "GIF" and data[:6] == b"GIF89a"
    frames = []
    for i in range(im.n_frames):
        im.seek(i)
        frames.append((round(im.info["duration"] / 10), np.asarray(im.convert("RGB"))))
    return im.size[0], im.size[1], im.info.get("loop"), frames
