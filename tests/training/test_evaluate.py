"""pipeline.training.loop.evaluate: the validation metrics of an epoch."""
import math
from types import SimpleNamespace

import numpy as np

from pipeline.training import loop


def test_nme_is_nan_when_no_face_has_distinct_eye_corners(monkeypatch):
    """nme() is None when every validation face's eye corners coincide (degenerate labels):
    the epoch's NME is NaN, MAE still counted, and training does not crash on float(None)."""
    truth = np.zeros((2, 3, 2))  # (N, K, 2): eye corners 0 and 1 at the same point
    pred = truth + 1.0
    monkeypatch.setattr(loop, "predict_original", lambda *a, **kw: {"final": pred})
    cache = SimpleNamespace(faces=np.zeros((2, 8, 8, 3), np.uint8), crop_to_orig=np.zeros((2, 2, 3)),
                            keypoints_orig=truth, schema=SimpleNamespace(eyes=(0, 1)))
    out = loop.evaluate(None, cache, np.arange(2), {}, batch_size=2, device="cpu")
    assert out["mae"] == 1.0
    assert math.isnan(out["nme"])
