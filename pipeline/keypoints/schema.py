"""Keypoint layouts. Everything downstream (head size, flip, losses, CSV width) reads
a KeypointSchema; nothing else knows how many points a face has."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.core.config import params_source
from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import DataParams
from pipeline.keypoints.flip import flip_coords


@dataclass(frozen=True)
class KeypointSchema:
    name: str
    names: tuple[str, ...]  # one human-readable name per keypoint
    # flip_perm[i] = the point that lands on point i after a horizontal flip
    # (the left eye's outer corner becomes the right eye's); an involution.
    flip_perm: tuple[int, ...]
    # outer eye corners used to normalise NME (None: NME undefined for this layout)
    eyes: tuple[int, int] | None = None
    # face parts for colouring pictures: part name -> point indices
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # when the annotation files hold a larger layout (nose1 inside 68-point files):
    # which of their points this schema keeps, and how many points they have
    source_indices: tuple[int, ...] | None = None
    source_k: int | None = None

    def __post_init__(self):
        k = len(self.names)
        perm = np.asarray(self.flip_perm)
        if len(perm) != k or sorted(perm.tolist()) != list(range(k)):
            raise PipelineError(None, f"schema '{self.name}': flip permutation must be a permutation of 0..{k - 1}")
        if not np.array_equal(perm[perm], np.arange(k)):
            raise PipelineError(None, f"schema '{self.name}': flip permutation must be an involution")
        if self.eyes is not None and not all(0 <= e < k for e in self.eyes):
            raise PipelineError(None, f"schema '{self.name}': eye indices out of range")
        if self.eyes is not None and (len(self.eyes) != 2 or self.eyes[0] == self.eyes[1]):
            raise PipelineError(None, f"schema '{self.name}': eyes must be two different keypoints "
                                      "(NME divides by their distance)")

    @property
    def k(self) -> int:
        return len(self.names)

    def flip_coords(self, coords: np.ndarray, width: float) -> np.ndarray:
        """Coordinates of the horizontally flipped image (pipeline/keypoints/flip.py)."""
        return flip_coords(coords, width, self.flip_perm)

    def neighbours(self, mean_shape: np.ndarray, n: int = 2) -> np.ndarray:
        """The n nearest other points of each keypoint on the mean shape: (K, n) int.

        Used by the structure loss. With fewer than n+1 points there are no
        neighbours to constrain, so the result is empty (K, 0)."""
        pts = np.asarray(mean_shape, dtype=np.float64).reshape(self.k, 2)
        n = min(n, self.k - 1)
        if n <= 0:
            return np.zeros((self.k, 0), dtype=np.int64)
        d = np.linalg.norm(pts[:, None, :] - pts[None, :, :], axis=-1)
        np.fill_diagonal(d, np.inf)
        return np.argsort(d, axis=1, kind="stable")[:, :n].astype(np.int64)

    def regions(self) -> dict[str, tuple[int, ...]]:
        """The groups with each left/right pair merged into one region (ibug68: jaw, brows,
        nose, eyes, mouth), in the groups' order: what a report splits the error by."""
        out: dict[str, tuple[int, ...]] = {}
        for name, idx in self.groups.items():
            for side in ("right_", "left_"):
                if name.startswith(side):
                    name = name[len(side):] + "s"
            out[name] = out.get(name, ()) + tuple(idx)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "names": list(self.names), "flip": list(self.flip_perm),
                "eyes": None if self.eyes is None else list(self.eyes)}


def _ibug68() -> KeypointSchema:
    # iBUG 68 (0-based), subject's right side appears on the image left:
    # jaw 0-16 mirrors around the chin (8); brows 17-21 <-> 26-22; nose bridge 27-30
    # stays; nostrils 31-35 mirror around 33; eyes 36-41 <-> 45-42 / 47-46 (outer
    # corner 36 <-> 45); outer lip 48-54 mirrors around 51, lower 55-59 around 57;
    # inner lip 60-64 around 62, 65-67 around 66.
    pairs = [(i, 16 - i) for i in range(8)]
    pairs += [(17 + i, 26 - i) for i in range(5)]
    pairs += [(31, 35), (32, 34)]
    pairs += [(36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)]
    pairs += [(48, 54), (49, 53), (50, 52), (55, 59), (56, 58)]
    pairs += [(60, 64), (61, 63), (65, 67)]
    perm = list(range(68))
    for a, b in pairs:
        perm[a], perm[b] = b, a
    groups = {
        "jaw": tuple(range(0, 17)), "right_brow": tuple(range(17, 22)), "left_brow": tuple(range(22, 27)),
        "nose": tuple(range(27, 36)), "right_eye": tuple(range(36, 42)), "left_eye": tuple(range(42, 48)),
        "mouth": tuple(range(48, 68)),
    }
    names = []
    for g, idx in groups.items():
        names += [f"{g}_{j}" for j in range(len(idx))]
    return KeypointSchema("ibug68", tuple(names), tuple(perm), eyes=(36, 45), groups=groups)


IBUG68 = _ibug68()
NOSE1 = KeypointSchema("nose1", ("nose_tip",), (0,), eyes=None, groups={"nose": (0,)},
                       source_indices=(30,), source_k=68)


def custom_schema(spec: dict[str, Any], source: str = "params.yaml") -> KeypointSchema:
    """Build a schema from params: {names: [...], flip: [...] (default identity), eyes: [i, j]}."""
    unknown = set(spec) - {"names", "flip", "eyes"}
    if unknown:
        raise PipelineError(source, f"data.custom_schema: unknown key(s) {sorted(unknown)}")
    names = spec.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise PipelineError(source, "data.custom_schema.names must be a non-empty list of strings")
    flip = spec.get("flip", list(range(len(names))))
    eyes = spec.get("eyes")
    try:
        return KeypointSchema("custom", tuple(names), tuple(int(i) for i in flip),
                              eyes=None if eyes is None else (int(eyes[0]), int(eyes[1])))
    except PipelineError as e:
        raise PipelineError(source, e.problem) from None
    except (TypeError, ValueError, IndexError):
        raise PipelineError(source, "data.custom_schema: flip and eyes must be lists of integers") from None


def get_schema(data_cfg: DataParams) -> KeypointSchema:
    """The schema named by the `data` section of the params."""
    name = data_cfg.schema
    if name == "ibug68":
        return IBUG68
    if name == "nose1":
        return NOSE1
    if name == "custom":
        if not data_cfg.custom_schema:
            raise PipelineError(params_source("data.schema", "data.custom_schema"),
                                "data.schema is 'custom' but data.custom_schema is empty")
        return custom_schema(data_cfg.custom_schema)
    raise PipelineError(params_source("data.schema"), f"data.schema: unknown schema '{name}' (ibug68, nose1, custom)")


def check_schema(theirs: Any, schema: KeypointSchema, path: str | os.PathLike | None, what: str = "checkpoint",
                 ours: str = "data uses") -> None:
    """Refuse a model trained on other keypoints than `schema`'s (other names or another
    flip): `theirs` is the schema it stores (`to_dict()`, in a checkpoint or an export).
    One line naming `path`: "<what> is for schema 'X' (N points), <ours> 'Y' (K points)"."""
    d = theirs if isinstance(theirs, dict) else {}
    if d.get("names") != list(schema.names) or d.get("flip") != list(schema.flip_perm):
        k = len(d["names"]) if isinstance(d.get("names"), list) else 0
        raise PipelineError(path, f"{what} is for schema '{d.get('name')}' ({k} points), {ours} '{schema.name}' "
                                  f"({schema.k} points)")


def schema_from_dict(d: dict[str, Any]) -> KeypointSchema:
    """Inverse of to_dict, for checkpoints and cache metadata."""
    if d.get("name") == "ibug68":
        return IBUG68
    if d.get("name") == "nose1":
        return NOSE1
    return custom_schema({"names": d["names"], "flip": d["flip"], "eyes": d.get("eyes")}, "checkpoint")
