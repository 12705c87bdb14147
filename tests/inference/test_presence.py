"""The face-presence score's maths (pipeline/inference/presence.py) and its calibration
stamp in checkpoints (pipeline/formats/checkpoint.py)."""

import numpy as np
import pytest
import torch

from pipeline.core.errors import PipelineError
from pipeline.detection.boxes import iou
from pipeline.formats.checkpoint import PRESENCE_RADIUS, checkpoint_presence, presence_stamp
from pipeline.inference.presence import (
    choose_threshold,
    heatmap_mass,
    is_face,
    non_face_boxes,
    presence_score,
    roc_auc,
    select_faces,
)
from pipeline.keypoints.flip import flip_coords

SIZE, MAP = 32, 16  # input px, map px: x_map = (x_in + 0.5) / 2 - 0.5
PERM = [1, 0, 2]  # points 0 and 1 swap in the mirror, point 2 is on the axis


def one_hot(cells) -> torch.Tensor:
    """(1, K, MAP, MAP) maps, map k all its mass at cell (col, row) = cells[k]."""
    maps = torch.zeros(1, len(cells), MAP, MAP)
    for k, (c, r) in enumerate(cells):
        maps[0, k, r, c] = 1.0
    return maps


def at_cells(cells) -> torch.Tensor:
    """(1, K, 2) input px of those map cells' centres."""
    return torch.tensor([[[2.0 * c + 0.5, 2.0 * r + 0.5] for c, r in cells]])


def test_the_score_is_one_for_sharp_maps_on_agreeing_views_and_falls_when_they_spread_or_disagree():
    cells = [(3, 4), (12, 4), (8, 11)]
    plain, coords = one_hot(cells), at_cells(cells)
    # the mirrored view as the model gives it: map k of the mirrored face is point PERM[k]
    mirrored = [(MAP - 1 - cells[PERM[k]][0], cells[PERM[k]][1]) for k in range(3)]
    flip_maps, flip_raw = one_hot(mirrored), at_cells(mirrored)
    np.testing.assert_allclose(flip_coords(flip_raw, SIZE, PERM), coords)  # the same points, unmirrored
    both = dict(flip_probs=flip_maps, flip_raw=flip_raw, flip_perm=PERM)
    assert presence_score(plain, coords, SIZE, **both).item() == pytest.approx(1.0)
    assert presence_score(plain, coords, SIZE).item() == pytest.approx(1.0)  # no flip TTA: the plain view
    # flat maps: no more mass within reach than a uniform map puts there
    flat = torch.full((1, 3, MAP, MAP), 1.0 / MAP ** 2)
    assert presence_score(flat, coords, SIZE).item() == pytest.approx(0.0)
    # sharp maps, but the mirrored view puts every point 6 map px to the right: the mean point
    # lies 3 px from either peak, out of reach of both
    moved = [(c + 6 if c + 6 < MAP else c - 6, r) for c, r in mirrored]
    score = presence_score(plain, coords, SIZE, flip_probs=one_hot(moved), flip_raw=at_cells(moved), flip_perm=PERM)
    assert score.item() == pytest.approx(0.0)


@pytest.mark.parametrize("side", [2, 4, 8, 16, 64])
def test_a_flat_map_scores_zero_and_a_sharp_one_one_whatever_the_map_size(side):
    """What the score means does not depend on the map's resolution: a flat map (the model
    says nothing about where the point is) scores 0 on a 2 x 2 map as on a 64 x 64 one, and a
    map with all its mass on the point 1 wherever some of the map lies out of reach."""
    input_size = 4 * side
    cells = [(0, 0), (side // 2, side // 3), (side - 1, side - 1)]  # a corner, inside, the far corner
    points = torch.tensor([[[4.0 * c + 1.5, 4.0 * r + 1.5] for c, r in cells]])  # the cells' centres, input px
    flat = torch.full((1, 3, side, side), 1.0 / side ** 2)
    sharp = torch.zeros(1, 3, side, side)
    for k, (c, r) in enumerate(cells):
        sharp[0, k, r, c] = 1.0
    assert presence_score(flat, points, input_size).item() == pytest.approx(0.0, abs=1e-6)
    # a 2 x 2 map lies within reach of every point (the 1.5 px floor): it cannot tell a peak
    # from a flat map, so it says nothing either
    assert presence_score(sharp, points, input_size).item() == pytest.approx(0.0 if side == 2 else 1.0, abs=1e-6)


def test_the_radius_is_a_share_of_the_map_side():
    maps = torch.zeros(1, 1, 64, 64)
    maps[0, 0, 10, 10] = 0.5  # half the mass on the point, half 3 px away (within 0.05 x 64 = 3.2 px)
    maps[0, 0, 10, 13] = 0.5
    point = torch.tensor([[[(10 + 0.5) * 2 - 0.5, (10 + 0.5) * 2 - 0.5]]])  # input 128 px
    assert heatmap_mass(maps, point, 128, PRESENCE_RADIUS).item() == pytest.approx(1.0)
    assert heatmap_mass(maps, point, 128, 0.04).item() == pytest.approx(0.5)  # 2.56 px: only the peak


def test_roc_auc_counts_pairs_with_ties_as_half():
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 5, 40).astype(float), rng.integers(0, 4, 70).astype(float)
    pairs = (pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean()
    assert roc_auc(pos, neg) == pytest.approx(pairs)
    assert roc_auc([0.9, 0.8], [0.1, 0.2]) == 1.0 and roc_auc([0.1], [0.9]) == 0.0


def test_the_threshold_keeps_every_face_and_drops_every_non_face_when_they_separate():
    pos, neg = np.array([0.8, 0.9, 0.95]), np.array([0.1, 0.3, 0.6])
    t = choose_threshold(pos, neg)
    assert t["threshold"] == pytest.approx(0.7)  # the middle of the gap between the two sides
    assert t["faces_kept"] == 1.0 and t["non_faces_dropped"] == 1.0 and t["auc"] == 1.0
    # overlapping: the most faces kept plus non-faces dropped (3/3 + 3/4 anywhere in (0.3, 0.5],
    # against 2/3 + 4/4 in (0.6, 0.7]), in the middle of that range
    t = choose_threshold(np.array([0.5, 0.7, 0.9]), np.array([0.1, 0.6, 0.2, 0.3]))
    assert t["threshold"] == pytest.approx(0.4) and t["faces_kept"] == 1.0 and t["non_faces_dropped"] == 0.75


def test_is_face_and_select_faces():
    scores = np.array([0.2, 0.9, np.nan, 0.95, 0.1])  # largest detection first
    assert is_face(scores, 0.5).tolist() == [False, True, True, True, False]  # NaN: no score, a face
    assert is_face(scores, None).all()
    keep, face = select_faces(scores, 0.5)
    assert keep.tolist() == [1, 2, 3] and face.all()
    keep, face = select_faces(scores, 0.5, max_faces=1)
    assert keep.tolist() == [1]  # the largest face: a larger non-face does not take its place
    keep, face = select_faces(scores, 0.5, max_faces=2, keep_all=True)
    assert keep.tolist() == [0, 1, 2, 4] and face.tolist() == [False, True, True, False]


def test_non_face_boxes_move_cut_and_widen_the_face_and_find_background_away_from_faces():
    box, other = np.array([100.0, 80, 60, 70]), np.array([300.0, 60, 50, 50])
    out = non_face_boxes(box, np.stack([box, other]), 480, 360, np.random.default_rng(0))
    kinds = [k for k, _ in out]
    assert kinds[:6] == ["shifted"] * 4 + ["part", "wide"] and kinds[6:] == ["background"] * 2
    for _, b in out[:4]:  # moved by 0.6 of the side: the face half out of the box
        assert 0.15 < iou(b[None], box[None])[0, 0] < 0.45
    part, wide = out[4][1], out[5][1]
    assert part[2] == pytest.approx(0.4 * 60) and wide[2] == pytest.approx(2.5 * 60)
    for _, b in out[6:]:
        assert iou(b[None], np.stack([box, other])).max() < 0.05
        assert 0 <= b[0] and b[0] + b[2] <= 480 and 0 <= b[1] and b[1] + b[3] <= 360


def test_a_checkpoint_without_a_calibration_has_no_threshold_and_a_bad_one_is_one_line():
    none = checkpoint_presence({})
    assert none["threshold"] is None and none["keep"] is None and not none["calibrated"]
    assert none["radius"] == PRESENCE_RADIUS and "never calibrated" in none["why"]
    got = checkpoint_presence({"presence": presence_stamp(0.8, auc=0.99, faces=10)})
    assert {k: got[k] for k in ("threshold", "keep", "radius", "tta", "auc", "faces", "calibrated")} == \
        {"threshold": 0.8, "keep": 0.8, "radius": PRESENCE_RADIUS, "tta": "flip", "auc": 0.99, "faces": 10,
         "calibrated": True}
    assert checkpoint_presence({"presence": presence_stamp(0.8, keep=0.6, tta="none")})["keep"] == 0.6
    # a calibration that found no threshold (faces and non-faces did not separate): no gate, and why
    refused = checkpoint_presence({"presence": presence_stamp(None, auc=0.6, why="faces and non-faces do not "
                                                                                "separate")})
    assert refused["threshold"] is None and not refused["calibrated"] and "separate" in refused["why"]
    # a threshold on an older definition of the score means nothing on this one
    old = checkpoint_presence({"presence": {"threshold": 0.8, "radius": 0.05, "tta": "flip"}})
    assert old["threshold"] is None and not old["calibrated"] and "older" in old["why"]
    for bad in ({"threshold": 1.5, "radius": 0.05}, {"threshold": 0.5}, "high",
                presence_stamp(0.5, keep=0.7), presence_stamp(0.5, tta="mirror")):
        with pytest.raises(PipelineError) as e:
            checkpoint_presence({"presence": bad}, "m.pt")
        assert str(e.value).startswith("m.pt: bad presence calibration")
