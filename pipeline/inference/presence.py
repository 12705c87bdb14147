"""The face-presence score: is what the model was handed a face? Read from the keypoint
model's own heatmaps, so it needs no training and works with every heatmap checkpoint.

For every keypoint, how much more of its soft-argmax probability lies within `radius` (a
fraction of the map's side, in x and in y) of the final keypoint (the mean of the plain and
mirrored views with flip) than a flat map would put there, averaged over the keypoints and
the views. On a face each map is one sharp peak and both views agree: close to 1. On a wall,
a shifted box or a part of a face the maps spread out or put their peaks in different places
in the two views, and the score falls towards 0. One number covers both signs (peak mass
and flip agreement), means the same at every map resolution, and costs one masked sum over
maps the model computes anyway. A model without heatmaps (the regression baselines) has no
score: NaN, which every gate reads as a face.

The thresholds come with each model (`formats/checkpoint.checkpoint_presence`: chosen on
held-out faces against non-face crops of the same photos by the presence stage,
pipeline/stages/presence.py; none when the model was never calibrated: no gate), with the
views the score was calibrated on, which it then always reads (`Scorer`). This module also
holds that calibration's maths (ROC AUC, the thresholds) and its non-face boxes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from pipeline.detection.boxes import iou
from pipeline.formats.checkpoint import PRESENCE_RADIUS
from pipeline.keypoints.flip import flip_coords

# on a coarse map (a 32 px model's 8 x 8) radius * side is under a pixel, and a point
# between pixel centres could have none within reach: at least the 3 x 3 pixels around it
MIN_RADIUS_PX = 1.5


def _reach(probs: torch.Tensor, points: torch.Tensor, input_size: int,
           radius: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K, w) and (B, K, h) masks of the map columns and rows within radius * max(h, w) map
    pixels (MIN_RADIUS_PX at least) of `points` (B, K, 2) in input pixels (the soft-argmax
    head's map -> input scaling undone: x_map = (x_in + 0.5) * w / input_size - 0.5)."""
    h, w = probs.shape[-2:]
    p = points.float()
    xm = (p[..., 0] + 0.5) * (w / input_size) - 0.5  # (B, K)
    ym = (p[..., 1] + 0.5) * (h / input_size) - 0.5
    r = max(radius * max(h, w), MIN_RADIUS_PX)
    near_x = ((torch.arange(w, dtype=torch.float32, device=probs.device) - xm[..., None]).abs() <= r).float()
    near_y = ((torch.arange(h, dtype=torch.float32, device=probs.device) - ym[..., None]).abs() <= r).float()
    return near_x, near_y


def heatmap_mass(probs: torch.Tensor, points: torch.Tensor, input_size: int, radius: float) -> torch.Tensor:
    """(B, K): the probability of each map (B, K, h, w) within reach of `points` (`_reach`: a
    square about the point, separable, so one pass over the maps)."""
    return _mass(probs, *_reach(probs, points, input_size, radius))


def _mass(probs: torch.Tensor, near_x: torch.Tensor, near_y: torch.Tensor) -> torch.Tensor:
    rows = torch.einsum("bkhw,bkw->bkh", probs.float(), near_x)  # each row's mass within reach in x
    return (rows * near_y).sum(-1)


def heatmap_share(probs: torch.Tensor, points: torch.Tensor, input_size: int, radius: float) -> torch.Tensor:
    """(B, K) in [0, 1]: the mass within reach beyond what a flat map puts there, as a share
    of what it could be: (mass - u) / (1 - u), u = the share of the map's pixels within
    reach. The raw mass would depend on the map's size (a flat 2 x 2 map lies all within
    reach and scores 1, a flat 64 x 64 one 0.01); this is 0 for a flat map and 1 for all the
    mass within reach at every size. A map within reach everywhere (u = 1) cannot tell a
    peak from a flat map: 0. Below flat (the mass elsewhere): 0."""
    near_x, near_y = _reach(probs, points, input_size, radius)
    mass = _mass(probs, near_x, near_y)
    flat = near_x.sum(-1) * near_y.sum(-1) / (probs.shape[-1] * probs.shape[-2])
    room = 1 - flat
    share = (mass - flat) / room.clamp(min=1e-12)
    return torch.where(room > 1e-6, share.clamp(0, 1), torch.zeros_like(share))


def presence_score(probs: torch.Tensor, coords: torch.Tensor, input_size: int, *,
                   flip_probs: torch.Tensor | None = None, flip_raw: torch.Tensor | None = None,
                   flip_perm: Sequence[int] | None = None, radius: float = PRESENCE_RADIUS) -> torch.Tensor:
    """(B,) face-presence scores of a batch: probs (B, K, h, w) and coords (B, K, 2) (input px)
    of the plain view; with the mirrored view also its maps and coordinates as the model gave
    them (in the mirrored frame) and the schema's flip permutation."""
    if flip_probs is None or flip_raw is None or flip_perm is None:
        return heatmap_share(probs, coords, input_size, radius).mean(-1)
    mean = (coords.float() + flip_coords(flip_raw.float(), input_size, flip_perm)) / 2  # the TTA point
    both = (heatmap_share(probs, mean, input_size, radius)
            + heatmap_share(flip_probs, flip_coords(mean, input_size, flip_perm), input_size, radius)) / 2
    return both.mean(-1)


@dataclass(frozen=True)
class Scorer:
    """`presence_score` at `radius` on the views a threshold was calibrated on: with
    `flip_perm` (the schema's flip permutation) the plain and the mirrored view, else the
    plain one. What pipeline/inference/tta.py `predict_crops(presence=)` takes: it runs the
    mirrored view for the score even when the keypoints do without it."""

    radius: float = PRESENCE_RADIUS
    flip_perm: tuple[int, ...] | None = None

    def __call__(self, probs: torch.Tensor, coords: torch.Tensor, input_size: int,
                 flip_probs: torch.Tensor | None = None, flip_raw: torch.Tensor | None = None) -> torch.Tensor:
        return presence_score(probs, coords, input_size, flip_probs=flip_probs, flip_raw=flip_raw,
                              flip_perm=self.flip_perm, radius=self.radius)


def scorer(radius: float = PRESENCE_RADIUS, flip_perm: Sequence[int] | None = None) -> Scorer:
    """The `Scorer` at this radius, on the plain view or (with `flip_perm`) on both."""
    return Scorer(float(radius), None if flip_perm is None else tuple(int(i) for i in flip_perm))


def is_face(scores: np.ndarray, threshold: float | None) -> np.ndarray:
    """(M,) bool: score >= threshold; a NaN score (a model without heatmaps) or no threshold
    (the gate turned off) counts as a face."""
    s = np.asarray(scores, dtype=np.float64)
    if threshold is None:
        return np.ones(s.shape, dtype=bool)
    return ~(s < threshold)


def select_faces(scores: np.ndarray, threshold: float | None, max_faces: int = 0,
                 keep_all: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Which of a photo's detections (largest first) to return: (indices, is_face of each
    returned). The faces (`is_face`), the largest max_faces of them (0: all); `keep_all` also
    returns the non-faces, marked False, in their place in the detector's order."""
    face = is_face(scores, threshold)
    keep = np.flatnonzero(face)
    if max_faces:
        keep = keep[:max_faces]
    if keep_all:
        keep = np.union1d(keep, np.flatnonzero(~face))
    return keep, face[keep]


# ------------------------------------------------------------------ calibration


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """The probability that a random face scores above a random non-face (ties count half):
    the area under the ROC curve, by ranks (Mann-Whitney U)."""
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    if not len(pos) or not len(neg):
        return float("nan")
    allv = np.concatenate([pos, neg])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    ranks[order] = np.arange(1, len(allv) + 1)
    _, inv, counts = np.unique(allv, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / counts)[inv]  # tied values share their mean rank
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def choose_threshold(pos: np.ndarray, neg: np.ndarray) -> dict:
    """The threshold that maximises the share of faces kept plus the share of non-faces
    dropped (Youden's J); where a range of thresholds ties (separable scores), its middle, so
    neither side sits on the edge. Returns the threshold, the shares at it and the AUC."""
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    cand = np.unique(np.concatenate([pos, neg]))
    cand = np.concatenate([cand, [np.inf]])
    kept = (pos[None, :] >= cand[:, None]).mean(1)  # faces at or above each candidate
    dropped = (neg[None, :] < cand[:, None]).mean(1)
    j = kept + dropped
    best = np.flatnonzero(j >= j.max() - 1e-12)
    run = best[:1 + int(np.argmax(np.diff(best, append=best[-1] + 2) > 1))]  # the first run of tied candidates
    # candidate c's J holds for every threshold in (the previous candidate, c]
    lo = cand[run[0] - 1] if run[0] > 0 else cand[run[0]]
    hi = cand[run[-1]]
    t = float((lo + hi) / 2) if np.isfinite(hi) else float(lo)
    return {"threshold": t, "faces_kept": float((pos >= t).mean()), "non_faces_dropped": float((neg < t).mean()),
            "auc": roc_auc(pos, neg)}


def keep_threshold(neg: np.ndarray, threshold: float, drop: float) -> float:
    """The lower threshold that keeps a track: the score under which the share `drop` of the
    non-faces lie (their `drop` quantile), never above the start `threshold`."""
    return float(min(threshold, np.quantile(np.asarray(neg, dtype=np.float64), drop)))


# the non-face boxes made around each held-out face: its box moved by this share of its side
# in each direction (a face half out of the box: what a drifting track sees), a part of it
# (an eye, the mouth: the detector firing on a detail), the face small in a wide box, and
# background patches away from every labelled face of the photo
SHIFT = 0.6
PART, WIDE = 0.4, 2.5
BACKGROUND_PER_FACE = 2


def non_face_boxes(box: Sequence[float], faces: np.ndarray, width: int, height: int,
                   rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """[(kind, box [left, top, w, h])] of non-face crops around one labelled face `box` of a
    width x height photo whose labelled faces are `faces` (M, 4): four shifted boxes, a part
    of the face, the face in a box WIDE times its side, and up to BACKGROUND_PER_FACE
    background patches (half to 1.2 times the face's side) overlapping no labelled face."""
    b = np.asarray(box, dtype=np.float64)
    s = max(b[2], b[3])
    out = [("shifted", b + [dx * s, dy * s, 0, 0]) for dx, dy in ((SHIFT, 0), (-SHIFT, 0), (0, SHIFT), (0, -SHIFT))]
    cx, cy = b[0] + b[2] / 2, b[1] + b[3] / 2
    pcx, pcy = cx + rng.uniform(-0.25, 0.25) * s, cy + rng.uniform(-0.25, 0.25) * s
    out.append(("part", np.array([pcx - PART * b[2] / 2, pcy - PART * b[3] / 2, PART * b[2], PART * b[3]])))
    out.append(("wide", np.array([cx - WIDE * b[2] / 2, cy - WIDE * b[3] / 2, WIDE * b[2], WIDE * b[3]])))
    faces = np.asarray(faces, dtype=np.float64).reshape(-1, 4)
    got = 0
    for _ in range(50):
        side = s * rng.uniform(0.5, 1.2)
        if side >= min(width, height) or got == BACKGROUND_PER_FACE:
            break
        cand = np.array([rng.uniform(0, width - side), rng.uniform(0, height - side), side, side])
        grown = np.concatenate([cand[:2] - 0.2 * side, cand[2:] * 1.4])  # the crop sees beyond the box
        if not len(faces) or (iou(cand[None], faces).max() < 0.05 and iou(grown[None], faces).max() < 0.1):
            out.append(("background", cand))
            got += 1
    return out
