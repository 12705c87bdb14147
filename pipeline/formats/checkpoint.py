"""Checkpoints: plain dicts of tensors and Python values, written atomically and read
with `torch.load(weights_only=True)` so loading one never runs pickled code."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file, torch_save, write_json
from pipeline.keypoints.schema import check_schema
from pipeline.models import build_model

log = logging.getLogger(__name__)

REQUIRED = ("model_config", "model", "schema", "epoch")


def save_checkpoint(path: str | os.PathLike, ckpt: dict[str, Any]) -> None:
    torch_save(path, ckpt)


def checkpoint_identity(ckpt: dict[str, Any]) -> str:
    """The sha256 of what a checkpoint predicts with: its model config, crop geometry,
    schema and weights (name, dtype, shape and bytes of each tensor). Two checkpoints of the
    same identity give the same predictions, whatever else they carry (the params of the run,
    its optimizer state), so predictions name the checkpoints they were made from by it."""
    h = hashlib.sha256()
    head = {k: ckpt.get(k) for k in ("model_config", "crop", "schema")}
    h.update(json.dumps(head, sort_keys=True, default=str).encode())
    for name, t in sorted(ckpt["model"].items()):
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def model_identity(path: str | os.PathLike, meta: dict[str, Any]) -> str:
    """The `checkpoint_identity` of the model loaded from checkpoint `path` with `meta` (a
    `load_predictor` meta): from the meta when it is the checkpoint dict (the torch backend),
    else from the checkpoint read again (an onnx backend's meta holds no weights)."""
    return checkpoint_identity(meta if "model" in meta else load_checkpoint(path))


def _load_failure(e: BaseException) -> str:
    """One short line for why torch.load failed. The weights-only unpickler's message is a
    paragraph (with ANSI bold) whose useful part follows 'WeightsUnpickler error:'."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    if "WeightsUnpickler error:" in text:
        detail = next((ln.strip() for ln in text.split("WeightsUnpickler error:", 1)[1].splitlines()
                       if ln.strip()), "")
        detail = detail.split(" Please use ", 1)[0].rstrip(". ")
        return f"refused by the weights-only loader: {detail}"[:160]
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return first[:160] if first else type(e).__name__


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    schema=None) -> dict[str, Any]:
    """Load and check a checkpoint; `schema` (a KeypointSchema) must match if given."""
    path = input_file(path, "checkpoint not found", "a checkpoint file")
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning would be a 2nd stderr line
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError,
            AttributeError, OSError) as e:
        raise PipelineError(path, f"not a loadable checkpoint ({_load_failure(e)})") from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED):
        raise PipelineError(path, f"not a pipeline checkpoint (needs keys {', '.join(REQUIRED)})")
    if schema is not None:
        theirs = ckpt["schema"]
        if not isinstance(theirs, dict):
            raise PipelineError(path, f"not a pipeline checkpoint ('schema' is a {type(theirs).__name__}, not a mapping)")
        check_schema(theirs, schema, path)
    return ckpt


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", schema=None):
    """(model in eval mode on `device`, checkpoint dict)."""
    ckpt = load_checkpoint(path, "cpu", schema)
    try:
        model = build_model(ckpt["model_config"])
        model.load_state_dict(ckpt["model"])
    except PipelineError as e:
        raise PipelineError(path, e.problem) from None
    except (RuntimeError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise PipelineError(path, f"weights do not fit model '{ckpt['model_config'].get('preset')}' "
                                  f"({str(e).splitlines()[0][:120]})") from None
    return model.to(device).eval(), ckpt


def crop_stamp(size: int, expand: float, label_origin: float) -> dict[str, Any]:
    """A checkpoint's (or exported model's) "crop": the geometry of the face crops its model
    was trained on and the labels' pixel origin, the single writer of what `checkpoint_crop`
    and `checkpoint_label_origin` read."""
    return {"size": int(size), "expand": float(expand), "label_origin": float(label_origin)}


def checkpoint_crop(ckpt: dict[str, Any], where: str | os.PathLike | None = None) -> tuple[int, float]:
    """(crop size, crop expand) the checkpoint's model was trained on: the single reader of
    a checkpoint's crop geometry (predict, predict-image, heatmaps, morph, bench, export).

    `ckpt["crop"]` is stamped at training from the cache the model actually saw (the params
    it was trained with may name another size than that cache). An exported model's JSON
    carries the same "crop" key."""
    geo: Any = ckpt.get("crop")  # anything a file holds: checked below
    try:
        size, expand = int(geo["size"]), float(geo["expand"])
    except (TypeError, KeyError, ValueError):
        raise PipelineError(where, f"bad crop geometry {geo!r} in the checkpoint "
                                   "(expects crop: {size, expand})") from None
    if not 1 <= size <= 4096 or not 0 < expand <= 10:  # crop.side's and crop.expand's ranges: read from a file
        raise PipelineError(where, f"bad crop geometry (size {size}, expand {expand}) in the checkpoint")
    return size, expand


def checkpoint_label_origin(ckpt: dict[str, Any]) -> float:
    """The pixel-centre origin of the labels the model was trained on (data.label_origin of
    its cache): predictions, computed on 0-based pixel centres, are shifted by it to come
    out in the labels' convention."""
    return float(ckpt["crop"]["label_origin"])


# The face-presence score (pipeline/inference/presence.py) of a checkpoint's model: its
# radius (the keypoint's neighbourhood, in map sides: 3.2 px of a 64 px map, 7 % of the face
# box's side at crop.expand 1.4, well beyond a good model's point error and well inside a
# face) and the thresholds the presence stage (or `pipeline calibrate-presence`) chose on its
# held-out faces.
PRESENCE_RADIUS = 0.05
# the definition of the score a threshold was chosen on: a threshold of another means nothing
PRESENCE_SCORE_VERSION = 2
PRESENCE_TTA = ("none", "flip")
# beside each checkpoint: the presence stage's output (the checkpoint, a train output, stays
# as trained), for the checkpoint of the identity it names
PRESENCE_FILE = "presence.json"


def presence_stamp(threshold: float | None, radius: float = PRESENCE_RADIUS, *, keep: float | None = None,
                   tta: str = "flip", **measured: Any) -> dict[str, Any]:
    """A checkpoint's (or exported model's) "presence": the score's definition (version,
    radius, the views it reads: tta), the threshold a face must score to start a track and be
    a face (None: no gate, `why` says why) and the lower one that keeps a track (`keep`,
    default the threshold), plus what the calibration measured (auc, faces, ...): the single
    writer of what `checkpoint_presence` reads."""
    keep = threshold if keep is None else keep
    return {"threshold": None if threshold is None else float(threshold),
            "keep": None if keep is None else float(keep), "radius": float(radius), "tta": tta,
            "version": PRESENCE_SCORE_VERSION, **measured}


def checkpoint_presence(ckpt: dict[str, Any], where: str | os.PathLike | None = None) -> dict[str, Any]:
    """The face-presence calibration of a checkpoint or exported model: {"threshold", "keep",
    "radius", "tta", "calibrated", "why"} (+ what the calibration measured). No threshold
    (None, calibrated False, `why` saying why: never calibrated, no separation, an older
    score) means no gate; a stamp that is not one is a PipelineError naming `where`."""
    stamp: Any = ckpt.get("presence")
    if stamp is None:
        return {"threshold": None, "keep": None, "radius": PRESENCE_RADIUS, "tta": None, "calibrated": False,
                "why": "never calibrated (run the presence stage or `pipeline calibrate-presence`)"}

    def bad(detail: str) -> PipelineError:
        return PipelineError(where, f"bad presence calibration {detail} in the checkpoint (expects presence: "
                                    "{threshold, keep, radius, tta, version})")

    try:
        threshold = None if stamp["threshold"] is None else float(stamp["threshold"])
        radius = float(stamp["radius"])
        keep = threshold if stamp.get("keep", threshold) is None else float(stamp.get("keep", threshold))
    except (TypeError, KeyError, ValueError, AttributeError):
        raise bad(repr(stamp)) from None
    tta = stamp.get("tta", "flip")
    if threshold is not None and not (keep is not None and 0 <= keep <= threshold <= 1):
        raise bad(f"(threshold {threshold}, keep {keep}): expects 0 <= keep <= threshold <= 1")
    if not 0 < radius <= 1 or tta not in PRESENCE_TTA:  # a share of the map side; the views read
        raise bad(f"(radius {radius}, tta {tta!r}): expects 0 < radius <= 1, tta none | flip")
    out = {**stamp, "threshold": threshold, "keep": keep, "radius": radius, "tta": tta}
    if stamp.get("version") != PRESENCE_SCORE_VERSION:
        return {**out, "threshold": None, "keep": None, "calibrated": False,
                "why": f"calibrated for an older presence score (version {stamp.get('version', 1)}, this is "
                       f"{PRESENCE_SCORE_VERSION}): calibrate it again"}
    if threshold is None:
        return {**out, "calibrated": False, "why": str(stamp.get("why", "no threshold"))}
    return {**out, "calibrated": True, "why": ""}


def presence_file(checkpoint: str | os.PathLike) -> Path:
    """The presence calibration file beside a checkpoint: models/foldK/presence.json."""
    return Path(checkpoint).parent / PRESENCE_FILE


def write_presence_file(checkpoint: str | os.PathLike, ckpt: dict[str, Any], stamp: dict[str, Any],
                        **details: Any) -> Path:
    """Write `stamp` (`presence_stamp`) for the checkpoint at `checkpoint` (loaded: `ckpt`)
    into its `presence_file`, with the checkpoint's name and identity and `details`."""
    path = presence_file(checkpoint)
    write_json(path, {"checkpoint": Path(checkpoint).name, "identity": checkpoint_identity(ckpt),
                      "presence": stamp, **details})
    return path


def read_presence_file(path: str | os.PathLike) -> dict[str, Any]:
    """A presence file: {"checkpoint", "identity", "presence", ...}, checked."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineError(path, f"unreadable presence calibration ({type(e).__name__})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("checkpoint", "identity")) \
            or not isinstance(data.get("presence"), dict):
        raise PipelineError(path, "not a presence calibration (needs checkpoint, identity, presence)")
    checkpoint_presence(data, path)  # a bad stamp is an error here, naming this file
    return data


def with_presence_file(checkpoint: str | os.PathLike, meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` (a `load_predictor` meta of the checkpoint at `checkpoint`) with the presence
    calibration of the `presence_file` beside it when that file was made for this very
    checkpoint (its identity), in place of any the checkpoint carries. An exported .onnx model
    carries its own (`pipeline export` copies it into the JSON)."""
    path = presence_file(checkpoint)
    if Path(checkpoint).suffix == ".onnx" or not path.is_file():
        return meta
    data = read_presence_file(path)
    if data["identity"] == model_identity(checkpoint, meta):
        return {**meta, "presence": data["presence"]}
    if data["checkpoint"] == Path(checkpoint).name:  # made for an earlier state of this file
        log.warning("%s: made for other weights than %s (retrained since?): not used", path, checkpoint)
    return meta
