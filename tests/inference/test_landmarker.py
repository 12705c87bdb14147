"""Landmarker: the one predictor (crops per checkpoint geometry, TTA, the fold ensemble, OOF
calibration, detection), and the README's Python API example run as a user would."""

import inspect
import os
import re
import shutil
from functools import partial

import cv2
import numpy as np
import pytest
import torch

from pipeline.core.errors import PipelineError
from pipeline.detection.detectors import get_detector
from pipeline.detection.haar import cascade_available
from pipeline.formats.checkpoint import PRESENCE_RADIUS, presence_stamp
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.presence import scorer
from pipeline.inference.tta import predict_original
from pipeline.keypoints.geometry import crop_one, crop_transform
from pipeline.keypoints.schema import IBUG68

from helpers import REPO, Fixed


def _meta(size, expand, origin=0.0):
    return {"model_config": {"input_size": 32, "in_chans": 3}, "schema": IBUG68.to_dict(),
            "crop": {"size": size, "expand": expand, "label_origin": origin}}


COORDS = [np.random.default_rng(i).uniform(0, 31, (68, 2)) for i in range(2)]
IMAGE = np.random.default_rng(5).integers(0, 256, (120, 160, 3), dtype=np.uint8)
BOXES = np.array([[30.0, 20, 50, 60], [90, 40, 40, 45]])


def test_each_model_crops_as_trained_and_the_ensemble_is_their_mean_less_the_bias():
    models = [(Fixed(COORDS[0]), _meta(32, 1.25)), (Fixed(COORDS[1]), _meta(40, 1.6, 1.0))]
    landmarker = Landmarker(models, tta="flip", device="cpu")
    want = []
    for model, meta in models:
        size, expand = meta["crop"]["size"], meta["crop"]["expand"]
        a = np.stack([crop_transform(b, expand, size) for b in BOXES])
        faces = np.stack([crop_one(IMAGE, m, size) for m in a])
        want.append(predict_original(model, meta, faces, a, "flip", 8, torch.device("cpu"))["final"])
    mean = (want[0] + want[1]) / 2
    np.testing.assert_allclose(landmarker.predict(IMAGE, BOXES), mean, atol=1e-9)
    bias = np.random.default_rng(3).normal(0, 2, (68, 2))
    landmarker.calibration = bias
    np.testing.assert_allclose(landmarker.predict(IMAGE, BOXES), mean - bias, atol=1e-9)
    per_fold = landmarker.predict_faces(lambda size, expand: (
        np.stack([crop_one(IMAGE, crop_transform(b, expand, size), size) for b in BOXES]),
        np.stack([crop_transform(b, expand, size) for b in BOXES])), per_model=True)
    np.testing.assert_allclose(per_fold, np.stack(want), atol=1e-9)
    np.testing.assert_allclose(landmarker.ensemble(per_fold, raw=True), mean, atol=1e-9)
    with pytest.raises(PipelineError, match=r"calibration must be a finite \(68, 2\) bias"):
        landmarker.calibration = np.zeros((5, 2))


class FlatMaps(Fixed):
    """`Fixed` with flat 16 x 16 heatmaps: it says nothing about where a point is, so its
    presence score is 0."""

    def forward_maps(self, x):
        return self(x), torch.full((x.shape[0], 68, 16, 16), 1 / 256)


class BlobMaps(Fixed):
    """`Fixed` whose 16 x 16 maps are one broad blob about the map's centre: the wider its
    scorer's radius, the more of the blob lies within reach of a point near the centre."""

    def forward_maps(self, x):
        grid = torch.arange(16, dtype=torch.float32) - 7.5
        blob = torch.exp(-(grid[:, None] ** 2 + grid[None] ** 2) / (2 * 3.0 ** 2))
        return self(x), (blob / blob.sum()).expand(x.shape[0], 68, 16, 16)


class PeakMaps(Fixed):
    """`Fixed` whose 16 x 16 maps put all their mass on its points: the plain view scores 1,
    and the mirrored view (the same points for a mirrored face) disagrees with it."""

    def forward_maps(self, x):
        cells = ((self.coords + 0.5) / 2 - 0.5).round().long().clamp(0, 15)  # input 32 px -> map 16 px
        maps = torch.zeros(x.shape[0], 68, 16, 16)
        maps[:, torch.arange(68), cells[:, 1], cells[:, 0]] = 1.0
        return self(x), maps


def _crops(size, expand):
    a = np.stack([crop_transform(b, expand, size) for b in BOXES])
    return np.stack([crop_one(IMAGE, m, size) for m in a]), a


def test_scored_predictions_are_the_plain_ones_with_each_models_own_presence_score():
    models = [(BlobMaps(COORDS[0]), {**_meta(32, 1.25), "presence": presence_stamp(0.5, 0.05)}),
              (BlobMaps(COORDS[1]), {**_meta(32, 1.25), "presence": presence_stamp(0.5, 0.2)}),
              (Fixed(COORDS[0]), _meta(40, 1.6))]
    landmarker = Landmarker(models, tta="flip", device="cpu")
    calls = []
    points, scores = landmarker.predict_faces(lambda size, expand: calls.append((size, expand)) or
                                              _crops(size, expand), per_model=True, scores=True)
    assert calls == [(32, 1.25), (40, 1.6)]  # once per geometry
    np.testing.assert_allclose(points, landmarker.predict_faces(_crops, per_model=True), atol=1e-9)
    for (model, meta), got in zip(models[:2], scores):
        want = predict_original(model, meta, *_crops(32, 1.25), "flip", 8, torch.device("cpu"),
                                presence=scorer(meta["presence"]["radius"], IBUG68.flip_perm))["presence"]
        np.testing.assert_allclose(got, want, atol=1e-9)
    assert (scores[1] > scores[0]).all() and np.isnan(scores[2]).all()  # the wider radius; no heatmaps
    # the ensemble's score: the mean of the models' that have heatmaps
    np.testing.assert_allclose(landmarker.predict(IMAGE, BOXES, scores=True)[1], scores[:2].mean(0), atol=1e-9)


def test_predict_on_a_list_detects_when_no_boxes_and_keeps_photos_apart(monkeypatch):
    import pipeline.inference.landmarker as lm

    seen = []
    monkeypatch.setattr(lm, "locate_faces", lambda image, max_faces=0, detector=None:
                        (seen.append((image.shape, max_faces, detector)) or BOXES[:1], BOXES[:1]))
    landmarker = Landmarker([(Fixed(COORDS[0]), _meta(32, 1.25))], tta="none", detector="haar")
    blank = np.zeros((50, 60, 3), np.uint8)
    out = landmarker.predict([IMAGE, blank], [BOXES, np.zeros((0, 4))])
    assert [p.shape for p in out] == [(2, 68, 2), (0, 68, 2)] and not seen
    np.testing.assert_allclose(out[0], landmarker.predict(IMAGE, BOXES))
    np.testing.assert_allclose(landmarker.predict(IMAGE, max_faces=1), landmarker.predict(IMAGE, BOXES[:1]))
    assert seen == [(IMAGE.shape, 1, "haar")]


def test_faces_on_a_list_converts_and_detects_each_photo_once_and_keeps_what_passes(monkeypatch):
    import pipeline.inference.landmarker as lm

    raw = BOXES + 1.5  # the detector's own boxes, told apart from the converted ones
    seen, converted = [], []
    monkeypatch.setattr(lm, "locate_faces", lambda image, max_faces=0, detector=None:
                        (seen.append(max_faces) or BOXES, raw))
    read = lm.as_photo
    monkeypatch.setattr(lm, "as_photo", lambda image, where="image": converted.append(where) or read(image, where))
    meta = {**_meta(32, 1.25), "presence": presence_stamp(0.0, 0.2)}  # every face passes
    points, scores = Landmarker([(FlatMaps(COORDS[0]), meta)], tta="none").predict(IMAGE, BOXES, scores=True)
    landmarker = Landmarker([(FlatMaps(COORDS[0]), meta)], tta="none")
    seen.clear(), converted.clear()
    blank = np.zeros((50, 60, 3), np.uint8)
    out = landmarker.faces([IMAGE, blank], max_faces=1)
    assert converted == ["images[0]", "images[1]"] and seen == [0, 0]  # all detections, then the largest face
    for faces in out:
        np.testing.assert_array_equal(faces.boxes, BOXES[:1])
        np.testing.assert_array_equal(faces.detector_boxes, raw[:1])
        assert faces.is_face.tolist() == [True] and faces.non_faces == 0
    np.testing.assert_allclose(out[0].points, points[:1], atol=1e-9)
    np.testing.assert_allclose(out[0].scores, scores[:1], atol=1e-9)
    # a threshold above every score: no face, or with keep_all every detection marked
    above = Landmarker([(FlatMaps(COORDS[0]), {**meta, "presence": presence_stamp(1.0, 0.2)})], tta="none")
    assert len(above.faces(IMAGE)) == 0 and above.faces(IMAGE).non_faces == 2
    marked = above.faces(IMAGE, keep_all=True)
    assert marked.is_face.tolist() == [False, False] and marked.non_faces == 2
    np.testing.assert_array_equal(marked.detector_boxes, raw)
    assert above.faces(IMAGE, BOXES, keep_all=True).detector_boxes is None  # boxes given
    # boxes given with the detector's own beside them (predict-image detects before it batches)
    seen.clear()
    (given,) = above.faces([IMAGE], [BOXES], keep_all=True, detector_boxes=[raw])
    np.testing.assert_array_equal(given.detector_boxes, raw)
    np.testing.assert_array_equal(given.boxes, BOXES)
    assert not seen
    with pytest.raises(PipelineError, match="one box per box of boxes_list"):
        above.faces([IMAGE], [BOXES], detector_boxes=[raw[:1]])


def test_models_of_other_schemas_and_tta_none_with_jitter_are_refused():
    with pytest.raises(PipelineError, match="tta_jitter 0.1 needs tta flip"):
        Landmarker([(Fixed(COORDS[0]), _meta(32, 1.25))], tta="none", jitter=0.1)
    with pytest.raises(PipelineError, match="tta must be none|flip"):
        Landmarker([(Fixed(COORDS[0]), _meta(32, 1.25))], tta="mirror")
    other = {**_meta(32, 1.25), "schema": {"name": "custom", "names": ["a"], "flip": [0], "eyes": None}}
    with pytest.raises(PipelineError, match="model is for schema 'custom'"):
        Landmarker([(Fixed(COORDS[0]), _meta(32, 1.25)), (Fixed(COORDS[1]), other)])


def test_the_presence_calibration_is_read_once_when_the_models_load():
    """Each model's presence calibration and the ensemble's threshold (the mean of theirs)
    are read from the metas at load: a bad stamp fails there, naming the model's file. A
    model without heatmaps has no score, so its (missing) threshold counts in neither the
    ensemble's score nor its threshold."""
    calibrated = {**_meta(32, 1.25), "presence": presence_stamp(0.4, 0.08)}
    landmarker = Landmarker([(FlatMaps(COORDS[0]), calibrated), (Fixed(COORDS[1]), _meta(32, 1.25))])
    assert [p["calibrated"] for p in landmarker.presence] == [True, False]
    assert [p["radius"] for p in landmarker.presence] == [0.08, PRESENCE_RADIUS]
    assert landmarker.presence_threshold == pytest.approx(0.4)
    two = Landmarker([(FlatMaps(COORDS[0]), calibrated),
                      (FlatMaps(COORDS[1]), {**_meta(32, 1.25), "presence": presence_stamp(0.6, keep=0.3)})])
    assert two.presence_threshold == pytest.approx(0.5) and two.presence_keep == pytest.approx((0.4 + 0.3) / 2)
    bad = {**_meta(32, 1.25), "presence": {"threshold": 2.0, "radius": 0.05}}
    with pytest.raises(PipelineError, match=r"^m\.pt: bad presence calibration"):
        Landmarker([(Fixed(COORDS[0]), bad)], paths=["m.pt"])


def test_an_uncalibrated_model_gates_nothing_and_says_so_once(caplog):
    """No threshold, no gate: every detection is a face, and one warning line says why,
    however often the gate is asked for. One uncalibrated model of an ensemble that scores
    leaves the whole ensemble without a gate."""
    landmarker = Landmarker([(FlatMaps(COORDS[0]), _meta(32, 1.25))], tta="none", paths=["m.pt"])
    caplog.set_level("WARNING")
    for _ in range(2):
        faces = landmarker.faces(IMAGE, BOXES)
        assert len(faces) == 2 and faces.is_face.all() and faces.non_faces == 0
    assert landmarker.presence_threshold is None and landmarker.presence_keep is None
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 1 and "m.pt" in lines[0] and "no face gate" in lines[0], lines
    mixed = Landmarker([(FlatMaps(COORDS[0]), {**_meta(32, 1.25), "presence": presence_stamp(0.4)}),
                        (FlatMaps(COORDS[1]), _meta(32, 1.25))], paths=["a.pt", "b.pt"])
    assert mixed.presence_threshold is None and len(mixed.faces(IMAGE, BOXES)) == 2


def test_the_score_reads_the_views_its_threshold_was_calibrated_on():
    """A threshold holds for the score it was chosen on: flip-calibrated, the score reads the
    plain and the mirrored view under tta none too (the mirrored view runs for it alone);
    none-calibrated, only the plain view, under flip too. The keypoints follow the tta."""
    scores, points = {}, {}
    for calibrated in ("flip", "none"):
        meta = {**_meta(32, 1.25), "presence": presence_stamp(0.5, tta=calibrated)}
        for tta in ("flip", "none"):
            points[calibrated, tta], scores[calibrated, tta] = Landmarker(
                [(PeakMaps(COORDS[0]), meta)], tta=tta).predict(IMAGE, BOXES, scores=True)
    for calibrated in ("flip", "none"):
        np.testing.assert_allclose(scores[calibrated, "none"], scores[calibrated, "flip"], atol=1e-6)
        assert np.abs(points[calibrated, "none"] - points[calibrated, "flip"]).max() > 1  # plain vs flip TTA
    np.testing.assert_allclose(scores["none", "none"], 1.0, atol=1e-6)  # the plain view's peaks are its points
    assert (scores["flip", "flip"] < 0.9).all()  # the mirrored view disagrees


def test_from_checkpoints_takes_its_options_by_name_only():
    """from_checkpoints(paths, *, ...): a positional option (the old `backend, device, tta`
    order) is a TypeError, not a silently misplaced setting."""
    params = list(inspect.signature(Landmarker.from_checkpoints).parameters.values())
    assert params[0].name == "paths" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert {p.kind for p in params[1:]} == {inspect.Parameter.KEYWORD_ONLY}
    with pytest.raises(TypeError):
        Landmarker.from_checkpoints(["a.pt"], "torch")


def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")
def test_the_readme_python_api_example(viz_ws, tmp_path, monkeypatch):
    """The README's example, as written, in a project folder with two fold checkpoints and a
    photo the installed detector finds a face in."""
    from pipeline.synth.moving_face import source_face

    code = _readme_example()
    assert len(code.strip().splitlines()) == 3
    for fold in (0, 1):
        (tmp_path / "models" / f"fold{fold}").mkdir(parents=True)
        shutil.copy(viz_ws["ckpt"], tmp_path / "models" / f"fold{fold}" / "best.pt")
    photo, box, _ = source_face()  # the test video's face, chosen for Haar
    cv2.imwrite(str(tmp_path / "face.jpg"), cv2.cvtColor(photo, cv2.COLOR_RGB2BGR))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    points, landmarker = scope["points"], scope["landmarker"]
    assert len(landmarker) == 2 and points.ndim == 3 and points.shape[1:] == (68, 2)
    assert len(points) >= 1 or get_detector("auto").name != "haar"
    assert np.isfinite(points).all()
    h, w = photo.shape[:2]
    assert (points > -w).all() and (points[..., 0] < 2 * w).all() and (points[..., 1] < 2 * h).all()
    np.testing.assert_array_equal(landmarker.predict(os.path.join(str(tmp_path), "face.jpg")), points)


class MeanColour(torch.nn.Module):
    """Every keypoint at (mean of channel 0, mean of channel 2) of the input, scaled onto it:
    a model whose answer moves with the pixels and their channel order."""

    def forward(self, x):
        m = x.mean((2, 3))  # (B, C)
        xy = torch.stack([m[:, 0], m[:, -1]], -1) * 4 + 16  # (B, 2)
        return xy[:, None, :].expand(x.shape[0], 68, 2)


def _colour_landmarker():
    return Landmarker([(MeanColour(), _meta(32, 1.25))], tta="none", device="cpu")


def test_grey_and_rgba_arrays_are_read_as_their_photo_files_would_be():
    """Issue 48: a grey (H, W) or (H, W, 1) array is replicated to RGB and an RGBA one loses
    its alpha, as `read_image` does with such photo files; a float or 16-bit image in range
    is the uint8 image it holds."""
    landmarker = _colour_landmarker()
    grey = IMAGE[..., 1]
    as_rgb = landmarker.predict(np.repeat(grey[..., None], 3, axis=2), BOXES)
    np.testing.assert_array_equal(landmarker.predict(grey, BOXES), as_rgb)
    np.testing.assert_array_equal(landmarker.predict(grey[..., None], BOXES), as_rgb)
    want = landmarker.predict(IMAGE, BOXES)
    assert not np.allclose(want, as_rgb)  # control: the model sees the colours
    rgba = np.dstack([IMAGE, np.full(IMAGE.shape[:2], 7, np.uint8)])
    np.testing.assert_array_equal(landmarker.predict(rgba, BOXES), want)
    np.testing.assert_array_equal(landmarker.predict(IMAGE.astype(np.float32), BOXES), want)
    np.testing.assert_array_equal(landmarker.predict(IMAGE.astype(np.uint16) * 257, BOXES), want)
    # photo files of the same kinds give the same answers
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cv2.imwrite(os.path.join(d, "grey.png"), grey)
        cv2.imwrite(os.path.join(d, "rgba.png"), rgba[..., [2, 1, 0, 3]])
        np.testing.assert_array_equal(landmarker.predict(os.path.join(d, "grey.png"), BOXES), as_rgb)
        np.testing.assert_array_equal(landmarker.predict(os.path.join(d, "rgba.png"), BOXES), want)


@pytest.mark.parametrize("image, needle", [
    (cv2.imencode(".png", IMAGE)[1].tobytes(), r"got bytes"),
    (IMAGE.astype(np.float64) * 2, r"float64 image with values outside 0-255 \(0 to 510\)"),
    (np.full((20, 20, 3), np.nan, np.float32), r"float32 image with values outside 0-255 \(nan"),
    (IMAGE[None], r"shape \(1, 120, 160, 3\)"),
    (np.zeros((120, 160, 5), np.uint8), r"shape \(120, 160, 5\)"),
    (np.zeros((0, 160, 3), np.uint8), r"shape \(0, 160, 3\)"),
    (IMAGE.astype(np.complex64), r"dtype complex64"),
    (IMAGE > 100, r"dtype bool"),
    (np.array([["a", "b"]]), r"dtype <U1"),
    (None, r"got None"),
])
def test_what_cannot_be_an_image_is_one_clear_error_naming_it(image, needle):
    """Issue 48: bytes, a float image outside 0-255, a wrong shape or dtype give one
    PipelineError line naming what was given, not an OpenCV or torch traceback."""
    landmarker = _colour_landmarker()
    with pytest.raises(PipelineError, match=needle) as e:
        landmarker.predict(image, BOXES)
    assert "\n" not in str(e.value)
    with pytest.raises(PipelineError, match=r"^images\[1\]: .*" + needle):
        landmarker.predict([IMAGE, image], [BOXES, BOXES])


@pytest.mark.parametrize("box, needle", [
    ([np.nan, 20, 50, 60], r"box \(left nan, top 20, 50x60\) is not finite"),
    ([30, 20, np.inf, 60], r"box \(left 30, top 20, infx60\) is not finite"),
    ([30, 20, 0, 60], r"box has non-positive size 0x60"),
    ([30, 20, 50, -60], r"box has non-positive size 50x-60"),
    ([1000, 900, 50, 60], r"box \(left 1000, top 900, 50x60\) lies outside the image \(160x120 px\)"),
    ([0, 0, 1e9, 1e9], r"box 1000000000x1000000000 is more than 3x the image \(160x120 px\)"),
])
def test_a_box_that_is_no_face_of_the_photo_is_one_clear_error_naming_it(box, needle):
    """A NaN, infinite, empty or negative box, one outside the photo or far larger than it,
    is one PipelineError line naming the box, whichever way it is given, not NaN or
    garbage points or an OpenCV traceback."""
    landmarker = _colour_landmarker()
    bad = np.array([BOXES[0], box], dtype=np.float64)
    calls = [lambda: landmarker.predict(IMAGE, bad), lambda: landmarker.predict(IMAGE, bad, scores=True),
             lambda: landmarker.faces(IMAGE, bad), lambda: landmarker.predict(IMAGE, bad[1])]
    for call, where in zip(calls, ["boxes[1]", "boxes[1]", "boxes[1]", "boxes[0]"]):
        with pytest.raises(PipelineError, match=rf"^{re.escape(where)}: {needle}") as e:
            call()
        assert "\n" not in str(e.value)
    for call in (landmarker.predict, partial(landmarker.predict, scores=True), landmarker.faces):
        with pytest.raises(PipelineError, match=rf"^boxes\[1\]\[1\]: {needle}"):
            call([IMAGE, IMAGE], [BOXES, bad])


@pytest.mark.parametrize("boxes, needle", [
    (np.zeros((2, 3)), r"got an array of shape \(2, 3\)"),
    (np.zeros((1, 2, 4)), r"got an array of shape \(1, 2, 4\)"),
    (np.arange(8.0), r"got an array of shape \(8,\)"),
    ([["30", "20", "50", "60"]], r"got an array of dtype <U2"),
    ("30,20,50,60", r"got str"),
    ([[30, 20, 50, 60], [1, 2]], r"got list"),
    (object(), r"got object"),
])
def test_what_cannot_be_boxes_is_one_clear_error_naming_it(boxes, needle):
    landmarker = _colour_landmarker()
    with pytest.raises(PipelineError, match=r"^boxes: " + needle) as e:
        landmarker.predict(IMAGE, boxes)
    assert "\n" not in str(e.value)
    with pytest.raises(PipelineError, match=r"^boxes\[1\]: " + needle):
        landmarker.predict([IMAGE, IMAGE], [BOXES, boxes])
    with pytest.raises(PipelineError, match=r"^boxes: 2 images need a list of box arrays"):
        landmarker.predict([IMAGE, IMAGE], 5)
    # what is fine: one box (4,), no box (0, 4) or [], ints
    assert landmarker.predict(IMAGE, BOXES[0]).shape == (1, 68, 2)
    assert landmarker.predict(IMAGE, []).shape == (0, 68, 2)
    np.testing.assert_array_equal(landmarker.predict(IMAGE, BOXES.astype(int)), landmarker.predict(IMAGE, BOXES))


@pytest.mark.parametrize("options, needle", [
    ({"batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
    ({"batch_size": 2.5}, r"batch_size must be an integer >= 1, got 2.5"),
    ({"jitter": float("nan")}, r"jitter must be a number in \[0, 0.5\], got nan"),
    ({"jitter": 0.9}, r"jitter must be a number in \[0, 0.5\], got 0.9"),
    ({"jitter": -0.1}, r"jitter must be a number in \[0, 0.5\], got -0.1"),
    ({"amp": "fast"}, r"amp must be auto, on, off, bf16 or fp16, got 'fast'"),
])
def test_options_outside_the_predict_params_range_are_refused_before_any_model_loads(options, needle):
    """The Landmarker's options take what the predict params they stand for take
    (params_schema: tta_jitter 0-0.5, batch_size >= 1, amp): one line naming the option,
    from the constructor and from `from_checkpoints` before it reads a checkpoint."""
    with pytest.raises(PipelineError, match="^" + needle + "$"):
        Landmarker([(MeanColour(), _meta(32, 1.25))], device="cpu", **options)
    with pytest.raises(PipelineError, match="^" + needle + "$"):
        Landmarker.from_checkpoints(["absent.pt"], device="cpu", **options)
    ok = {"batch_size": np.int64(3), "jitter": np.float32(0.25)}
    assert Landmarker([(MeanColour(), _meta(32, 1.25))], device="cpu", **ok).batch_size == 3
