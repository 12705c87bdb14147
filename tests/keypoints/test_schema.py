"""Keypoint layouts: the iBUG-68 flip permutation, checked on its own and on real faces."""

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import DataParams
from pipeline.keypoints.schema import IBUG68, NOSE1, KeypointSchema, check_schema, get_schema, schema_from_dict

# (image-left, image-right) twins of a frontal face
PAIRS = [(36, 45), (39, 42), (0, 16), (3, 13), (17, 26), (21, 22), (31, 35), (48, 54), (60, 64)]


def test_ibug68_flip_is_an_involution_with_the_right_twins():
    perm = np.array(IBUG68.flip_perm)
    assert IBUG68.k == 68 and sorted(perm.tolist()) == list(range(68))
    np.testing.assert_array_equal(perm[perm], np.arange(68))
    for a, b in [(36, 45), (0, 16), (17, 26), (39, 42), (48, 54), (60, 64), (37, 44), (40, 47), (55, 59),
                 (65, 67), (31, 35)]:
        assert perm[a] == b and perm[b] == a
    for mid in (8, 27, 28, 29, 30, 33, 51, 57, 62, 66):
        assert perm[mid] == mid
    assert IBUG68.eyes == (36, 45)
    assert set(IBUG68.groups["right_eye"]) == set(range(36, 42))


def test_flip_coords_twice_is_identity_and_mirrors_x():
    pts = np.random.default_rng(0).uniform(0, 100, (3, 68, 2))
    once = IBUG68.flip_coords(pts, width=101)
    np.testing.assert_allclose(IBUG68.flip_coords(once, width=101), pts)
    np.testing.assert_allclose(once[:, 45, 0], 100 - pts[:, 36, 0])  # x -> W - 1 - x, 36 -> 45
    np.testing.assert_allclose(once[:, 30], np.stack([100 - pts[:, 30, 0], pts[:, 30, 1]], -1))


def _left_of_twin_after_flip(kp: np.ndarray, width: float) -> tuple[int, int]:
    """(pairs checked, pairs that kept image-left < image-right after flip + remap)."""
    flipped = IBUG68.flip_coords(kp[None], width)[0]
    checked = kept = 0
    for a, b in PAIRS:
        if kp[a, 0] < kp[b, 0] - 2:  # the original has the property (clearly)
            checked += 1
            kept += flipped[a, 0] < flipped[b, 0]
    return checked, kept


def test_flip_keeps_left_points_left_on_real_faces(real_dir):
    import cv2

    from pipeline.formats.annotations import load_xml

    faces = load_xml(real_dir / "labels_ibug_300W_train.xml", IBUG68)[::10]
    total = kept_total = 0
    for f in faces:
        w = cv2.imread(str(real_dir / f.image), cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION).shape[1]
        checked, kept = _left_of_twin_after_flip(f.keypoints, w)
        total += checked
        kept_total += kept
    assert total > 5 * len(faces)  # most pairs are clearly ordered on real faces
    assert kept_total == total


def test_a_wrong_permutation_would_be_caught(real_dir):
    # the same check with 36 <-> 45 left unswapped must fail, or the test above proves nothing
    from pipeline.formats.annotations import load_xml

    bad = list(IBUG68.flip_perm)
    bad[36], bad[45] = 36, 45
    wrong = KeypointSchema("wrong", IBUG68.names, tuple(bad))
    f = load_xml(real_dir / "labels_ibug_300W_train.xml", IBUG68)[0]
    flipped = wrong.flip_coords(f.keypoints[None], 500)[0]
    assert f.keypoints[36, 0] < f.keypoints[45, 0] and not flipped[36, 0] < flipped[45, 0]


def test_neighbours_shape_and_no_self():
    from pipeline.synth.face import TEMPLATE

    nb = IBUG68.neighbours(TEMPLATE[:, :2], n=2)
    assert nb.shape == (68, 2) and nb.dtype == np.int64
    assert not (nb == np.arange(68)[:, None]).any()
    assert ((nb >= 0) & (nb < 68)).all()
    assert set(nb[36]) <= set(range(17, 48))  # an eye corner's neighbours are brow/eye points
    assert NOSE1.neighbours(np.zeros((1, 2))).shape == (1, 0)


def test_get_schema_and_round_trip():
    assert get_schema(DataParams(schema="ibug68")) is IBUG68 and get_schema(DataParams(schema="nose1")) is NOSE1
    assert NOSE1.source_indices == (30,) and NOSE1.k == 1
    assert schema_from_dict(IBUG68.to_dict()) is IBUG68
    c = get_schema(DataParams(**{"schema": "custom", "custom_schema": {"names": ["l", "r", "m"], "flip": [1, 0, 2]}}))
    assert c.k == 3 and schema_from_dict(c.to_dict()).flip_perm == (1, 0, 2)
    with pytest.raises(PipelineError):
        get_schema(DataParams(**{"schema": "custom", "custom_schema": {"names": ["a", "b"], "flip": [1, 1]}}))
    with pytest.raises(PipelineError):
        get_schema(DataParams(schema="nope"))


def test_regions_merge_left_and_right_groups():
    regions = IBUG68.regions()
    assert {r: len(i) for r, i in regions.items()} == {"jaw": 17, "brows": 10, "nose": 9, "eyes": 12, "mouth": 20}
    assert sorted(i for idx in regions.values() for i in idx) == list(range(68))
    assert regions["eyes"] == tuple(range(36, 48)) and regions["brows"] == tuple(range(17, 27))
    assert NOSE1.regions() == {"nose": (0,)}


def test_check_schema_refuses_other_points_or_another_flip():
    """The one check that a stored model schema (checkpoint, export, Landmarker) is the
    data's: the same names and flip pass, anything else is one line naming the file."""
    check_schema(IBUG68.to_dict(), IBUG68, "a.pt")
    check_schema(schema_from_dict(IBUG68.to_dict()).to_dict(), IBUG68, "a.pt")
    with pytest.raises(PipelineError, match=r"a\.pt: checkpoint is for schema 'nose1' \(1 points\), data uses "
                                            r"'ibug68' \(68 points\)"):
        check_schema(NOSE1.to_dict(), IBUG68, "a.pt")
    unflipped = {**IBUG68.to_dict(), "flip": list(range(68))}
    with pytest.raises(PipelineError, match=r"m\.onnx: exported model is for schema 'ibug68' \(68 points\), the "
                                            r"others for 'ibug68'"):
        check_schema(unflipped, IBUG68, "m.onnx", "exported model", "the others for")
    with pytest.raises(PipelineError, match=r"is for schema 'None' \(0 points\)"):
        check_schema("ibug68", IBUG68, "a.pt")
