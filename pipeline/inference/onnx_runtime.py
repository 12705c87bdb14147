"""Exported models on onnxruntime: `OnnxModel` stands in for the torch model wherever the
pipeline predicts (`predict_crops` calls `model(x)`, the heatmaps call `model.forward_maps(x)`),
so the crop, resize, normalisation, flip TTA and map-back code is the same for both backends."""

from __future__ import annotations

import importlib.util
import os

import torch

from pipeline.core.errors import PipelineError
from pipeline.formats.onnx_export import COORDS, INPUT, PROBS, read_export


def onnx_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


class OnnxModel:
    """An onnxruntime session with the torch model's calling convention: `model(x)` ->
    coords (B, K, 2) and `model.forward_maps(x)` -> (coords, probs), x a float CPU tensor
    (B, C, H, W) already normalised. Runs on the CPU."""

    def __init__(self, source: bytes | str | os.PathLike, model_config: dict, threads: int | None = None):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # one face at a time is latency-bound: the intra-op pool is the torch thread count
        # unless told, so `pipeline bench`'s 1-thread figures mean one core for both backends
        so.intra_op_num_threads = int(threads or torch.get_num_threads())
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        src = source if isinstance(source, bytes) else str(source)
        try:
            self.session = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own (non-exported) exception types
            raise PipelineError(None if isinstance(source, bytes) else source,
                                f"onnxruntime cannot load the model ({str(e).splitlines()[0][:160]})") from None
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.config = model_config
        if PROBS in self.outputs:
            self.forward_maps = self._forward_maps

    def eval(self):
        return self

    def to(self, *args, **kwargs):
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        coords = self.session.run([COORDS], {INPUT: x.detach().cpu().float().contiguous().numpy()})[0]
        return torch.from_numpy(coords)  # (B, K, 2)

    def _forward_maps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        coords, probs = self.session.run([COORDS, PROBS], {INPUT: x.detach().cpu().float().contiguous().numpy()})
        return torch.from_numpy(coords), torch.from_numpy(probs)


def load_onnx(onnx_path: str | os.PathLike, schema=None, threads: int | None = None) -> tuple[OnnxModel, dict]:
    """(OnnxModel, ckpt-like meta) of an exported model."""
    if not onnx_available():
        raise PipelineError(onnx_path, "the onnx backend needs onnxruntime: pip install 'pipeline[onnx]'")
    meta = read_export(onnx_path, schema)
    return OnnxModel(onnx_path, meta["model_config"], threads), meta
