"""`pipeline export`: a checkpoint -> `<name>.onnx` + `<name>.json` (the format and its
reader are in pipeline/formats/onnx_export.py), checked against PyTorch on demo crops, optionally
quantized to int8 (onnxruntime static QDQ on the convolutions, same inputs and outputs)."""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import click
import cv2
import numpy as np
import torch

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_path, check_output, write_json
from pipeline.formats.cache import load_cache
from pipeline.formats.checkpoint import checkpoint_crop, load_model, with_presence_file
from pipeline.formats.onnx_export import INPUT, export_meta, json_path, onnx_bytes
from pipeline.inference.onnx_runtime import OnnxModel, onnx_available
from pipeline.inference.tta import predict_crops
from pipeline.keypoints.geometry import crop_face
from pipeline.keypoints.preprocess import faces_to_chw, normalize_batch, resize_batch
from pipeline.synth.face import render_photo

log = logging.getLogger(__name__)


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, verify: bool = True,
                      int8: bool = False, calibration: str | os.PathLike | None = None) -> dict[str, Any]:
    """Write `out` (.onnx) and its JSON atomically; with `verify` (and onnxruntime installed)
    compare onnxruntime with PyTorch on a few demo faces and record the max difference.
    `int8`: statically quantized convolutions (`quantize_int8`), calibrated on the face
    cache split `calibration` (else demo faces)."""
    out = Path(out)
    if out.suffix != ".onnx":
        raise PipelineError(out, "the export file name must end in .onnx")
    model, ckpt = load_model(checkpoint, "cpu")
    ckpt = with_presence_file(checkpoint, ckpt)  # the presence stage's calibration travels in the JSON
    model_config = ckpt["model_config"]
    data = onnx_bytes(model, int(model_config["input_size"]), int(model_config["in_chans"]))
    quant = None
    if int8:
        if not onnx_available():
            raise PipelineError(checkpoint, "--int8 needs onnxruntime: pip install 'pipeline[onnx]'")
        faces, where = calibration_faces(ckpt, calibration)
        data = quantize_int8(data, network_inputs(faces, int(model_config["input_size"]), int(model_config["in_chans"])))
        quant = {"precision": "int8", "how": "onnxruntime static QDQ: Conv weights int8 per channel, activations "
                                             "uint8 (min/max calibration); soft-argmax in float32",
                 "calibration": where}
    meta = export_meta(ckpt, data, checkpoint, hasattr(model, "forward_maps"))
    meta["precision"] = "int8" if int8 else "fp32"
    if quant:
        meta["quantization"] = quant
    if verify:
        meta["verify"] = verify_export(model, ckpt, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, suffix=".onnx") as tmp:
        tmp.write_bytes(data)
    write_json(json_path(out), meta)
    log.info("exported %s -> %s (%.1f MB) + %s", checkpoint, out, len(data) / 1e6, json_path(out).name)
    return meta


def demo_crops(size: int, n: int = 8, seed: int = 0, expand: float = 1.25) -> np.ndarray:
    """n synthetic demo faces cropped at `size` px as the pipeline crops them, (n, size, size, 3)."""

    crops = []
    for photo in range(n):
        r = render_photo(seed, 1, photo, 1, False)
        (file, [(box, _)]), = r["entries"]
        bgr = cv2.imdecode(np.frombuffer(r["files"][file], np.uint8), cv2.IMREAD_COLOR)
        assert bgr is not None  # bytes render_photo encoded
        image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        crops.append(crop_face(image, box, expand, size)[0])
    return np.stack(crops)


def verify_export(model: torch.nn.Module, ckpt: dict, data: bytes, faces: np.ndarray | None = None) -> dict:
    """Max |torch - onnxruntime| of the crop-pixel coordinates (plain and flip TTA)."""
    if not onnx_available():
        return {"skipped": "onnxruntime not installed (pip install 'pipeline[onnx]')"}
    size, expand = checkpoint_crop(ckpt)
    faces = demo_crops(size, expand=expand) if faces is None else faces
    model_config = ckpt["model_config"]
    kw = dict(input_size=model_config["input_size"], in_chans=model_config["in_chans"], flip_perm=ckpt["schema"]["flip"])
    ref = predict_crops(model, faces, **kw)
    got = predict_crops(OnnxModel(data, model_config), faces, **kw)
    diff = {k: float(np.abs(ref[k] - got[k]).max()) for k in ("plain", "tta")}
    log.info("onnxruntime vs torch on %d demo crops: max |diff| %.2g px (plain), %.2g px (flip TTA)",
             len(faces), diff["plain"], diff["tta"])
    return {"faces": len(faces), "max_abs_diff_px_plain": diff["plain"], "max_abs_diff_px_tta": diff["tta"]}


# ------------------------------------------------------------------------------ int8

def network_inputs(faces: np.ndarray, input_size: int, in_chans: int) -> np.ndarray:
    """uint8 crops (N, S, S, 3) -> the graph's input (N, C, H, W) float32, as predict_crops
    makes it (one definition of the preprocessing)."""
    return resize_batch(normalize_batch(faces_to_chw(faces, in_chans)), input_size).numpy()


def calibration_faces(ckpt: dict, source: str | os.PathLike | None, n: int = 128) -> tuple[np.ndarray, str]:
    """(uint8 crops (n, S, S, 3), where from) to calibrate int8 activations on: the first n
    faces of a face cache split (e.g. data/cache/train, cropped as the model was trained),
    else synthetic demo faces (a poorer calibration: say so)."""
    size, expand = checkpoint_crop(ckpt)
    if source is None:
        log.warning("int8 calibration on %d synthetic demo faces; pass --calibration data/cache/train "
                    "for the real faces the model was trained on", 32)
        return demo_crops(size, 32, expand=expand), "demo faces"
    cache = load_cache(source)
    if cache.faces.shape[1] != size:
        raise PipelineError(source, f"faces are {cache.faces.shape[1]} px, the model was trained on {size} px crops")
    return np.array(cache.faces[:n]), f"{source} ({min(n, len(cache))} faces)"


def quantize_int8(data: bytes, calib: np.ndarray) -> bytes:
    """Static int8 quantization (onnxruntime QDQ): Conv weights per output channel (int8),
    activations uint8 with min/max ranges from `calib` (N, C, H, W); the soft-argmax
    (softmax, expectations) stays float32. With AVX512-VNNI (or AVX2) onnxruntime runs the
    convolutions in int8: the largest saving one face at a time once the graph is fp32-optimal."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{INPUT: calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory(prefix="export-int8-") as d:
        fp32, pre, q = Path(d) / "fp32.onnx", Path(d) / "pre.onnx", Path(d) / "int8.onnx"
        fp32.write_bytes(data)
        quiet = logging.getLogger("onnxruntime")  # its shape inference logs at INFO on the root handler
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quant_pre_process(str(fp32), str(pre))
                quantize_static(str(pre), str(q), Reader(), quant_format=QuantFormat.QDQ,
                                op_types_to_quantize=["Conv"], per_channel=True,
                                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        finally:
            quiet.setLevel(level)
        return q.read_bytes()



@click.command("export")
@click.argument("checkpoint")
@click.option("--out", default=None, help="ONNX file [default: the checkpoint's name with .onnx]")
@click.option("--no-verify", is_flag=True, help="skip the onnxruntime vs PyTorch check on demo crops")
@click.option("--int8", is_flag=True, help="quantize the convolutions to int8 (faster on CPUs; check its accuracy "
                                           "with `pipeline bench --checkpoints model.onnx`)")
@click.option("--calibration", default=None, help="face cache split for the int8 calibration, e.g. data/cache/train "
                                                   "[synthetic demo faces]")
def export_cmd(checkpoint, out, no_verify, int8, calibration):
    """Export a checkpoint to ONNX (dynamic batch, soft-argmax included) plus <name>.json."""

    out = check_output(Path(out) if out else Path(checkpoint).with_suffix(".onnx"))
    meta = export_checkpoint(checkpoint, out, verify=not no_verify, int8=int8, calibration=calibration)
    click.echo(str(out))
    click.echo(str(json_path(out)))
    v = meta.get("verify", {})
    if "max_abs_diff_px_plain" in v:
        click.echo(f"onnxruntime vs torch: max |diff| {v['max_abs_diff_px_plain']:.2g} px plain, "
                   f"{v['max_abs_diff_px_tta']:.2g} px flip TTA on {v['faces']} demo crops")
