"""Video inference speed: frames/s end to end (decode, detect, predict, draw, encode) on a test
video the project makes."""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import Config
from pipeline.detection.detectors import get_detector
from pipeline.inference.landmarker import Landmarker
from pipeline.inference.predictor import prepare_torch
from pipeline.tools.video import measure_smoothing


def bench_video(model, meta: dict, cfg: Config, n_frames: int = 60) -> dict[str, Any]:
    """`pipeline bench`'s video section: `measure_smoothing` with the torch backend on the CPU,
    the installed detector (video.detector) and the params' smoothing (video.filter)."""

    try:
        det = get_detector(cfg.video.detector)
    except PipelineError as e:
        return {"skipped": e.problem}
    with tempfile.TemporaryDirectory(prefix="bench-video-") as d:
        landmarker = Landmarker([(prepare_torch(model), meta)], tta=cfg.predict.tta, device=torch.device("cpu"))
        res = measure_smoothing(landmarker, cfg.video, d, n_frames)
    res["detector"] = det.description
    return res


def format_video(v: dict | None) -> list[str]:
    if not v:
        return []
    if "skipped" in v:
        return [f"video: skipped ({v['skipped']})"]
    lines = [(f"video: {v['frames']}-frame test videos (make-test-video), {v['detector']}; smoothing: "
              f"{v.get('filter', 'One Euro')}; frames/s end to end (decode, detect, predict, draw, "
              f"encode): {v['frames_per_s']:.1f}"),
             ("  jitter: frame-to-frame motion less the truth's, px; jitter2: mean |p[t+1] - 2p[t] + p[t-1]|, "
              "% of the eye distance; lag: mean |smoothed - raw| %, delay frames"),
             (f"{'video':<8} {'jitter raw px':>13} {'smoothed':>9} {'NME raw %':>10} {'smoothed':>9} {'tracks':>6} "
              f"{'jitter2 raw':>11} {'smoothed':>9} {'lag %':>6} {'delay':>5}")]
    for kind in ("still", "moving"):
        r = v[kind]
        st = r.get("stats", {})
        lines.append(f"{kind:<8} {r['raw']['jitter_px']:>13.3f} {r['smoothed']['jitter_px']:>9.3f} "
                     f"{100 * r['raw']['nme']:>10.2f} {100 * r['smoothed']['nme']:>9.2f} {r['tracks']:>6} "
                     f"{100 * st.get('jitter_raw', float('nan')):>11.3f} "
                     f"{100 * st.get('jitter_smoothed', float('nan')):>9.3f} "
                     f"{100 * st.get('lag', {}).get('offset', float('nan')):>6.3f} "
                     f"{st.get('lag', {}).get('delay', float('nan')):>5.0f}")
    return lines
