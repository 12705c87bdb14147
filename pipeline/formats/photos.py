"""Photos as the predictor takes them: a path, or an array of any common image kind, turned
into one RGB uint8 (H, W, 3) array (`as_photo`), or one error line naming what was given."""

from __future__ import annotations

import logging
import os
from typing import Any, Union

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.formats.annotations import read_image

log = logging.getLogger(__name__)

# what `as_photo` takes: an image array or a photo path
Photo = Union[np.ndarray, str, os.PathLike]


def as_photo(image: Any, where: str = "image") -> np.ndarray:
    """A photo for the predictor: (H, W, 3) RGB uint8 from a photo path (`read_image`) or an
    array, converted as a photo file of that kind is read: grey (H, W) or (H, W, 1) replicated
    to RGB, grey + alpha (H, W, 2) and RGBA (H, W, 4) without their alpha, 16-bit scaled to
    8-bit (/ 257), any other integer or float array read on the 0-255 scale (rounded). What is
    none of these (bytes, a float image outside 0-255, another shape or dtype) is one
    PipelineError naming what was given, at `where`."""
    if isinstance(image, (str, os.PathLike)):
        return read_image(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        raise PipelineError(None, f"got {type(image).__name__} ({len(image)} bytes, an encoded file?): pass a "
                                  "decoded RGB array or the photo's path", where)
    if not isinstance(image, np.ndarray):
        what = "None" if image is None else type(image).__name__
        try:
            image = np.asarray(image)
        except (ValueError, TypeError):
            raise PipelineError(None, f"got {what}, expected an RGB image array or a photo path", where) from None
        if image.dtype == object or image.ndim < 2:
            raise PipelineError(None, f"got {what}, expected an RGB image array or a photo path", where)
    shape, dtype = tuple(image.shape), image.dtype
    if image.ndim not in (2, 3) or (image.ndim == 3 and shape[2] not in (1, 2, 3, 4)) or 0 in shape:
        raise PipelineError(None, f"got an array of shape {shape}, expected an image (H, W), (H, W, 1), "
                                  "(H, W, 3) RGB or (H, W, 4) RGBA", where)
    if dtype == np.uint16:
        image = (image / 257.0).round().astype(np.uint8)
    elif dtype != np.uint8:
        if dtype.kind not in "iuf":
            raise PipelineError(None, f"got an array of dtype {dtype}, expected uint8 (or numbers in 0-255)", where)
        lo, hi = (float(image.min()), float(image.max())) if dtype.kind != "f" or np.isfinite(image).all() \
            else (float("nan"), float("nan"))
        if not 0 <= lo <= hi <= 255:
            raise PipelineError(None, f"got a {dtype} image with values outside 0-255 ({lo:g} to {hi:g}); "
                                      "scale it to 0-255 (uint8 RGB)", where)
        if dtype.kind == "f" and 0 < hi <= 1:
            log.warning("%s: a %s image with values within 0-1, read on the 0-255 scale (nearly black); "
                        "multiply it by 255 if it is a 0-1 image", where, dtype)
        image = np.rint(image).astype(np.uint8)
    if image.ndim == 2:
        image = image[:, :, None]
    if image.shape[2] in (1, 2):  # grey, grey + alpha
        return np.ascontiguousarray(np.repeat(image[:, :, :1], 3, axis=2))
    return np.ascontiguousarray(image[:, :, :3])  # RGB, or RGBA without its alpha
