"""pipeline.training.loop: the validation metrics of an epoch (evaluate)."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.training import loop


def _cache(truth, eyes):
    n = len(truth)
    return SimpleNamespace(faces=np.zeros((n, 8, 8, 3), np.uint8), crop_to_orig=np.zeros((n, 2, 3)),
                           keypoints_orig=truth, schema=SimpleNamespace(eyes=eyes), path="cache/train")


def test_no_face_with_distinct_eye_corners_is_an_error_naming_the_cache(monkeypatch):
    """Every validation face's eye corners coincide (degenerate labels): NME is undefined, a
    one-line error naming the cache, not a crash on float(None)."""
    truth = np.zeros((2, 3, 2))  # (N, K, 2): eye corners 0 and 1 at the same point
    monkeypatch.setattr(loop, "predict_original", lambda *a, **kw: {"final": truth + 1.0})
    with pytest.raises(PipelineError) as e:
        loop.evaluate(None, _cache(truth, (0, 1)), np.arange(2), {}, batch_size=2, device="cpu")
    assert "cache/train" in str(e.value) and "inter-ocular distance 0" in str(e.value)


def test_nme_is_nan_when_the_schema_has_no_eyes_in_range(monkeypatch):
    """eyes beyond K (nme() gives None): the epoch's NME is NaN, MAE still counted."""
    truth = np.zeros((2, 3, 2))
    monkeypatch.setattr(loop, "predict_original", lambda *a, **kw: {"final": truth + 1.0})
    out = loop.evaluate(None, _cache(truth, (36, 45)), np.arange(2), {}, batch_size=2, device="cpu")
    assert out["mae"] == 1.0
    assert math.isnan(out["nme"])


def test_a_checkpoint_from_before_a_param_existed_still_resumes():
    """The resume key of a stored config that lacks a newer param (train.rotate) equals the
    current config's when that param has its default: adding a param keeps runs resumable;
    a stored value that differs does not."""
    from pipeline.core.config import load_config
    from pipeline.training.identity import _config_key

    cfg = load_config(None)
    stored = cfg.model_dump()
    del stored["train"]["rotate"]
    assert _config_key(stored) == _config_key(cfg)
    stored["train"]["epochs"] += 1
    assert _config_key(stored) != _config_key(cfg)
