"""Configuration: defaults, then the params file, then `--set key=value` overrides.

Every stage reads only its own sections of `params.yaml` (as DVC's example-get-started
does) and writes the resolved values beside its outputs. Unknown keys and values of the
wrong type are rejected with the file and key named, never silently ignored.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

import click
import yaml

from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file, write_text

# Each leaf's default also fixes its type: an int default accepts ints, a float default
# accepts ints and floats, a bool default only booleans. Leaves whose default is None
# declare their type in NULLABLE; leaves listed in FREE_FORM are dicts checked by the
# code that reads them (a custom schema, preset options).
DEFAULTS: dict[str, dict[str, Any]] = {
    "data": {
        "dir": None,  # dataset folder holding the two XMLs; null = embedded demo set
        "train_xml": "labels_ibug_300W_train.xml",  # relative to data.dir
        "test_xml": "labels_ibug_300W_test_parsed.xml",  # relative to data.dir
        "solution": "solution.csv",  # truth of the test set, scored when present
        "schema": "ibug68",  # keypoint layout: ibug68 | nose1 | custom
        "custom_schema": None,  # with schema: custom -> {names, flip, eyes}
        # coordinate of the first pixel's centre in the labels: 0 = dlib / OpenCV, 1 = the
        # 1-based Matlab convention of the 300-W .pts files. Internally pixel centres sit at
        # 0, 1, ...; a wrong origin makes mirrored training samples disagree by 2 * origin px
        # in x (the flip maps x -> W - 1 - x) and biases predictions by -origin px in x
        "label_origin": 0.0,
    },
    "demo": {
        "n_train": 400,  # synthetic training faces
        "n_test": 60,  # synthetic test faces (truth goes to solution.csv)
        "seed": 0,  # same seed -> byte-identical XML and CSV
        "layout": "flat",  # flat (images/train, images/test) | 300w (the full set's folders, names, mirrors)
    },
    "crop": {
        "expand": 1.25,  # box side is scaled by this before the square crop
        "side": 64,  # cached face side in pixels (uint8, N x side x side x 3); not "size": DVC's run
        # cache ignores params named size (treeverse/dvc#10296), so a change would not re-run crop
        "n_jobs": 2,  # joblib workers
    },
    "folds": {
        "k": 5,  # number of folds
        "seed": 0,  # shuffling of photo groups
        "train": [0, 1, 2, 3, 4],  # folds that get a train stage in dvc.yaml (each < k)
        # photo groups (kept in one fold): a regex matched against each image path without
        # its extension; its named group 'photo' is the group. The default is 300-W's
        # naming (face _1.._99, mirror _mirror): see pipeline.formats.annotations.photo_group
        "group_regex": r"^(?P<photo>.+?)(?:_\d{1,2})?(?:_mirror)?$",
    },
    "model": {
        "preset": "resunet-tiny",  # registry name, see `pipeline models`
        "input_size": 64,  # network input side in pixels
        "in_chans": 3,  # 3 = colour, 1 = grayscale
        "options": {},  # preset keyword overrides (width, blurpool, act, ...)
    },
    "train": {
        "epochs": 12,
        "batch_size": 16,
        "optimizer": "adamw",  # adamw | sgd
        "lr": 1.0e-3,  # peak learning rate after warm-up
        "momentum": 0.9,  # SGD momentum / AdamW beta1
        "weight_decay": 1.0e-5,
        "warmup_epochs": 1.0,  # linear warm-up length; then cosine decay to 0
        "loss": "l1",  # l1 | l2 | mse | euclidean
        "structure_lambda": 0.2,  # weight of the structure loss (0 disables)
        # losses on coordinates scaled to [-1, 1] (errors / half the input size), as in the
        # integral-regression papers: the SGD lr 0.8 of recipes/gpu.yaml assumes this scale
        "normalize_coords": True,
        "heatmap_lambda": 1.0,  # weight of the DSNT heatmap regulariser (JS to a Gaussian), 0 = off
        "heatmap_sigma": 1.0,  # its Gaussian's sigma in heatmap pixels
        "scale_min": 0.75,  # random resize range
        "scale_max": 1.3333333,
        "flip": 0.5,  # horizontal flip probability (indices remapped by the schema)
        "randaug_n": 2,  # RandAugment number of ops (0 disables)
        "randaug_m": 7,  # RandAugment magnitude (0..30)
        "amp": "auto",  # auto (CUDA only) | off | bf16 | fp16
        "channels_last": "auto",  # NHWC activations: auto (= on: faster on CUDA and with oneDNN on the CPU) | on | off
        # BatchNorm over the global batch under DDP (SyncBatchNorm, CUDA only): auto = when
        # the per-rank batch is below 16 (device.SYNC_BN_BELOW) | on | off
        "sync_bn": "auto",
        # torch.compile (inductor) of the training network: auto = off (on the 2-core CPU it
        # costs 25-60 s per fold and gains ~2%, docs/benchmarks.md) | on | off
        "compile": "auto",
        # keep freed memory in the process heap (glibc mallopt) instead of handing big
        # blocks back to the kernel after every step: auto = on with glibc (Linux) | on | off
        "keep_freed_memory": "auto",
        # EMA of the weights (and BN buffers), evaluated each epoch beside the raw weights;
        # best.pt keeps whichever scores better. Decay per optimizer step; 0 = off
        "ema_decay": 0.0,
        "device": "auto",  # auto | cpu | cuda | cuda:N
        "num_workers": 0,  # loader worker processes (0 = main process)
        "seed": 0,
        "grad_clip": 0.0,  # max grad norm, 0 = off
    },
    "predict": {
        "tta": "flip",  # none | flip
        # extra scale/shift TTA views (pipeline/keypoints/views.py): zoom by 1 +- a, shift by +-a/2 of the
        # side, each mapped back exactly and averaged with the plain (and flipped) view;
        # 0 = off. 4 extra views: 5x the inference cost. Turn on only if OOF MAE improves
        "tta_jitter": 0.0,
        # subtract the per-keypoint mean OOF residual from the test predictions: on | off |
        # auto (only when it lowers the leave-one-out calibrated OOF MAE)
        "calibrate": "auto",
        "batch_size": 64,  # faces a forward; flip TTA doubles it
        "device": "auto",
        # autocast of predict's forward passes: auto (CUDA: bf16 where native, else fp16;
        # CPU: off) | on | off | bf16 | fp16. Training's validation follows train.amp
        "amp": "auto",
        "checkpoint": "best.pt",  # which file of models/fold{K}/
    },
    "submit": {
        "name": "submission",  # submissions/<name>.csv
    },
    "video": {  # pipeline predict-video (pipeline/inference/tracking.py, pipeline/keypoints/smoothing.py)
        "detect_every": 10,  # run the face detector every N frames (and sooner when a track is lost)
        # while a track is lost or nothing is tracked, the detector runs at most every N frames
        # (a bound on its cost per second: fps / N + fps / detect_every runs, never every frame)
        "retry_every": 5,
        "detector": "auto",  # auto | mtcnn | dlib | haar (see predict-image)
        "match_iou": 0.3,  # a detection with this IoU to a track's box continues that track (same id)
        "max_missed": 1,  # a track missed on more detection frames in a row than this is closed
        "min_visible": 0.5,  # a track whose box is less than this share inside the picture is closed
        "max_faces": 0,  # track at most N faces at once (0: all)
        # the box from a face's keypoints on the last frame, in the training boxes' convention:
        # width = box_w_scale * keypoint x extent, height = box_h_scale * y extent, centre =
        # extent centre + (box_dx, box_dy) * extent. Medians of both train XMLs (demo set and
        # ibug300w-mini agree to 0.01; tracking.measure_points_to_box)
        "box_w_scale": 1.0,
        "box_h_scale": 1.12,
        "box_dx": 0.0,
        "box_dy": -0.06,
        # One Euro filter per coordinate (Casiez et al. 2012): on | off (raw predictions). The
        # three values: the lowest still-face jitter with moving-face NME <= 1.03 x raw on the
        # make-test-video pair (docs/video.md: jitter -69 %, NME +2 %)
        "smooth": "on",
        # poly: a centred local quadratic (Savitzky-Golay) over +-half_window_s around each frame:
        # no lag, at half_window_s of latency (the video is written that much behind);
        # one_euro: causal, for live use (min_cutoff, beta, d_cutoff below). docs/video.md
        "filter": "poly",
        "half_window_s": 0.1,  # s: half the poly window (0.1: 7 frames at 30 fps; longer = less jitter, more lag)
        "min_cutoff": 0.1,  # Hz: cutoff for a still face (lower = less jitter, more lag)
        "beta": 100.0,  # Hz of cutoff per (face size / s) of speed (higher = less lag when moving)
        "d_cutoff": 1.0,  # Hz: cutoff of the speed estimate
    },
}

NULLABLE: dict[str, tuple[type, ...]] = {
    "data.dir": (str,),
    "data.custom_schema": (dict,),
}
FREE_FORM = {"model.options", "data.custom_schema"}


# Value ranges, checked where the value is read (so the error names the file or --set at
# fault). Every float must also be finite. key -> (test, what it must be).
def _int_at_least(lo: int):
    return (lambda v: v >= lo), f"an integer >= {lo}"


def _number_in(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False):
    def ok(v):
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    return ok, f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


# params that change how fast a stage runs, never a byte of what it writes: left out of the
# params.resolved.yaml files, of the resume key and of dvc.yaml's params, so that changing
# one re-runs nothing (tests/test_dvc.py checks dvc.yaml)
SPEED_ONLY = {"crop.n_jobs"}

RANGES: dict[str, tuple[Any, str]] = {
    "demo.n_train": _int_at_least(1), "demo.n_test": _int_at_least(1), "demo.seed": _int_at_least(0),
    "crop.expand": _number_in(0, 10, lo_open=True), "crop.side": ((lambda v: 8 <= v <= 4096), "an integer in [8, 4096]"),
    "folds.k": _int_at_least(2), "folds.seed": _int_at_least(0),
    "folds.train": ((lambda v: all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in v)),
                    "a list of fold numbers (integers >= 0)"),
    "model.input_size": ((lambda v: 8 <= v <= 4096), "an integer in [8, 4096]"),
    "model.in_chans": ((lambda v: v in (1, 3)), "1 or 3"),
    "train.epochs": _int_at_least(1), "train.batch_size": _int_at_least(1),
    "train.lr": ((lambda v: v > 0), "a number > 0"), "train.momentum": _number_in(0, 1, hi_open=True),
    "train.weight_decay": _number_in(0, 1e3), "train.warmup_epochs": _number_in(0, 1e6),
    "train.structure_lambda": _number_in(0, 1e6), "train.heatmap_lambda": _number_in(0, 1e6),
    "train.heatmap_sigma": _number_in(0, 1e3, lo_open=True), "data.label_origin": _number_in(-1e3, 1e3),
    "predict.calibrate": ((lambda v: v in ("auto", "on", "off")), "auto, on or off"),
    "train.scale_min": _number_in(0, 100, lo_open=True),
    "train.scale_max": _number_in(0, 100, lo_open=True), "train.flip": _number_in(0, 1),
    "train.randaug_n": _int_at_least(0), "train.randaug_m": ((lambda v: 0 <= v <= 30), "an integer in [0, 30]"),
    "train.num_workers": _int_at_least(0), "train.seed": _int_at_least(0), "train.grad_clip": _number_in(0, 1e9),
    "predict.batch_size": _int_at_least(1), "predict.tta_jitter": _number_in(0, 0.5),
    "demo.layout": ((lambda v: v in ("flat", "300w")), "flat or 300w"),
    "train.amp": ((lambda v: v in ("auto", "on", "off", "bf16", "fp16")), "auto, on, off, bf16 or fp16"),
    "train.channels_last": ((lambda v: v in ("auto", "on", "off")), "auto, on or off"),
    "train.compile": ((lambda v: v in ("auto", "on", "off")), "auto, on or off"),
    "train.keep_freed_memory": ((lambda v: v in ("auto", "on", "off")), "auto, on or off"),
    "train.ema_decay": _number_in(0, 1, hi_open=True),
    "train.sync_bn": ((lambda v: v in ("auto", "on", "off")), "auto, on or off"),
    "predict.amp": ((lambda v: v in ("auto", "on", "off", "bf16", "fp16")), "auto, on, off, bf16 or fp16"),
    "folds.group_regex": ((lambda v: _regex_with_photo(v)), "a regex with a named group (?P<photo>...)"),
    "video.detect_every": _int_at_least(1), "video.retry_every": _int_at_least(1),
    "video.max_missed": _int_at_least(0), "video.max_faces": _int_at_least(0),
    "video.detector": ((lambda v: v in ("auto", "mtcnn", "dlib", "haar")), "auto, mtcnn, dlib or haar"),
    "video.match_iou": _number_in(0, 1, lo_open=True), "video.min_visible": _number_in(0, 1),
    "video.box_w_scale": _number_in(0, 10, lo_open=True), "video.box_h_scale": _number_in(0, 10, lo_open=True),
    "video.box_dx": _number_in(-1, 1), "video.box_dy": _number_in(-1, 1),
    "video.smooth": ((lambda v: v in ("on", "off")), "on or off"),
    "video.filter": ((lambda v: v in ("poly", "one_euro")), "poly or one_euro"),
    "video.half_window_s": _number_in(0, 10),
    "video.min_cutoff": _number_in(0, 1e3, lo_open=True), "video.beta": _number_in(0, 1e3),
    "video.d_cutoff": _number_in(0, 1e3, lo_open=True),
}


def _regex_with_photo(pattern: str) -> bool:
    try:
        return "photo" in re.compile(pattern).groupindex
    except re.error:
        return False

# On/off switches: string params whose default is "auto", "on" or "off" (train.amp,
# train.channels_last, ...). YAML reads on/off/yes/no/true/false as booleans; for a switch
# they mean "on"/"off".
SWITCH_DEFAULTS = ("auto", "on", "off")


def _is_switch(key: str) -> bool:
    default = DEFAULTS_FLAT.get(key)
    return isinstance(default, str) and default in SWITCH_DEFAULTS


def _check_range(key: str, value: Any, source: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise PipelineError(source, f"'{key}' must be a finite number, got {value!r}")
    if key in RANGES and value is not None:
        ok, what = RANGES[key]
        if not ok(value):
            raise PipelineError(source, f"'{key}' must be {what}, got {value!r}")


def _type_ok(key: str, default: Any, value: Any) -> bool:
    if key in NULLABLE:
        return value is None or isinstance(value, NULLABLE[key])
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _type_name(key: str, default: Any) -> str:
    if key in NULLABLE:
        return " or ".join(t.__name__ for t in NULLABLE[key]) + " or null"
    return {bool: "bool", int: "int", float: "number", str: "string", dict: "mapping",
            list: "list"}.get(type(default), type(default).__name__)


def _merge(base: dict, update: dict, source: str, prefix: str = "") -> None:
    """Merge `update` into `base` in place, rejecting unknown keys and wrong types."""
    if not isinstance(update, dict):
        raise PipelineError(source, f"'{prefix.rstrip('.') or 'top level'}' must be a mapping")
    for key, value in update.items():
        full = f"{prefix}{key}"
        if key not in base:
            raise PipelineError(source, f"unknown key '{full}'")
        default = base[key]
        if full in FREE_FORM:
            if value is not None and not isinstance(value, dict):
                raise PipelineError(source, f"'{full}' must be a mapping, got {value!r}")
            base[key] = copy.deepcopy(value) if value is not None else ({} if default == {} else None)
        elif isinstance(default, dict) and full not in NULLABLE:
            _merge(default, value, source, full + ".")
        elif isinstance(value, bool) and _is_switch(full):
            base[key] = "on" if value else "off"
        elif not _type_ok(full, DEFAULTS_FLAT.get(full, default), value):
            raise PipelineError(
                source, f"'{full}' must be {_type_name(full, DEFAULTS_FLAT.get(full, default))}, got {value!r}")
        else:
            _check_range(full, value, source)
            base[key] = float(value) if isinstance(DEFAULTS_FLAT.get(full), float) else value


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and f"{prefix}{k}" not in FREE_FORM and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


DEFAULTS_FLAT = flatten(DEFAULTS)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (plain YAML keeps the last)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicated key '{key}' (also on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_override(text: str) -> dict:
    """'train.lr=0.1' -> {'train': {'lr': 0.1}}; the value is parsed as YAML."""
    if "=" not in text:
        raise PipelineError("--set", f"expected key=value, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:  # ReaderError (a control character) has no .problem, only a message
        problem = e.problem if isinstance(e, yaml.MarkedYAMLError) else str(e).splitlines()[0]
        raise PipelineError("--set", f"cannot parse value of '{key}': {problem}") from None
    if isinstance(value, str):
        try:  # YAML 1.1 reads '1e30' as a string; on the command line it means a number
            value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "+inf") else value
        except ValueError:
            pass
    node: dict = {}
    cur = node
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value
    return node


_SOURCE: dict[str, Any] = {"file": "params.yaml", "set": {}}  # of the last load_config (one per CLI process)


def params_source(*keys: str) -> str:
    """Where the current value of `keys` came from, for errors about a param found after
    loading: `--set key=value` when an override set it (or its section), else the params
    file read (so `--params other.yaml` is blamed, not params.yaml)."""
    for key in keys:
        for set_key, text in reversed(list(_SOURCE["set"].items())):
            if key == set_key or key.startswith(set_key + "."):
                return f"--set {text}"
    return _SOURCE["file"]


def with_overrides(cfg: dict, overrides: Iterable[str]) -> dict:
    """A copy of a resolved config with `key=value` overrides merged in, checked as --set's."""
    cfg = copy.deepcopy(cfg)
    for text in overrides:
        _merge(cfg, parse_override(text), f"--set {text}")
    return cfg


def load_config(params: str | os.PathLike | None = "params.yaml",
                overrides: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Defaults, then `params` (a missing default params.yaml means defaults), then overrides."""
    overrides = list(overrides)
    _SOURCE["file"] = "params.yaml" if params is None else str(params)
    _SOURCE["set"] = {t.split("=", 1)[0].strip(): t for t in overrides}
    cfg = copy.deepcopy(DEFAULTS)
    if params is not None:
        path = Path(params)
        if path.exists() or str(params) != "params.yaml":  # only the default may be missing
            input_file(path, "params file not found", "a params YAML file")
            try:
                loaded = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                line = f" (line {mark.line + 1})" if mark else ""
                raise PipelineError(path, f"invalid YAML{line}: {getattr(e, 'problem', e)}") from None
            except UnicodeDecodeError:
                raise PipelineError(path, "not a text file") from None
            if loaded is not None:
                _merge(cfg, loaded, str(path))
    for text in overrides:
        _merge(cfg, parse_override(text), f"--set {text}")
    return cfg


def result_params(cfg: dict, sections: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The sections' params less the SPEED_ONLY ones: what a stage's outputs depend on."""
    return {s: {k: v for k, v in cfg[s].items() if f"{s}.{k}" not in SPEED_ONLY} for s in sections}


def write_resolved(cfg: dict, out_dir: str | os.PathLike, sections: Iterable[str],
                   name: str = "params.resolved.yaml") -> Path:
    """Write the sections a stage used beside its outputs, so a result names its config."""
    out = Path(out_dir) / name
    write_text(out, yaml.safe_dump(result_params(cfg, sections), sort_keys=False))
    return out


def read_resolved(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """A file `write_resolved` wrote: {section: {key: value}}."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise PipelineError(path, f"not a readable params file ({type(e).__name__})") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
        raise PipelineError(path, "not a resolved params file (expects sections of key: value)")
    return loaded


def config_options(fn):
    """Add `--params PATH` and repeatable `--set key=value`, and pass the resolved `cfg`."""

    @click.option("--params", "params_path", default="params.yaml", show_default=True,
                  help="params YAML file (missing default file = built-in defaults)")
    @click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                  help="override a param, e.g. --set train.lr=0.1 (repeatable)")
    @functools.wraps(fn)
    def wrapper(*args, params_path, overrides, **kwargs):
        return fn(*args, cfg=load_config(params_path, overrides), **kwargs)

    return wrapper
