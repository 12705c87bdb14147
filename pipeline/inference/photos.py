"""Where the picture tools (heatmaps, morph, show) get a face: an integer index into a
cache split (its cached crop, or its original photo and box), or a photo path (the
largest face the installed detector finds)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.detection.detectors import locate_faces
from pipeline.formats.annotations import read_image, safe_image_path
from pipeline.formats.cache import load_cache


def is_index(text: str) -> bool:
    """An integer face index rather than a photo path (a file named '3' is a photo)."""
    return text.strip().lstrip("-").isdigit() and not Path(text).exists()


def cache_face(cache_dir: str | os.PathLike, split: str, index: int):
    """(the cache split, index) after checking the index is one of its faces."""
    cache = load_cache(Path(cache_dir) / split)
    if not 0 <= index < len(cache):
        raise PipelineError(Path(cache_dir) / split, f"face index {index} out of range (0..{len(cache) - 1})")
    return cache, index


def face_in_photo(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(photo RGB uint8, the largest detected face's box in the training convention)."""
    image = read_image(path)
    boxes, _ = locate_faces(image)
    if not len(boxes):
        raise PipelineError(path, "no face found in the photo")
    return image, boxes[0]


class PhotoReader:
    """Original photos of a cache split, decoded once each."""

    def __init__(self, root: str | os.PathLike, source: str | os.PathLike):
        self.root, self.source = Path(root), source
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, rel: str) -> np.ndarray:
        if rel not in self._cache:
            self._cache[rel] = read_image(safe_image_path(self.root, rel, self.source))
        return self._cache[rel]


def meta_box(row) -> tuple[float, float, float, float]:
    return (float(row.box_left), float(row.box_top), float(row.box_width), float(row.box_height))
