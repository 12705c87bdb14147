"""MAE (the competition metric) and NME on hand-made examples."""


import numpy as np
import pytest

from pipeline.keypoints.metrics import mae, nme, region_nme
from pipeline.keypoints.schema import IBUG68


def test_mae_and_nme_hand_example():
    truth = np.zeros((2, 3, 2))
    truth[:, 1] = (4.0, 0.0)  # eyes 0 and 1: inter-ocular 4 px
    pred = truth.copy()
    pred[0, 2] += (3.0, 4.0)  # face 0: one point 5 px off -> mean 5/3 -> /4
    pred[1, :, 0] += 2.0      # face 1: every point 2 px off -> 2/4
    assert mae(pred, truth) == pytest.approx((3 + 4 + 2 * 3) / 12)
    assert nme(pred, truth, eyes=(0, 1)) == pytest.approx(((5 / 3) / 4 + 2 / 4) / 2)
    assert nme(pred, truth, eyes=None) is None
    assert nme(pred, truth, eyes=(0, 7)) is None  # out of range for K=3


def test_nme_ibug_eyes_default():
    rng = np.random.default_rng(0)
    truth = rng.uniform(0, 100, (4, 68, 2))
    pred = truth + rng.normal(0, 1, truth.shape)
    iod = np.linalg.norm(truth[:, 36] - truth[:, 45], axis=1)
    want = np.mean(np.linalg.norm(pred - truth, axis=2).mean(1) / iod)
    assert nme(pred, truth) == pytest.approx(want)
    assert IBUG68.eyes == (36, 45)




def test_nme_leaves_out_faces_without_an_eye_distance_and_refuses_when_none_has_one():
    from pipeline.core.errors import PipelineError

    truth = np.zeros((2, 3, 2))
    truth[0, 1] = (4.0, 0.0)  # face 1: both eye points at the origin
    pred = truth + 2.0
    assert nme(pred, truth, eyes=(0, 1)) == pytest.approx(np.sqrt(8) / 4)  # face 0 only
    with pytest.raises(PipelineError) as e:
        nme(pred[1:], truth[1:], eyes=(0, 1), where="sol.csv")
    assert str(e.value) == ("sol.csv: NME is undefined: eye points 0 and 1 coincide in the truth of every face (1): "
                            "inter-ocular distance 0")
    with pytest.raises(PipelineError, match="its eye points are one point"):
        nme(pred, truth, eyes=(1, 1))


def test_a_schema_whose_eyes_are_one_point_is_a_param_error():
    from pipeline.core.errors import PipelineError
    from pipeline.core.params_schema import DataParams
    from pipeline.keypoints.schema import get_schema

    with pytest.raises(PipelineError) as e:
        get_schema(DataParams(schema="custom", custom_schema={"names": ["a", "b", "c"], "eyes": [1, 1]}))
    assert "eyes must be two different keypoints" in str(e.value) and "\n" not in str(e.value)


def test_score_and_validation_with_coinciding_eyes_are_one_line_errors(tmp_path, tiny_workspace, capsys):
    """The callers: `pipeline score` against a solution whose eye corners coincide on every
    face, and training's validation NME on such truth, stop with one line naming the file."""
    import torch

    from pipeline.core.errors import PipelineError
    from pipeline.formats.cache import load_cache
    from pipeline.formats.submission import write_submission
    from pipeline.training.loop import evaluate

    from helpers import run_cli

    truth = np.random.default_rng(0).uniform(0, 100, (3, 68, 2))
    truth[:, 45] = truth[:, 36]
    write_submission(tmp_path / "sol.csv", truth)
    write_submission(tmp_path / "sub.csv", truth + 1.0)
    code, out, err = run_cli(["score", tmp_path / "sub.csv", "--solution", tmp_path / "sol.csv"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "NME is undefined" in err, (out, err)
    assert str(tmp_path / "sol.csv") in err

    cache = load_cache(tiny_workspace / "cache" / "train")
    kp = np.array(cache.keypoints_orig)
    kp[:, 45] = kp[:, 36]
    cache.keypoints_orig = kp

    class Centre(torch.nn.Module):
        def forward(self, x):
            return torch.full((x.shape[0], 68, 2), 16.0)

    ckpt_like = {"model_config": {"input_size": 32, "in_chans": 3}, "schema": IBUG68.to_dict(),
                 "crop": {"size": 32, "expand": 1.25, "label_origin": 0.0}}
    with pytest.raises(PipelineError) as e:
        evaluate(Centre(), cache, np.arange(4), ckpt_like, 8, torch.device("cpu"))
    assert "NME is undefined" in str(e.value) and str(cache.path) in str(e.value)


def test_region_nme_splits_nme_by_face_region():
    rng = np.random.default_rng(1)
    truth = rng.uniform(0, 100, (5, 68, 2))
    truth[4, 45] = truth[4, 36]  # a face without an inter-ocular distance: left out, as nme does
    pred = truth + rng.normal(0, 1, truth.shape)
    regions = IBUG68.regions()
    got = region_nme(pred, truth, regions)
    assert list(got) == ["jaw", "brows", "nose", "eyes", "mouth"]
    # the regions' mean weighted by their point counts is the NME of all points
    weighted = sum(got[r] * len(idx) for r, idx in regions.items()) / 68
    assert weighted == pytest.approx(nme(pred, truth))
    only_jaw = truth.copy()
    only_jaw[:, :17, 1] += 3.0
    split = region_nme(only_jaw, truth, regions)
    iod = np.linalg.norm(truth[:4, 36] - truth[:4, 45], axis=1)
    assert split["jaw"] == pytest.approx(np.mean(3.0 / iod))
    assert all(v == 0 for r, v in split.items() if r != "jaw")
    assert region_nme(pred, truth, regions, eyes=None) is None


def test_region_nme_checks_its_inputs_as_nme_does():
    from pipeline.core.errors import PipelineError

    truth = np.random.default_rng(2).uniform(0, 100, (2, 68, 2))
    regions = IBUG68.regions()
    assert region_nme(truth, truth, regions, eyes=(0, 68)) is None and nme(truth, truth, eyes=(0, 68)) is None
    with pytest.raises(ValueError, match=r"nme: need two \(N, K, 2\) arrays"):
        region_nme(truth[:1], truth, regions)
    with pytest.raises(PipelineError, match="its eye points are one point"):
        region_nme(truth, truth, regions, eyes=(3, 3))
    coincide = truth.copy()
    coincide[:, 45] = coincide[:, 36]
    with pytest.raises(PipelineError) as e:
        region_nme(coincide, coincide, regions, where="sol.csv")
    assert str(e.value) == ("sol.csv: NME is undefined: eye points 36 and 45 coincide in the truth of every face (2): "
                            "inter-ocular distance 0")
