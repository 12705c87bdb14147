"""`Landmarker`: the one keypoint predictor, and the package's Python API
(`from pipeline import Landmarker`). It holds one or more models (fold checkpoints or
exported .onnx files) and owns everything between a photo and its keypoints:

* cropping each face as each model was trained (its checkpoint's crop side and expand;
  models of one geometry share the crops),
* flip and scale/shift (jitter) TTA (pipeline/inference/tta.py `predict_original`),
* the fold ensemble: the mean over models, here and nowhere else,
* the optional OOF calibration: a per-keypoint bias (K, 2) subtracted from that mean,
* the way back to the photo's pixels (crop transform, the labels' pixel origin),
* face detection (pipeline/detection) when no boxes are given,
* the face-presence score of every face (pipeline/inference/presence.py: `faces`,
  `predict(..., scores=True)`) and the per-frame tracker of live video (`tracker`,
  pipeline/inference/live.py).

The predict stage, `submit --xml`, predict-image, predict-video, morph and bench's accuracy
timing all predict through it."""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import numpy as np
import torch
from pydantic import ValidationError

from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import PredictParams, VideoParams, requirement, section_fields
from pipeline.detection.detectors import locate_faces
from pipeline.formats.annotations import crop_faces, load_xml
from pipeline.formats.checkpoint import checkpoint_crop, checkpoint_presence
from pipeline.formats.photos import Photo, as_photo
from pipeline.inference.live import Tracker
from pipeline.inference.predictor import load_predictor
from pipeline.inference.presence import Scorer, is_face, scorer, select_faces
from pipeline.inference.tta import predict_original
from pipeline.keypoints.geometry import check_box, crop_face
from pipeline.keypoints.schema import KeypointSchema, check_schema, schema_from_dict

log = logging.getLogger(__name__)

TTA_MODES = ("none", "flip")

# (crop side, expand) -> (crops uint8 (N, S, S, 3), crop_to_orig float64 (N, 2, 3)): every
# face cropped at one geometry, in one order
CropFn = Callable[[int, float], tuple[np.ndarray, np.ndarray]]


def check_tta(tta: str, jitter: float, where: str | os.PathLike | None = None, prefix: str = "") -> None:
    """tta must be none|flip; jitter views only with flip: the OOF predictions come in two
    kinds (flip TTA with the jitter views, and one plain view), and a jittered prediction
    without flip would be a third that neither the OOF scores nor the OOF calibration measure.
    `prefix` ('predict.') names the params in the message."""
    if tta not in TTA_MODES:
        raise PipelineError(where, f"{prefix}tta must be none|flip, got '{tta}'")
    if tta == "none" and jitter > 0:
        raise PipelineError(where, f"{prefix}tta_jitter {jitter:g} needs {prefix}tta flip (the jitter views are "
                                   f"scored out of fold only with flip TTA); set {prefix}tta_jitter 0 or "
                                   f"{prefix}tta flip")


# the Landmarker's options and the predict params whose values they take
OPTION_PARAMS = {"jitter": "tta_jitter", "batch_size": "batch_size", "amp": "amp"}


def check_options(tta: str, jitter: float, batch_size: int, amp: str) -> None:
    """The Landmarker's options take what the predict params they stand for take
    (pipeline/core/params_schema.py: jitter within 0-0.5, batch_size an integer >= 1, ...),
    and tta with jitter what `check_tta` allows: one PipelineError naming the option otherwise."""
    fields = section_fields("predict")
    for name, value in (("jitter", jitter), ("batch_size", batch_size), ("amp", amp)):
        key = OPTION_PARAMS[name]
        value = value.item() if isinstance(value, np.generic) else value
        try:
            PredictParams.model_validate({key: value})
        except ValidationError:
            raise PipelineError(None, f"{name} must be {requirement(fields[key])}, got {value!r}") from None
    check_tta(tta, jitter)


def _expand_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """A path, a glob pattern ('models/fold*/best.pt', sorted) or a list of paths."""
    if isinstance(paths, (str, os.PathLike)):
        text = str(paths)
        if not Path(text).exists() and glob.has_magic(text):
            found = sorted(glob.glob(text))
            if not found:
                raise PipelineError(text, "matches no checkpoint")
            return [Path(p) for p in found]
        return [Path(text)]
    return [Path(p) for p in paths]


def _one_or_many(images: Photo | Sequence[Photo], *per_photo: Any) -> tuple[bool, list[Photo], list[Any]]:
    """(one photo?, the photos as a list, each of `per_photo` (None, or one photo's value, or
    a list of them) as a list too): a list or tuple of images is many photos, anything else
    is one (as_photo then says what it is not)."""
    if isinstance(images, (list, tuple)):
        return False, list(images), list(per_photo)
    return True, [cast(Photo, images)], [None if value is None else [value] for value in per_photo]


BOXES_WANTED = "expected boxes (M, 4) of numbers [left, top, width, height], or one box (4,)"


def as_boxes(boxes: Any, image: np.ndarray, where: str = "boxes") -> np.ndarray:
    """One photo's face boxes (M, 4) float64 [left, top, width, height] from an array-like of
    them (one box (4,) is one face; [] none). What is not numbers of that shape, and a box
    `check_box` refuses for `image` (not finite, of no positive size, outside the photo or
    far larger than it), is one PipelineError naming it at `where` (a box: where[j])."""
    what = type(boxes).__name__
    try:
        arr = None if isinstance(boxes, (str, bytes)) else np.asarray(boxes)
    except (ValueError, TypeError):  # ragged nested lists
        arr = None
    if arr is None or arr.dtype == object:
        raise PipelineError(None, f"got {what}, {BOXES_WANTED}", where)
    if arr.dtype.kind not in "iuf":
        raise PipelineError(None, f"got an array of dtype {arr.dtype}, {BOXES_WANTED}", where)
    if arr.shape in ((0,), (4,)):
        arr = arr.reshape(-1, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise PipelineError(None, f"got an array of shape {arr.shape}, {BOXES_WANTED}", where)
    arr = arr.astype(np.float64)
    for j, box in enumerate(arr):
        bad = check_box(box, image.shape[1], image.shape[0])
        if bad:
            raise PipelineError(None, bad, f"{where}[{j}]")
    return arr


@dataclass
class Faces:
    """The faces of one photo, largest first: boxes (M, 4) [left, top, width, height] in the
    training convention, points (M, K, 2) in image pixels, scores (M,) the face-presence
    score (NaN for a model without heatmaps), is_face (M,) score >= the models' threshold,
    detector_boxes (M, 4) the detector's own boxes (None when the boxes were given),
    non_faces how many of the photo's boxes scored below the threshold (left out, or kept
    with is_face False)."""

    boxes: np.ndarray
    points: np.ndarray
    scores: np.ndarray
    is_face: np.ndarray
    detector_boxes: np.ndarray | None = None
    non_faces: int = 0

    def __len__(self) -> int:
        return len(self.boxes)


class Landmarker:
    """Keypoints (M, K, 2), x then y in image pixels, of the faces in photos.

    models: [(model, meta)] as `pipeline.inference.predictor.load_predictor` returns them
    (`from_checkpoints` loads them). tta: none | flip; jitter: the scale/shift views of
    pipeline/keypoints/views.py (0 = off); calibration: None or a (K, 2) bias subtracted from
    the fold mean; device, batch_size, amp (auto | on | off | bf16 | fp16): how the models run;
    detector: auto | mtcnn | dlib | haar, for photos given without boxes; paths: where the
    models came from (for error lines); schema: the models' (default: the first one's)."""

    def __init__(self, models: Sequence[tuple[Any, dict]], *, tta: str = "flip", jitter: float = 0.0,
                 calibration: np.ndarray | None = None, device: str | torch.device = "cpu", batch_size: int = 64,
                 amp: str = "auto", detector: str = "auto", paths: Sequence[str | os.PathLike] | None = None,
                 schema: KeypointSchema | None = None):
        if not models:
            raise PipelineError(None, "no checkpoints given")
        check_options(tta, jitter, batch_size, amp)
        self.models = [m for m, _ in models]
        self.metas = [meta for _, meta in models]
        self.paths = [None] * len(models) if paths is None else [Path(p) for p in paths]
        self.schema: KeypointSchema = schema or schema_from_dict(self.metas[0]["schema"])
        for meta, path in zip(self.metas, self.paths):
            check_schema(meta["schema"], self.schema, path, "model", "the others for")
        self.geometries = [checkpoint_crop(meta, path) for meta, path in zip(self.metas, self.paths)]
        # each model's face-presence calibration ({"threshold", "keep", "radius", "tta",
        # "calibrated", "why", ...}, pipeline/formats/checkpoint.py `checkpoint_presence`) and
        # whether it gives a score at all (heatmaps): the ensemble's gate is `presence_threshold`
        self.presence = [checkpoint_presence(meta, path) for meta, path in zip(self.metas, self.paths)]
        self._scoring = np.array([hasattr(m, "forward_maps") for m in self.models], dtype=bool)
        self._gate_warned = False
        self.tta, self.jitter = tta, float(jitter)
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.batch_size, self.amp, self.detector = int(batch_size), amp, detector
        self.calibration = calibration

    @classmethod
    def from_checkpoints(cls, paths: str | os.PathLike | Sequence[str | os.PathLike], *,
                         backend: str | None = "torch", device: str | torch.device = "auto", tta: str = "flip",
                         jitter: float = 0.0, calibration: np.ndarray | None = None, batch_size: int = 64,
                         amp: str = "auto", detector: str = "auto", schema: KeypointSchema | None = None,
                         threads: int | None = None) -> Landmarker:
        """Load checkpoints (.pt) or exported models (.onnx, always on onnxruntime); `paths`
        may be a glob pattern. backend: torch | onnx (None: by file suffix); threads: the
        onnxruntime session's. All must share `schema` (default: the first one's)."""
        paths = _expand_paths(paths)
        if not paths:
            raise PipelineError(None, "no checkpoints given")
        check_options(tta, jitter, batch_size, amp)
        dev = resolve_device(device) if isinstance(device, str) else device
        models = []
        for p in paths:
            model, meta = load_predictor(p, backend, dev, schema=schema, threads=threads)
            schema = schema or schema_from_dict(meta["schema"])
            models.append((model, meta))
        return cls(models, tta=tta, jitter=jitter, calibration=calibration, device=dev, batch_size=batch_size,
                   amp=amp, detector=detector, paths=paths, schema=schema)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def calibration(self) -> np.ndarray | None:
        """The per-keypoint bias (K, 2) subtracted from the fold mean, or None."""
        return self._calibration

    @calibration.setter
    def calibration(self, bias: np.ndarray | None) -> None:
        if bias is not None:
            bias = np.asarray(bias, dtype=np.float64)
            if bias.shape != (self.schema.k, 2) or not np.isfinite(bias).all():
                raise PipelineError(None, f"calibration must be a finite ({self.schema.k}, 2) bias, "
                                          f"got shape {bias.shape}")
        self._calibration = bias

    # ------------------------------------------------------------------ the ensemble

    def ensemble(self, per_fold: np.ndarray, raw: bool = False) -> np.ndarray:
        """The fold ensemble of per-model predictions (F, N, K, 2) -> (N, K, 2): their mean,
        minus the calibration bias when one is set (unless `raw`)."""
        mean = np.asarray(per_fold).mean(0)
        return mean if raw or self._calibration is None else mean - self._calibration

    def check_crops(self, size: int, expand: float, where: str | os.PathLike | None = None) -> None:
        """Faces cropped at (size, expand) (a face cache) fit every model: each predicts only
        faces cropped as in its training."""
        for path, (want_size, want_expand) in zip(self.paths, self.geometries):
            if (want_size, want_expand) != (int(size), float(expand)):
                raise PipelineError(path, f"trained on {want_size} px crops with expand {want_expand:g}, but the "
                                          f"cache {where} holds {int(size)} px crops with expand {float(expand):g} "
                                          "(rerun `pipeline crop` with the training's crop params, or retrain)")

    def _predict_model(self, i: int, crops: np.ndarray, crop_to_orig: np.ndarray, tta: str,
                       progress: bool, presence: Scorer | None = None) -> dict[str, np.ndarray]:
        return predict_original(self.models[i], self.metas[i], crops, crop_to_orig, tta, self.batch_size,
                                self.device, progress=progress, amp=self.amp, amp_key="predict.amp",
                                jitter=self.jitter, presence=presence)

    def predict_cached(self, crops: np.ndarray, crop_to_orig: np.ndarray, *, models: Sequence[int] | None = None,
                       tta: str | None = None, progress: bool = False) -> dict[str, np.ndarray]:
        """Per-model predictions, original pixels, of faces already cropped at the models'
        geometry (a face cache: see `check_crops`): {"final": (F, N, K, 2) what the ensemble
        averages, "plain": no TTA, and with flip or jitter "tta"}, F = len(models) (indices,
        default all). `tta` overrides the Landmarker's (the predict stage scores out-of-fold
        faces with flip, to keep both kinds)."""
        idx = range(len(self)) if models is None else list(models)
        views = [self._predict_model(i, crops, crop_to_orig, tta or self.tta, progress) for i in idx]
        return {k: np.stack([v[k] for v in views]) for k in views[0] if k != "flip"}

    def _per_model_outputs(self, crop: CropFn, progress: bool, scored: bool) -> list[dict[str, np.ndarray]]:
        """Every model's `predict_original` output for the faces `crop(size, expand)` gives,
        cropped once per geometry; `scored`: with each face's presence score ("presence")."""
        by_geometry: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {}
        outs = []
        for i, geometry in enumerate(self.geometries):
            if geometry not in by_geometry:
                by_geometry[geometry] = crop(*geometry)
            crops, crop_to_orig = by_geometry[geometry]
            outs.append(self._predict_model(i, crops, crop_to_orig, self.tta, progress,
                                            self._scorer(i) if scored else None))
        return outs

    def _scorer(self, i: int) -> Scorer:
        """Model i's presence score on the views its threshold was calibrated on (a threshold
        holds only for the score it was chosen on), whatever the keypoints' TTA; on the
        keypoints' views when it has none."""
        views = self.presence[i]["tta"] or self.tta
        return scorer(self.presence[i]["radius"], self.metas[i]["schema"]["flip"] if views == "flip" else None)

    def predict_faces(self, crop: CropFn, progress: bool = False, *, per_model: bool = False,
                      scores: bool = False) -> Any:
        """The ensemble (N, K, 2) of the faces `crop(size, expand)` gives, cropped once per
        geometry; per_model: every model's final predictions (F, N, K, 2) instead. scores:
        (points, face-presence scores) instead: every model's (F, N) with per_model, else their
        mean (N,) over the models that give one (heatmaps; NaN when none does), the models
        whose thresholds `presence_threshold` averages."""
        outs = self._per_model_outputs(crop, progress, scored=scores)
        points = np.stack([out["final"] for out in outs])
        if not per_model:
            points = self.ensemble(points)
        if not scores:
            return points
        each = np.stack([out["presence"] for out in outs])
        if per_model:
            return points, each
        return points, each[self._scoring].mean(0) if self._scoring.any() else np.full(each.shape[1], np.nan)

    # ------------------------------------------------------------------ photos

    def detect(self, image: np.ndarray, max_faces: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(boxes in the training convention (M, 4), raw detector boxes (M, 4)), largest first."""
        return locate_faces(image, max_faces, self.detector)

    def predict(self, images: Photo | Sequence[Photo], boxes: Any = None, *, max_faces: int = 0,
                scores: bool = False) -> Any:
        """Keypoints (M, K, 2) in image pixels of the faces in one photo (an RGB uint8 array
        (H, W, 3) or a photo path; grey, RGBA, 16-bit and float arrays as
        pipeline/formats/photos.py `as_photo` reads them), or a list of them (one per photo) for
        a list or tuple of photos, whose faces go through each model together in batches of
        batch_size. boxes: (M, 4) [left, top, width, height] in the training convention (the
        competition XML's), a list of them for a list of photos; None: the detector's faces
        (max_faces: the largest N, 0 all). scores: (points, face-presence scores (M,)) instead,
        every face kept whatever its score (`faces` gates them)."""
        one, photos, (boxes_list,) = _one_or_many(images, boxes)
        boxes_list, _, crop = self._faces_of(photos, boxes_list, max_faces)
        out = self._by_photo([len(b) for b in boxes_list], crop, scores)
        return out[0] if one else out

    def _faces_of(self, images: Sequence[np.ndarray | str | os.PathLike], boxes_list: Sequence[np.ndarray] | None,
                  max_faces: int, detector_boxes: Sequence[np.ndarray] | None = None
                  ) -> tuple[list[np.ndarray], list[np.ndarray | None], CropFn]:
        """The faces of several photos (their boxes, or the detector's): each photo's boxes
        (M_i, 4), the detector's own boxes of each (or `detector_boxes`, given beside the boxes;
        None without), and the `crop(size, expand)` that cuts all of them, in order."""
        photos = [as_photo(im, "image" if len(images) == 1 else f"images[{i}]") for i, im in enumerate(images)]
        if boxes_list is None:
            found = [self.detect(im, max_faces) for im in photos]
            boxes_list = [np.asarray(boxes, dtype=np.float64).reshape(-1, 4) for boxes, _ in found]
            detector_boxes = [raw for _, raw in found]
        elif not hasattr(boxes_list, "__len__"):
            raise PipelineError(None, f"{len(photos)} images need a list of box arrays, one per image", "boxes")
        elif len(boxes_list) != len(photos):
            raise PipelineError(None, f"{len(photos)} images but {len(boxes_list)} box arrays")
        else:
            boxes_list = [as_boxes(b, im, "boxes" if len(photos) == 1 else f"boxes[{i}]")
                          for i, (b, im) in enumerate(zip(boxes_list, photos))]
        raw_list: list[np.ndarray | None] = [None] * len(photos)
        if detector_boxes is not None:
            raw = [np.asarray(b, dtype=np.float64).reshape(-1, 4) for b in detector_boxes]
            if [len(b) for b in raw] != [len(b) for b in boxes_list]:
                raise PipelineError(None, "detector_boxes must hold one box per box of boxes_list")
            raw_list = list(raw)
        photo_of = [im for im, boxes in zip(photos, boxes_list) for _ in boxes]  # the photo of every face
        all_boxes = [b for boxes in boxes_list for b in boxes]

        def crop(size: int, expand: float) -> tuple[np.ndarray, np.ndarray]:
            faces, a = zip(*(crop_face(im, b, expand, size) for im, b in zip(photo_of, all_boxes)))
            return np.stack(faces), np.stack(a)

        return boxes_list, raw_list, crop

    def predict_xml(self, xml_path: str | os.PathLike, n_jobs: int = 1) -> np.ndarray:
        """Keypoints (N, K, 2) of every face of a competition-format XML (its boxes), cropped
        from its photos as `pipeline crop` crops them, in the XML's order."""
        faces = load_xml(xml_path, self.schema, require_parts=False)
        return self.predict_faces(lambda size, expand: crop_faces(faces, Path(xml_path).parent, size, expand,
                                                                  n_jobs, xml_path))

    # ------------------------------------------------------------------ face presence

    @property
    def presence_threshold(self) -> float | None:
        """The ensemble's face gate: the mean threshold of the models that give a score (a model
        without heatmaps counts in neither the score nor this); None, no gate, when one of
        them has no threshold (never calibrated, or faces and non-faces did not separate), said
        in one warning line the first time."""
        return self._gate("threshold")

    @property
    def presence_keep(self) -> float | None:
        """The lower gate that keeps a track (the mean of the scoring models' `keep`), None
        when `presence_threshold` is."""
        return self._gate("keep")

    def _gate(self, key: str) -> float | None:
        scoring = [(p, path) for p, path, s in zip(self.presence, self.paths, self._scoring) if s]
        missing = [(p, path) for p, path in scoring if p["threshold"] is None]
        if missing:
            if not self._gate_warned:
                p, path = missing[0]
                log.warning("%s: %s: no face gate, every detection counts as a face", path or "a model", p["why"])
                self._gate_warned = True
            return None
        return float(np.mean([p[key] for p, _ in scoring])) if scoring else None

    def _by_photo(self, counts: Sequence[int], crop: CropFn, scores: bool) -> list[Any]:
        """`predict_faces` of the faces `crop` cuts, split into photos of `counts` faces: each
        photo's points (M_i, K, 2), or with `scores` (points, scores (M_i,))."""
        if not sum(counts):
            empty = np.zeros((0, self.schema.k, 2))
            return [(empty, np.zeros(0)) if scores else empty for _ in counts]
        cut = np.cumsum(counts)[:-1]
        if not scores:
            return np.split(self.predict_faces(crop), cut)
        points, face_scores = self.predict_faces(crop, scores=True)
        return list(zip(np.split(points, cut), np.split(face_scores, cut)))

    def faces(self, images: Photo | Sequence[Photo], boxes: Any = None, *, max_faces: int = 0,
              keep_all: bool = False, detector_boxes: Any = None) -> Any:
        """The faces of one photo (`Faces`), or of a list or tuple of photos (a list of
        `Faces`): detected (or `boxes`, as `predict` takes them), predicted and scored together;
        what scores below the presence threshold is no face and is left out (`keep_all`: kept,
        with is_face False). max_faces: the largest N faces that pass (0: all). detector_boxes:
        with `boxes` from a detector, its own boxes (one per box), kept beside them."""
        one, photos, (boxes_list, raw_given) = _one_or_many(images, boxes, detector_boxes)
        # all the detector's faces: a non-face must not take a face's place
        boxes_list, raw_list, crop = self._faces_of(photos, boxes_list, 0, raw_given)
        threshold = self.presence_threshold
        out = []
        for boxes_i, raw, (points, scores) in zip(boxes_list, raw_list,
                                                  self._by_photo([len(b) for b in boxes_list], crop, scores=True)):
            keep, face = select_faces(scores, threshold, max_faces, keep_all)
            out.append(Faces(boxes_i[keep], points[keep], scores[keep], face, None if raw is None else raw[keep],
                             int((~is_face(scores, threshold)).sum())))
        return out[0] if one else out

    def tracker(self, video: VideoParams | None = None, *, smoothing: str = "one_euro", detect=None,
                presence: bool | None = None) -> Tracker:
        """A per-frame face tracker for live sources (pipeline/inference/live.py):
        `faces = tracker.update(frame, t)`. video: the tracking params (default: the working
        directory's params.yaml `video` section, as predict-video reads it); smoothing: one_euro (causal, the default) | none; presence: gate by the
        models' threshold (default video.presence)."""
        return Tracker(self, video, smoothing=smoothing, detect=detect, presence=presence)
