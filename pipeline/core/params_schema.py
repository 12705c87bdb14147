"""The params schema, in one place: one pydantic model per section of `params.yaml`, each
field with its type, range or choices, one-line doc and whether it can change a result
(`docs/params.md` is generated from these models: `pipeline params --doc`), the rules
between keys (`check_params`) and the words an error uses for a bad value. Reading params
files, `--set` overrides and the command-line options is pipeline/core/config.py."""

from __future__ import annotations

import math
import os
import re
import warnings
from typing import Annotated, Any, Callable, Literal, Optional, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from pipeline.core.errors import PipelineError
from pipeline.core.paths import DEMO_DIR

# What a param may change, beyond its value being recorded:
#   speed_only: how fast a stage runs, never a byte of what it writes: left out of the
#     params.resolved.yaml files, of train's resume key and crop's run id, and of dvc.yaml's
#     params (tests/test_dvc.py checks dvc.yaml), so that changing one re-runs nothing
#   runtime: where and how a training runs (device, workers, compilation, heap policy):
#     trains the same weights, so left out of train's identity, its params.resolved.yaml
#     and dvc.yaml's params: a checkpoint resumes across a change, which re-runs nothing
SPEED_ONLY_MARK = "speed_only"
RUNTIME_MARK = "runtime"

# On/off switches: fields whose choices include "on" and "off" (train.amp,
# train.channels_last, ...). YAML reads on/off/yes/no/true/false as booleans; for a switch
# they mean "on"/"off".
SWITCH_DEFAULTS = ("auto", "on", "off")
Switch = Literal["auto", "on", "off"]
Amp = Literal["auto", "on", "off", "bf16", "fp16"]


def param(default: Any, doc: str, *, speed_only: bool = False, runtime: bool = False,
          must: str | None = None, **constraints: Any) -> Any:
    """A field: its default, one-line doc, range (ge/gt/le/lt) and what it may change.
    `must` words the requirement in errors when the range alone cannot (a regex, a list)."""
    extra: dict[str, JsonValue] = {k: v for k, v in ((SPEED_ONLY_MARK, speed_only), (RUNTIME_MARK, runtime),
                                                     ("must", must)) if v}
    return Field(default, description=doc, json_schema_extra=extra or None, **constraints)


def holds(rule: Callable[[Any], bool]) -> AfterValidator:
    """A field's rule beyond its type and range (`Annotated[int, holds(...)]`): a value
    breaking it is refused in the words of the field's `must`."""

    def check(value: Any) -> Any:
        if not rule(value):
            raise ValueError("breaks the field's rule")
        return value

    return AfterValidator(check)


class Section(BaseModel):
    """One section of params.yaml: strict types (a bool is not an int, a string not a
    number; an int is taken for a float), finite floats, no unknown keys, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _yaml_spellings(cls, data: Any) -> Any:
        """YAML's booleans for a switch mean on/off; null for a mapping that takes no null
        (data.extra_train, model.options) means an empty one."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if field and isinstance(value, bool) and is_switch(field):
                out[name] = "on" if value else "off"
            elif field and value is None and _base_types(field.annotation) == [dict]:
                out[name] = {}
        return out


# a validator's complaint that is already the whole sentence (it names the keys at fault),
# shown as it is instead of the field's requirement
PARAM_RULE = "param_rule"


def is_switch(field: FieldInfo) -> bool:
    """An on/off field (train.amp, video.smooth, ...): its choices hold both on and off."""
    choices = _choices(field) or ()
    return "on" in choices and "off" in choices


def _extra(field: FieldInfo) -> dict:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def is_speed_only(field: FieldInfo) -> bool:
    return bool(_extra(field).get(SPEED_ONLY_MARK))


def is_runtime(field: FieldInfo) -> bool:
    return bool(_extra(field).get(RUNTIME_MARK))


# a data.extra_train name: a DVC stage item (crop-extra@NAME), an argument and a folder name
EXTRA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


with warnings.catch_warnings():  # `schema` shadows BaseModel's deprecated classmethod, on purpose
    warnings.filterwarnings("ignore", message='Field name "schema"')

    class DataParams(Section):
        dir: Optional[str] = param(None, "dataset folder holding the two XMLs; null = the embedded demo set")
        train_xml: str = param("labels_ibug_300W_train.xml", "training annotations, relative to data.dir")
        test_xml: str = param("labels_ibug_300W_test_parsed.xml", "test annotations, relative to data.dir")
        solution: str = param("solution.csv", "truth of the test set, relative to data.dir; scored when present")
        schema: str = param("ibug68", "keypoint layout: ibug68 | nose1 | custom")  # type: ignore[assignment]  # shadows BaseModel.schema on purpose
        custom_schema: Optional[dict[str, Any]] = param(None, "with schema: custom -> {names, flip, eyes}")
        # coordinate of the first pixel's centre in the labels: 0 = dlib / OpenCV, 1 = the
        # 1-based Matlab convention of the 300-W .pts files. Internally pixel centres sit at
        # 0, 1, ...; a wrong origin makes mirrored training samples disagree by 2 * origin px
        # in x (the flip maps x -> W - 1 - x) and biases predictions by -origin px in x
        label_origin: float = param(0.0, "coordinate of the first pixel's centre in the labels: 0 = dlib / OpenCV, "
                                         "1 = 1-based (300-W .pts)", ge=-1e3, le=1e3)
        # train-only faces: each folder is in the competition layout with its own train_xml
        # (same schema, label_origin and crop as data.dir); `pipeline crop-extra NAME` caches
        # it in data/extra/NAME, and its faces join the training side of every fold
        extra_train: dict[str, str] = param(
            {}, "extra training faces, never validated: {name: folder with its own train_xml}, folders relative "
                "to the repo root or absolute (docs/recipes.md, Adding your own training faces)",
            must="a mapping of names (letters, digits, _ and -, not starting with -) to distinct folders, "
                 "none of them data.dir")

        @field_validator("extra_train")
        @classmethod
        def _extra_folders(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
            """Names usable as a DVC stage item, a command argument and a folder name; no
            folder given twice, none the main one (its faces are validated)."""
            main = info.data.get("dir") or DEMO_DIR
            seen: dict[str, str] = {}
            for name, folder in v.items():
                if not EXTRA_NAME.fullmatch(name):
                    raise PydanticCustomError(PARAM_RULE, f"'data.extra_train' name {name!r} must be letters, "
                                                          "digits, _ and - (not starting with -)")
                if not folder:
                    raise PydanticCustomError(PARAM_RULE, f"'data.extra_train.{name}' must be a folder, got ''")
                real = os.path.realpath(folder)
                if real == os.path.realpath(main):
                    raise PydanticCustomError(PARAM_RULE, f"'data.extra_train.{name}' is data.dir ({main}): its "
                                                          "faces are already trained on and validated")
                if real in seen:
                    raise PydanticCustomError(PARAM_RULE, f"'data.extra_train.{seen[real]}' and "
                                                          f"'data.extra_train.{name}' are the same folder "
                                                          f"({folder}): give each folder once")
                seen[real] = name
            return v


class DemoParams(Section):
    n_train: int = param(400, "synthetic training faces", ge=1)
    n_test: int = param(60, "synthetic test faces (truth goes to solution.csv)", ge=1)
    seed: int = param(0, "same seed -> byte-identical XML and CSV", ge=0)
    layout: Literal["flat", "300w"] = param(
        "flat", "flat (images/train, images/test) | 300w (the full set's folders, names, mirrors)")


class CropParams(Section):
    expand: float = param(1.25, "box side is scaled by this before the square crop", gt=0, le=10)
    # not "size": DVC's run cache ignores params named size (treeverse/dvc#10296), so a
    # change would not re-run crop
    side: int = param(64, "cached face side in pixels (uint8, N x side x side x 3)", ge=8, le=4096)
    n_jobs: Annotated[int, holds(lambda n: n != 0)] = param(
        2, "joblib workers (negative: all cores but n+1)", speed_only=True,
        must="a nonzero integer (negative: all cores but n+1)")


# photo groups (kept in one fold): a regex matched against each image path without its
# extension; its named group 'photo' is the group. The default is 300-W's naming (face
# _1.._99, mirror _mirror): see pipeline.formats.annotations.photo_group
GROUP_REGEX = r"^(?P<photo>.+?)(?:_\d{1,2})?(?:_mirror)?$"


def _has_photo_group(regex: str) -> bool:
    try:
        return "photo" in re.compile(regex).groupindex
    except re.error:
        return False


class FoldsParams(Section):
    k: int = param(5, "number of folds", ge=2)
    seed: int = param(0, "shuffling of photo groups", ge=0)
    train: Annotated[list[int], holds(lambda folds: all(f >= 0 for f in folds))] = param(
        [0, 1, 2, 3, 4], "folds that get a train stage in dvc.yaml (each < k, each once)",
        must="a list of fold numbers (integers >= 0)")
    group_regex: Annotated[str, holds(_has_photo_group)] = param(
        GROUP_REGEX, "photo groups kept in one fold: a regex on each image path without its extension, its named "
                     "group 'photo' is the group", must="a regex with a named group (?P<photo>...)")


# The options each model preset takes (`model.options`) and their types, so that a params
# file is checked when it is loaded, before torch is imported or a model is built: the keys of
# each preset's constructor (pipeline/models; tests/models/test_registry.py keeps the two
# equal). Kinds: int, number, bool, string, ints (a list of integers); "... or null".
_RESUNET_OPTIONS = {"block": "string", "depths": "ints", "width": "number", "stem_widths": "ints",
                    "decoder_widths": "ints or null", "decoder_block": "string or null", "upsample": "string",
                    "blurpool": "bool", "act": "string", "input_skip": "bool", "zero_init_last": "bool",
                    "decoder_levels": "int", "map_upsample": "int"}
MODEL_OPTIONS: dict[str, dict[str, str]] = {
    "resunet72": _RESUNET_OPTIONS, "resunet-tiny": _RESUNET_OPTIONS, "resunet18-cpu": _RESUNET_OPTIONS,
    "resunet26-half": _RESUNET_OPTIONS, "resunet-fast": _RESUNET_OPTIONS,
    "vgg-seed": {"widths": "ints", "convs": "ints", "fc_width": "int", "act": "string"},
    "resnet50-fc": {},
}
_OPTION_WORDS = {"int": "an integer", "number": "a number", "bool": "true or false", "string": "a string",
                 "ints": "a list of integers"}


def _option_ok(kind: str, value: Any) -> bool:
    if kind.endswith(" or null") and value is None:
        return True
    kind = kind.removesuffix(" or null")
    if kind == "int":
        return type(value) is int
    if kind == "number":
        return type(value) in (int, float) and math.isfinite(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    return isinstance(value, list) and all(type(v) is int for v in value)  # ints


def _option_words(kind: str) -> str:
    base = kind.removesuffix(" or null")
    return _OPTION_WORDS[base] + (" or null" if base != kind else "")


class ModelParams(Section):
    model_config = ConfigDict(protected_namespaces=())
    preset: str = param("resunet-tiny", "registry name, see `pipeline models`")
    input_size: int = param(64, "network input side in pixels", ge=8, le=4096)
    in_chans: Annotated[int, holds(lambda c: c in (1, 3))] = param(3, "3 = colour, 1 = grayscale", must="1 or 3")
    options: dict[str, Any] = param({}, "preset keyword overrides (width, blurpool, act, decoder_levels, map_upsample, "
                                        "...): each must be an option of the preset, of its type")


class TrainParams(Section):
    epochs: int = param(12, "training epochs", ge=1)
    batch_size: int = param(16, "faces a step, over all DDP ranks", ge=1)
    optimizer: Literal["adamw", "sgd"] = param("adamw", "adamw | sgd")
    lr: float = param(1.0e-3, "peak learning rate after warm-up", gt=0)
    momentum: float = param(0.9, "SGD momentum / AdamW beta1", ge=0, lt=1)
    weight_decay: float = param(1.0e-5, "weight decay (not of norms and biases)", ge=0, le=1e3)
    warmup_epochs: float = param(1.0, "linear warm-up length; then cosine decay to 0", ge=0, le=1e6)
    loss: Literal["l1", "l2", "mse", "euclidean", "wing"] = param("l1", "keypoint loss: l1 | l2 | mse | euclidean | wing")
    wing_width: float = param(10.0, "wing loss: errors below this many input px are on its log curve", gt=0, le=1e6)
    wing_curvature: float = param(2.0, "wing loss: its curvature, input px (slope near 0 = width / curvature)",
                                  gt=0, le=1e6)
    structure_lambda: float = param(0.2, "weight of the structure loss (0 disables)", ge=0, le=1e6)
    # losses on coordinates scaled to [-1, 1] (errors / half the input size), as in the
    # integral-regression papers: the SGD lr 0.8 of recipes/gpu.yaml assumes this scale
    normalize_coords: bool = param(True, "losses on [-1, 1] coordinates (errors / half the input size)")
    heatmap_lambda: float = param(1.0, "weight of the DSNT heatmap regulariser (JS to a Gaussian), 0 = off",
                                  ge=0, le=1e6)
    heatmap_sigma: float = param(1.0, "its Gaussian's sigma in heatmap pixels", gt=0, le=1e3)
    scale_min: float = param(0.75, "random resize range, low end (<= scale_max)", gt=0, le=100)
    scale_max: float = param(1.3333333, "random resize range, high end", gt=0, le=100)
    flip: float = param(0.5, "horizontal flip probability (indices remapped by the schema)", ge=0, le=1)
    randaug_n: int = param(2, "RandAugment number of ops (0 disables)", ge=0)
    randaug_m: int = param(7, "RandAugment magnitude", ge=0, le=30)
    rotate: float = param(0.0, "random rotation about the face centre, degrees: uniform in [-rotate, rotate] (0 = off)",
                          ge=0, le=180)
    erase: float = param(0.0, "occlusion: probability of one rectangle per sample filled with one random grey (2-33% "
                              "of the input's area, aspect 0.3-3.3); its keypoints keep their labels (0 = off)",
                         ge=0, le=1)
    amp: Amp = param("auto", "autocast: auto (CUDA: bf16 where native, else fp16; CPU: bf16 where the CPU has "
                             "native bf16, avx512_bf16 or amx_bf16 in /proc/cpuinfo, else fp32) | on | off | bf16 "
                             "| fp16. The fold's log line names the dtype chosen")
    channels_last: Switch = param("auto", "NHWC activations: auto (= on: faster on CUDA and with oneDNN on the "
                                          "CPU) | on | off")
    sync_bn: Switch = param("auto", "BatchNorm over the global batch under DDP (SyncBatchNorm, CUDA only): auto = "
                                    "when the per-rank batch is below 16 | on | off")
    # on the 2-core CPU inductor costs 25-60 s per fold and gains ~2% (docs/benchmarks.md)
    compile: Switch = param("auto", "torch.compile (inductor) of the training network: auto (= off) | on | off",
                            runtime=True)
    keep_freed_memory: Switch = param("auto", "keep freed memory in the process heap (glibc mallopt) instead of "
                                              "handing big blocks back after every step: auto (= on with glibc) "
                                              "| on | off", runtime=True)
    ema_decay: float = param(0.0, "EMA of the weights (and BN buffers) per optimizer step, evaluated each epoch "
                                  "beside the raw weights; best.pt keeps the better; 0 = off", ge=0, lt=1)
    val_every: int = param(1, "validate every N epochs and after the last one (best.pt is chosen among the "
                              "validated epochs); 1 = every epoch", ge=1)
    device: str = param("auto", "auto | cpu | cuda | cuda:N", runtime=True)
    num_workers: int = param(0, "loader worker processes (0 = main process); each sample's augmentation is "
                                "seeded by (seed, epoch, sample), so any count trains the same model", ge=0,
                             runtime=True)
    seed: int = param(0, "weights, sampling and augmentation", ge=0)
    grad_clip: float = param(0.0, "max grad norm, 0 = off", ge=0, le=1e9)


class PredictParams(Section):
    tta: Literal["none", "flip"] = param("flip", "test-time augmentation: none | flip")
    # pipeline/keypoints/views.py: each view mapped back exactly and averaged with the plain
    # (and flipped) view; 4 extra views: 5x the inference cost
    tta_jitter: float = param(0.0, "extra scale/shift TTA views: zoom by 1 +- a, shift by +-a/2 of the side; "
                                   "0 = off", ge=0, le=0.5)
    calibrate: Switch = param("auto", "subtract the per-keypoint mean OOF residual from the test predictions: "
                                      "on | off | auto (only when it lowers the leave-one-out calibrated OOF MAE)")
    batch_size: int = param(64, "faces a forward; flip TTA doubles it", ge=1)
    device: str = param("auto", "auto | cpu | cuda | cuda:N")
    amp: Amp = param("auto", "autocast of predict's forward passes: auto (CUDA: bf16 where native, else fp16; "
                             "CPU: off) | on | off | bf16 | fp16. Training's validation runs as auto does, so a "
                             "fold's val NME is its OOF NME without TTA")
    checkpoint: str = param("best.pt", "which file of models/fold{K}/")


class PresenceParams(Section):
    """pipeline presence (a DVC stage) and calibrate-presence: face-presence thresholds (pipeline/stages/presence.py)"""

    # the score is read from these views wherever the threshold is applied: under the other
    # tta a flip-calibrated score still runs the mirrored view (the cost of flip TTA)
    tta: Literal["none", "flip"] = param("flip", "the views the score reads, here and wherever its threshold "
                                                 "applies: flip (the face and its mirror) | none (the face)")
    # under this the threshold would drop faces or keep non-faces at random: no gate instead
    min_auc: float = param(0.9, "no threshold (no gate) unless faces outscore non-faces with this ROC AUC",
                           ge=0.5, le=1)
    # a tracked face that scores a little low for a few frames (a turn, motion blur) keeps
    # its track; a drifting box (the non-face crops' shifted boxes) still falls below it
    keep_drop: float = param(0.95, "a track is kept while its score is at least the level that still drops "
                                   "this share of the non-face crops (never above the start threshold)",
                             ge=0.5, le=1)
    seed: int = param(0, "where the non-face crops are cut", ge=0)
    device: str = param("auto", "auto | cpu | cuda | cuda:N")


class SubmitParams(Section):
    name: str = param("submission", "submissions/<name>.csv")


class VideoParams(Section):
    """pipeline predict-video (pipeline/inference/tracking.py, pipeline/keypoints/smoothing.py)"""

    detect_every: int = param(10, "run the face detector every N frames (and sooner when a track is lost)", ge=1)
    # a bound on the detector's cost per second: fps / retry_every + fps / detect_every runs,
    # never every frame
    retry_every: int = param(5, "while a track is lost or nothing is tracked, the detector runs at most "
                                "every N frames", ge=1)
    detector: Literal["auto", "mtcnn", "dlib", "haar"] = param("auto", "auto | mtcnn | dlib | haar "
                                                                       "(see predict-image)")
    match_iou: float = param(0.3, "a detection with this IoU to a track's box continues that track (same id)",
                             gt=0, le=1)
    max_missed: int = param(1, "a track missed on more detection frames in a row than this is closed", ge=0)
    min_visible: float = param(0.5, "a track whose box is less than this share inside the picture is closed",
                               ge=0, le=1)
    max_faces: int = param(0, "track at most N faces at once (0: all)", ge=0)
    # the model's own face-presence score (pipeline/inference/presence.py) against its
    # calibrated threshold: a false detection starts no track, a track that leaves the face
    # closes; off tracks whatever the detector and the keypoints' boxes say
    presence: Literal["on", "off"] = param("on", "track only what scores as a face (the model's presence "
                                                 "threshold): on | off")
    # the box from a face's keypoints on the last frame, in the training boxes' convention:
    # width = box_w_scale * keypoint x extent, height = box_h_scale * y extent, centre =
    # extent centre + (box_dx, box_dy) * extent. Medians of both train XMLs (demo set and
    # ibug300w-mini agree to 0.01; tracking.measure_points_to_box)
    box_w_scale: float = param(1.0, "box from last frame's keypoints: width = this x keypoint x extent",
                               gt=0, le=10)
    box_h_scale: float = param(1.12, "height = this x keypoint y extent", gt=0, le=10)
    box_dx: float = param(0.0, "box centre shift in x, in extents", ge=-1, le=1)
    box_dy: float = param(-0.06, "box centre shift in y, in extents", ge=-1, le=1)
    smooth: Literal["on", "off"] = param("on", "smooth the keypoints over time (video.filter): on | off (raw "
                                               "predictions)")
    # poly: no lag (best-aligning delay 0 frames on real clips), at half_window_s of latency as
    # the video is written that much behind; One Euro cut real-clip jitter by only a third at
    # settings without lag (docs/video.md)
    filter: Literal["poly", "one_euro"] = param(
        "poly", "poly: a centred local quadratic (Savitzky-Golay) over +-half_window_s | one_euro: causal "
                "(Casiez et al. 2012: min_cutoff, beta, d_cutoff), for live use")
    half_window_s: float = param(0.1, "s: half the poly window (0.1: 7 frames at 30 fps; longer = less jitter, "
                                      "more lag; 0 = no smoothing)", ge=0, le=10)
    min_cutoff: float = param(0.1, "Hz: cutoff for a still face (lower = less jitter, more lag)", gt=0, le=1e3)
    beta: float = param(100.0, "Hz of cutoff per (face size / s) of speed (higher = less lag when moving)",
                        ge=0, le=1e3)
    d_cutoff: float = param(1.0, "Hz: cutoff of the speed estimate", gt=0, le=1e3)


class Config(BaseModel):
    """Every section of params.yaml. Modules take the section they read (`cfg.train`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())
    data: DataParams = DataParams()
    demo: DemoParams = DemoParams()
    crop: CropParams = CropParams()
    folds: FoldsParams = FoldsParams()
    model: ModelParams = ModelParams()
    train: TrainParams = TrainParams()
    predict: PredictParams = PredictParams()
    presence: PresenceParams = PresenceParams()
    submit: SubmitParams = SubmitParams()
    video: VideoParams = VideoParams()


SECTIONS: tuple[str, ...] = tuple(Config.model_fields)


def section_fields(section: str) -> dict[str, FieldInfo]:
    model: type[BaseModel] = Config.model_fields[section].annotation  # type: ignore[assignment]  # every section is a Section
    return model.model_fields


DEFAULTS = Config()


# ---------------------------------------------------------------- errors in words

_TYPE_NAMES = {bool: "bool", int: "int", float: "number", str: "string", dict: "mapping", list: "list"}


def _base_types(annotation: Any) -> list[type]:
    """The plain types a field takes (Optional[str] -> [str, NoneType]; Literal -> its values' types)."""
    origin = getattr(annotation, "__origin__", None)
    args = getattr(annotation, "__args__", ())
    if origin is Literal:
        return list(dict.fromkeys(type(a) for a in args))
    if args and origin is not None and origin not in (list, dict):  # Union / Optional
        return [t for a in args for t in _base_types(a)]
    return [origin or annotation]


def type_name(field: FieldInfo) -> str:
    types = _base_types(field.annotation)
    if dict in types:  # a free-form mapping (model.options, data.custom_schema; null = none)
        return "mapping"
    if type(None) in types:
        return " or ".join(t.__name__ for t in types if t is not type(None)) + " or null"
    return " or ".join(_TYPE_NAMES.get(t, getattr(t, "__name__", str(t))) for t in types)


def _choices(field: FieldInfo) -> tuple | None:
    ann = field.annotation
    return get_args(ann) if get_origin(ann) is Literal else None


def _bounds(field: FieldInfo) -> dict[str, float]:
    out = {}
    for m in field.metadata:
        for k in ("ge", "gt", "le", "lt"):
            if getattr(m, k, None) is not None:
                out[k] = getattr(m, k)
    return out


def requirement(field: FieldInfo) -> str:
    """What a value of `field` must be, in words: 'an integer >= 1', 'a number in (0, 10]',
    'auto, on or off'. Types alone ('int') are worded by type_name."""
    if _extra(field).get("must"):
        return _extra(field)["must"]
    choices = _choices(field)
    if choices:
        words = [str(c) for c in choices]
        return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]
    b = _bounds(field)
    lo, hi = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
    if int in _base_types(field.annotation):
        if hi is None:
            return f"an integer >= {lo}"
        return f"an integer in [{lo}, {hi}]"
    if lo is not None and hi is None:
        return f"a number {'>' if 'gt' in b else '>='} {lo:g}"
    if lo is not None:
        return f"a number in {'(' if 'gt' in b else '['}{lo:g}, {hi:g}{')' if 'lt' in b else ']'}"
    return f"a {type_name(field)}"


# Pydantic finds each problem and names its kind; error_line words it as docs/params.md does
# ("an integer in [8, 4096]", "auto, on or off"), since pydantic's text speaks Python ("Input
# should be a valid integer") and gives one bound of a range. The rules between keys stay out
# of pydantic (check_params): they hold only once the file and every --set are merged, and
# name the --set or file each key came from, which a validator cannot know.
UNKNOWN_KEY = ("extra_forbidden", "invalid_key")  # a key not in the schema, a key not a string


def error_line(error: ValidationError) -> str:
    """The first problem pydantic found in a params mapping, an unknown key first (a misspelt
    key explains the most), in one line: "unknown key 'train.lrr'", "'train' must be a
    mapping", "'train.lr' must be a number > 0, got -1"."""
    err = min(error.errors(), key=lambda e: e["type"] not in UNKNOWN_KEY)
    kind, loc, value = err["type"], [str(p) for p in err["loc"]], err["input"]
    key = ".".join(loc[:2])
    if kind in UNKNOWN_KEY:
        return f"unknown key '{key}'"
    if kind == PARAM_RULE:
        return err["msg"]
    if len(loc) == 1:
        return f"'{key}' must be a mapping"  # a section
    field = section_fields(loc[0])[loc[1]]
    if len(loc) > 2:
        return f"'{key}' must be {requirement(field)}"  # an element of a list or mapping
    if kind == "finite_number":
        what = "a finite number"
    elif kind == "dict_type":
        what = "a mapping"
    elif kind.endswith("_type") or (kind == "literal_error" and type(value) not in map(type, _choices(field) or ())):
        what = type_name(field)
    else:  # a range, a choice or a validator's check
        what = requirement(field)
    return f"'{key}' must be {what}, got {value!r}"


# ---------------------------------------------------------------- the rules between keys


def check_params(cfg: Config, blame: Callable[..., str]) -> None:
    """The rules between keys, checked once the params file and every --set are merged (so
    that `--set folds.k=2 --set folds.train=[0,1]` passes): train.scale_min <= scale_max,
    folds.train within range(folds.k) and each fold once, model.preset registered and each
    of model.options an option of that preset, of its type. One line naming the keys;
    `blame(*keys)` names where they came from (`config.params_source` and the --set's)."""
    t, f, m = cfg.train, cfg.folds, cfg.model
    if t.scale_min > t.scale_max:
        raise PipelineError(blame("train.scale_min", "train.scale_max"),
                            f"'train.scale_min' {t.scale_min:.12g} must be <= 'train.scale_max' {t.scale_max:.12g}")
    if any(fold >= f.k for fold in f.train):
        raise PipelineError(blame("folds.train", "folds.k"),
                            f"'folds.train' {f.train} must name folds of 'folds.k' {f.k} (0..{f.k - 1})")
    twice = [fold for i, fold in enumerate(f.train) if fold in f.train[:i]]
    if twice:
        raise PipelineError(blame("folds.train"), f"'folds.train' {f.train} names fold {twice[0]} twice")
    if m.preset not in MODEL_OPTIONS:
        raise PipelineError(blame("model.preset"), f"'model.preset' must be a registered preset "
                                                   f"({', '.join(MODEL_OPTIONS)}), got {m.preset!r}")
    known = MODEL_OPTIONS[m.preset]
    for name, value in m.options.items():
        if name not in known:
            raise PipelineError(blame(f"model.options.{name}", "model.preset"),
                                f"'model.options' of preset '{m.preset}': unknown option {name!r} "
                                f"(known: {', '.join(sorted(known)) or 'none'})")
        if not _option_ok(known[name], value):
            raise PipelineError(blame(f"model.options.{name}", "model.preset"),
                                f"'model.options.{name}' of preset '{m.preset}' must be "
                                f"{_option_words(known[name])}, got {value!r}")
