"""The `budget-plot` command: validation NME against training minutes, one line per model, from
trained runs, so a user can choose a model and a schedule for the minutes they have.

Each run is a fold folder of `pipeline train` (metrics.json, best.pt). Its minutes are its
images trained (epochs x training faces) over the images/s of its own training step on this
machine, timed here in one run for every model (`pipeline bench`'s training timer on a synthetic
batch): the runs' wall clocks are not compared, since screens often share the cores."""

from __future__ import annotations

import json
import logging
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import click
import cv2
import numpy as np
import torch

from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, write_json
from pipeline.core.params_schema import Config
from pipeline.formats.checkpoint import load_checkpoint
from pipeline.formats.images import write_png
from pipeline.keypoints.draw import FONT
from pipeline.models import count_params, create_model
from pipeline.tools.bench.training import bench_train, demo_cache

log = logging.getLogger(__name__)


@dataclass
class Run:
    path: str  # the fold folder
    model: str  # the line it belongs to: preset, its non-default options, input size
    epochs: int  # epochs trained
    train_faces: int  # faces on the fold's training side (extras included)
    val_nme: float  # metrics.json's: best validated epoch, no TTA
    images_per_s: float = math.nan  # this machine's training pace for the run's model and batch
    minutes: float = math.nan  # epochs x train_faces / images_per_s


def model_label(model_config: dict) -> str:
    """'preset key=value ... , N px, P M params': the options that differ from the preset's."""
    preset, size = model_config["preset"], model_config["input_size"]
    with torch.device("meta"):  # counting only: no weights
        default = create_model(preset, model_config["num_keypoints"], model_config.get("in_chans", 3), size)
        params = count_params(create_model(preset, model_config["num_keypoints"], model_config.get("in_chans", 3),
                                           size, **model_config.get("options", {})))
    defaults: dict = getattr(default, "options", {})  # set by build_preset
    own = {k: v for k, v in model_config.get("options", {}).items() if defaults.get(k) != v}
    keys = " ".join(f"{k}={json.dumps(v, separators=(',', ''))}" for k, v in sorted(own.items()))
    return f"{preset}{' ' + keys if keys else ''}, {size} px, {params / 1e6:.1f}M params"


def read_run(folder: str | Path) -> tuple[Run, Config]:
    """A fold folder's figures and the config it was trained with."""
    folder = Path(folder)
    metrics_path = folder / "metrics.json"
    try:
        metrics = json.loads(metrics_path.read_text())
    except (OSError, ValueError) as e:
        raise PipelineError(metrics_path, f"cannot read the run's metrics ({type(e).__name__})") from None
    missing = [k for k in ("epochs", "train_faces", "val_nme") if k not in metrics]
    if missing:
        raise PipelineError(metrics_path, f"no {', '.join(missing)}: not a finished `pipeline train` run")
    ckpt = load_checkpoint(folder / "best.pt")
    cfg = Config.model_validate(ckpt["config"])
    return Run(str(folder), model_label(ckpt["model_config"]), int(metrics["epochs"]), int(metrics["train_faces"]),
               float(metrics["val_nme"])), cfg


def time_models(runs: list[Run], cfgs: list[Config], steps: int, rounds: int) -> None:
    """Each distinct (model, batch) trained for a few steps on a synthetic batch, on this
    machine, in this process: sets every run's images_per_s and minutes."""
    pace: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = demo_cache(Path(tmp), 64, n_train=64, n_test=4)
        for run, cfg in zip(runs, cfgs):
            key = (run.model, cfg.train.batch_size)
            if key not in pace:
                log.info("timing %s, batch %d ...", *key)
                row = bench_train(cfg, cfg.model.preset, cache, steps, cfg.train.batch_size, cfg.model.input_size,
                                  torch.device("cpu"), rounds=rounds, options=cfg.model.options)
                pace[key] = row["images_per_s_synthetic"]
            run.images_per_s = pace[key]
            run.minutes = run.epochs * run.train_faces / run.images_per_s / 60


# --------------------------------------------------------------------------------------
# drawing: a line chart in OpenCV, as every picture of the project

LINE_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]
REFERENCE_COLOR = (110, 110, 110)


def nice_ticks(lo: float, hi: float, n: int = 5) -> np.ndarray:
    """About n round tick values covering [lo, hi]."""
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.floor(lo / step), math.ceil(hi / step)
    return np.arange(first, last + 1) * step


def draw_chart(lines: dict[str, list[tuple[float, float]]], references: dict[str, float], title: str,
               xlabel: str, ylabel: str, size: tuple[int, int] = (900, 560)) -> np.ndarray:
    """RGB uint8 chart: one polyline with markers per entry of `lines` (x, y points), one dashed
    horizontal line per reference, a legend under the plot."""
    w, h = size
    legend_h = 20 * (len(lines) + len(references)) + 10
    img = np.full((h + legend_h, w, 3), 255, np.uint8)
    left, right, top, bottom = 70, 20, 56, h - 50
    xs = [x for pts in lines.values() for x, _ in pts]
    ys = [y for pts in lines.values() for _, y in pts] + list(references.values())
    if not xs:
        raise PipelineError(None, "nothing to plot")
    xt = nice_ticks(0.0, max(xs) * 1.05)
    yt = nice_ticks(min(ys) * 0.97, max(ys) * 1.02)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(x: float, y: float) -> tuple[int, int]:
        return (round(left + (x - x0) / (x1 - x0) * (w - left - right)),
                round(bottom - (y - y0) / (y1 - y0) * (bottom - top)))

    ink = (40, 40, 40)
    for x in xt:
        cv2.line(img, px(x, y0), px(x, y1), (230, 230, 230), 1)
        cv2.putText(img, f"{x:g}", (px(x, y0)[0] - 10, bottom + 18), FONT, 0.45, ink, 1, cv2.LINE_AA)
    for y in yt:
        cv2.line(img, px(x0, y), px(x1, y), (230, 230, 230), 1)
        cv2.putText(img, f"{y:g}", (8, px(x0, y)[1] + 5), FONT, 0.45, ink, 1, cv2.LINE_AA)
    cv2.rectangle(img, px(x0, y1), px(x1, y0), ink, 1)
    cv2.putText(img, title, (left, 18), FONT, 0.55, ink, 1, cv2.LINE_AA)
    cv2.putText(img, xlabel, (w // 2 - 80, bottom + 40), FONT, 0.5, ink, 1, cv2.LINE_AA)
    cv2.putText(img, ylabel, (8, top - 14), FONT, 0.5, ink, 1, cv2.LINE_AA)
    legend_y = h + 5
    for name, value in references.items():
        (xa, ya), (xb, _) = px(x0, value), px(x1, value)
        for s in range(xa, xb, 12):  # dashed
            cv2.line(img, (s, ya), (min(s + 6, xb), ya), REFERENCE_COLOR, 2, cv2.LINE_AA)
        cv2.line(img, (left, legend_y + 8), (left + 24, legend_y + 8), REFERENCE_COLOR, 2, cv2.LINE_AA)
        cv2.putText(img, f"{name}: {value:g}", (left + 32, legend_y + 13), FONT, 0.45, ink, 1, cv2.LINE_AA)
        legend_y += 20
    for i, (name, points) in enumerate(lines.items()):
        color = LINE_COLORS[i % len(LINE_COLORS)]
        pts = sorted(points)
        for p, q in zip(pts, pts[1:]):
            cv2.line(img, px(*p), px(*q), color, 2, cv2.LINE_AA)
        for p in pts:
            cv2.circle(img, px(*p), 5, color, -1, cv2.LINE_AA)
        cv2.line(img, (left, legend_y + 8), (left + 24, legend_y + 8), color, 2, cv2.LINE_AA)
        cv2.circle(img, (left + 12, legend_y + 8), 4, color, -1, cv2.LINE_AA)
        cv2.putText(img, name, (left + 32, legend_y + 13), FONT, 0.45, ink, 1, cv2.LINE_AA)
        legend_y += 20
    return img


def parse_reference(text: str) -> tuple[str, float]:
    """'LABEL=NME%' -> (label, value)."""
    label, sep, value = text.rpartition("=")
    try:
        number = float(value.rstrip("%"))
    except ValueError:
        number = math.nan
    if not sep or not label or not math.isfinite(number):
        raise PipelineError(None, f"--reference must be LABEL=NME (percent), got {text!r}")
    return label, number


def budget_plot(run_dirs: Sequence[str], out: str, references: Sequence[str] = (), title: str | None = None,
                steps: int = 4, rounds: int = 2) -> list[Run]:
    """Read, time and draw the runs: `out` (PNG) and the figures beside it (`out` .json)."""
    refs = dict(parse_reference(r) for r in references)  # before any work: a bad one fails at once
    check_output(out)
    read = [read_run(d) for d in run_dirs]
    runs, cfgs = [r for r, _ in read], [c for _, c in read]
    time_models(runs, cfgs, steps, rounds)
    lines: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        lines.setdefault(run.model, []).append((run.minutes, 100 * run.val_nme))
    threads = torch.get_num_threads()
    chart = draw_chart(lines, refs, title or "Validation NME against training minutes",
                       f"training minutes ({threads} threads, this machine)", "NME %")
    write_png(out, chart)
    write_json(Path(out).with_suffix(".json"), {"threads": threads, "references": refs,
                                                "runs": [asdict(r) for r in runs]})
    for run in sorted(runs, key=lambda r: (r.model, r.minutes)):
        log.info("%-60s %5.1f min  %6.2f%%  %s", run.model, run.minutes, 100 * run.val_nme, run.path)
    return runs


@click.command("budget-plot")
@click.argument("runs", nargs=-1, required=True)
@click.option("--out", required=True, help="the chart (PNG); its figures go beside it as .json")
@click.option("--reference", "references", multiple=True,
              help="a horizontal line LABEL=NME (percent), e.g. 'dlib, public test=5.41' (repeatable)")
@click.option("--title", default=None)
@click.option("--steps", default=4, show_default=True, type=click.IntRange(min=1), help="timed steps per round")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch threads [torch default]")
def budget_plot_cmd(runs, out, references, title, steps, threads):
    """Validation NME against training minutes, one line per model, from trained fold folders
    (RUNS: folders with metrics.json and best.pt)."""
    if threads:
        torch.set_num_threads(threads)
    budget_plot(runs, out, references, title, steps)
