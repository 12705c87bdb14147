"""Inference on cached crops: a model (torch, or any callable of the same contract such
as pipeline/inference/onnx_runtime.py's OnnxModel) -> keypoints in crop pixels, with flip TTA,
then mapped to original-image pixels, one model at a time: several together are a
`pipeline.inference.landmarker.Landmarker`. Shared by it, train's validation, export's
check and bench."""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

import numpy as np
import torch
from tqdm import tqdm

from pipeline.core.config import params_source
from pipeline.core.device import amp_dtype, autocast
from pipeline.core.errors import PipelineError
from pipeline.formats.checkpoint import checkpoint_label_origin
from pipeline.keypoints.flip import flip_coords, flip_images
from pipeline.keypoints.geometry import input_to_crop, to_original
from pipeline.keypoints.preprocess import faces_to_chw, normalize_batch, resize_batch
from pipeline.keypoints.views import View, jitter_views, unwarp_coords, warp_view


class PresenceScore(Protocol):
    """A face-presence score (pipeline/inference/presence.py `Scorer`; passed in, so that
    training's validation, which predicts through here, does not depend on it): it reads the
    plain view's maps and, when `flip_perm` is set, the mirrored view's too."""

    @property
    def flip_perm(self) -> Sequence[int] | None: ...

    def __call__(self, probs: torch.Tensor, coords: torch.Tensor, input_size: int,
                 flip_probs: torch.Tensor | None = None, flip_raw: torch.Tensor | None = None) -> torch.Tensor: ...


@torch.inference_mode()
def predict_crops(model, faces: np.ndarray, *, input_size: int, in_chans: int,
                  flip_perm: Sequence[int] | None, batch_size: int = 64,
                  device: torch.device = torch.device("cpu"), amp: torch.dtype | None = None,
                  channels_last: bool = False, progress: bool = False,
                  jitter: Sequence[View] = (), presence: PresenceScore | None = None
                  ) -> dict[str, np.ndarray]:
    """Keypoints in crop pixels for uint8 faces (N, S, S, 3). `model` is a torch model or
    any callable of the same contract (pipeline/inference/onnx_runtime.py's OnnxModel).

    Returns {"plain": (N, K, 2)} and, when flip_perm is given, also {"flip": ..., "tta": ...}:
    the prediction on the mirrored face, un-mirrored (x -> W-1-x, left/right indices swapped
    back), and the mean of the two. The faces and their mirrors go through the model as one
    batch of 2B: one call instead of two, which at batch 1 (one face at a time) is most of
    the TTA cost saved.

    `jitter`: extra scale/shift views (pipeline.keypoints.views), each also mirrored when flip_perm is
    given, mapped back exactly and averaged into "tta" (plain and flip stay the unjittered
    views); they go through the model in the same call.

    `presence`: also {"presence": (N,)}, each face's face-presence score from the maps of the
    unjittered views it reads (`PresenceScore`: the plain one, and the mirrored one when it
    has a flip_perm, run for it alone when flip_perm here is None); NaN for a model without
    heatmaps."""

    model.eval()
    cache_size = faces.shape[1]
    outs: dict[str, list[np.ndarray]] = {"plain": []}
    if flip_perm is not None:
        outs["flip"] = []
    if jitter:
        outs["jitter"] = []
    maps = presence is not None and hasattr(model, "forward_maps")
    score_perm = presence.flip_perm if presence is not None and maps else None
    mirror = flip_perm is not None or score_perm is not None  # the mirrored view goes through the model
    scores: list[np.ndarray] = []
    starts: Iterable[int] = range(0, len(faces), batch_size)
    if progress:
        starts = tqdm(starts, desc="predict", unit="batch", leave=False)
    for s in starts:
        x = faces_to_chw(faces[s:s + batch_size], in_chans).to(device, non_blocking=True)  # (B, C, S, S) uint8
        x = resize_batch(normalize_batch(x, channels_last), input_size)  # (B, C, H, W) float
        b = x.shape[0]
        if jitter:
            fill = normalize_batch(torch.zeros((1, x.shape[1], 1, 1), dtype=torch.uint8, device=x.device))
            x = torch.cat([x, *(warp_view(x, v, fill) for v in jitter)])  # (V * B, C, H, W)
        with autocast(device, amp):
            batch = torch.cat([x, flip_images(x)]) if mirror else x
            probs = None
            if maps:
                out, probs = model.forward_maps(batch)
                out = out.float()
            else:
                out = model(batch).float()
            if flip_perm is None:
                pred = out[None, :len(x)]  # (1, V * B, K, 2) input px
            else:
                both = out  # (2 V B, K, 2) input px
                pred = torch.stack([both[:len(x)], flip_coords(both[len(x):], input_size, flip_perm)])
                outs["flip"].append(pred[1, :b].cpu().numpy())
        if presence is not None:
            if probs is None:
                scores.append(np.full(b, np.nan))
            elif score_perm is None:
                scores.append(presence(probs[:b], out[:b], input_size).cpu().numpy())
            else:
                n = len(x)
                scores.append(presence(probs[:b], out[:b], input_size, flip_probs=probs[n:n + b],
                                       flip_raw=out[n:n + b]).cpu().numpy())
        outs["plain"].append(pred[0, :b].cpu().numpy())
        if jitter:
            views = [pred[:, :b]] + [unwarp_coords(pred[:, (i + 1) * b:(i + 2) * b], v, input_size, input_size)
                                     for i, v in enumerate(jitter)]
            outs["jitter"].append(torch.stack(views).mean((0, 1)).cpu().numpy())
    res = {k: input_to_crop(np.concatenate(v).astype(np.float64), cache_size, input_size)
           for k, v in outs.items()}
    if jitter:
        res["tta"] = res.pop("jitter")  # every view, mirrored or not
    elif flip_perm is not None:
        res["tta"] = (res["plain"] + res["flip"]) / 2
    if presence is not None:
        res["presence"] = np.concatenate(scores).astype(np.float64) if scores else np.zeros(0)
    return res


def predict_original(model, ckpt: dict, faces: np.ndarray, crop_to_orig: np.ndarray, tta: str,
                     batch_size: int, device: torch.device, progress: bool = False,
                     amp: str = "auto", amp_key: str = "predict.amp", jitter: float = 0.0,
                     presence: PresenceScore | None = None) -> dict[str, np.ndarray]:
    """predict_crops for a checkpoint's model, mapped to original-image pixels, under the
    autocast of setting `amp` (the param `amp_key`: predict.amp, or train.amp in validation);
    `jitter` (predict.tta_jitter) adds the scale/shift views of pipeline/keypoints/views.py to
    the final answer; `presence` (see predict_crops) adds each face's presence score
    ("presence", (N,))."""
    if tta not in ("none", "flip"):
        raise PipelineError(params_source("predict.tta"), f"predict.tta must be none|flip, got '{tta}'")
    model_config = ckpt["model_config"]
    crops = predict_crops(model, faces, input_size=model_config["input_size"], in_chans=model_config["in_chans"],
                          flip_perm=ckpt["schema"]["flip"] if tta == "flip" else None,
                          batch_size=batch_size, device=device,
                          amp=amp_dtype(amp, device, amp_key), progress=progress, jitter=jitter_views(jitter),
                          presence=presence)
    scores = crops.pop("presence", None)
    # back to the labels' pixel grid (data.label_origin of the cache the model trained on)
    origin = checkpoint_label_origin(ckpt)
    out = {k: to_original(v, crop_to_orig) + origin for k, v in crops.items()}
    out["final"] = out["tta"] if "tta" in out else out["plain"]
    if scores is not None:
        out["presence"] = scores
    return out
