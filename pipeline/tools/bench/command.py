"""The `bench` command: every section in one run on one device, the table and the JSON."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Sequence

import click
import torch

from pipeline.core.config import config_options, with_overrides
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, write_json
from pipeline.core.params_schema import Config
from pipeline.formats.checkpoint import checkpoint_crop, crop_stamp, load_model
from pipeline.inference.options import device_option
from pipeline.keypoints.schema import get_schema
from pipeline.models import create_model, default_input_size, list_presets
from pipeline.tools.bench.accuracy import bench_accuracy
from pipeline.tools.bench.batch1 import bench_batch1, sample_test_crops
from pipeline.tools.bench.detectors import bench_detectors
from pipeline.tools.bench.inference import bench_infer
from pipeline.tools.bench.report import format_table
from pipeline.tools.bench.side_by_side import bench_train_side_by_side
from pipeline.tools.bench.timing import conv1x1_peak, matmul_peak
from pipeline.tools.bench.training import bench_train_variants, demo_cache
from pipeline.tools.bench.video import bench_video
from pipeline.tools.train_folds import available_cpus, plan_waves

log = logging.getLogger(__name__)

DEFAULT_DATA = Path("..") / "shared" / "data" / "ibug300w-mini"


# ------------------------------------------------------------------------------ helpers


# ------------------------------------------------------------------------------ training


# ------------------------------------------------------------------------------ inference


# ------------------------------------------------------------------------------ accuracy


# ------------------------------------------------------------------------------ the run

def resolve_data_dir(data: str | None) -> Path | None:
    """--data, else ../shared/data/ibug300w-mini relative to the cwd or to the repo, if present."""
    if data:
        p = Path(data)
        if not p.is_dir():
            raise PipelineError(p, "data set folder not found")
        return p
    for base in (Path.cwd(), Path(__file__).resolve().parents[1]):
        p = (base / DEFAULT_DATA).resolve()
        if p.is_dir():
            return p
    return None


def run_bench(cfg: Config, presets: Sequence[str], steps: int, batch_size: int | None, input_size: int | None,
              data: str | None, checkpoints: Sequence[str], device_name: str, cache: str | None = None,
              infer_batch: int = 64, rounds: int = 2, min_time: float = 1.0, matmul_n: int = 2048,
              use_dlib: bool = True, accuracy: bool = True, detectors: bool = True,
              video: bool = True, batch1_presets: Sequence[str] = (),
              variants: Sequence[Sequence[str]] = (), side_by_side: int = 0) -> dict[str, Any]:
    """Every section; the training one once per preset as the params say and once more per
    variant (a list of key=value overrides), each a row named '<preset> <overrides>', the
    variants of a preset timed in interleaved rounds; with `side_by_side` N (CPU only) the
    first preset's real feed also in N processes side by side, as `pipeline train-folds`
    trains the folds."""
    device = resolve_device(device_name)
    mcfg = cfg.model
    res: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
                           "note": "timings on a shared machine are noisy; compare ratios within one run"}
    if device.type == "cuda":
        res["device_name"] = torch.cuda.get_device_name(device)
    peak = {"fp32": matmul_peak(device, torch.float32, matmul_n)}
    if device.type == "cpu":
        # oneDNN's GEMM (a 1x1 convolution): on CPUs where MKL's sgemm takes a slower code
        # path (AMD) it is the convolutions' real ceiling, and compute efficiency uses it
        peak["fp32_onednn"] = conv1x1_peak(matmul_n)
        peak["fp32_mkl"] = peak["fp32"]
        peak["fp32"] = max(peak["fp32_mkl"], peak["fp32_onednn"])
    if device.type == "cuda":
        peak["bf16"] = matmul_peak(device, torch.bfloat16, matmul_n)
    res["matmul_peak_flops"] = peak
    log.info("matmul peak: %s", ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items()))

    def size_for(preset: str) -> int:
        if input_size:
            return input_size
        return mcfg.input_size if preset == mcfg.preset else default_input_size(preset)

    def options_for(preset: str) -> dict:
        return dict(mcfg.options) if preset == mcfg.preset else {}

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        res["train"] = {}
        for preset in presets:
            size = size_for(preset)
            cache_dir = Path(cache) if cache else None
            if cache_dir is None:
                cache_dir = Path(tmp) / f"s{size}" / "cache"
                if not cache_dir.exists():
                    log.info("no --cache: building a demo cache at %d px", size)
                    demo_cache(cache_dir.parent, size)
            names = [" ".join([preset, *variant]) for variant in [(), *variants]]
            log.info("train %s at %d px ...", ", ".join(names), size)
            rows = bench_train_variants([with_overrides(cfg, v) for v in [(), *variants]], preset, cache_dir, steps,
                                        batch_size or cfg.train.batch_size, size, device, rounds=rounds,
                                        options=options_for(preset))
            for name, tr in zip(names, rows):
                res["train"][name] = _efficiency(tr, peak)
            if side_by_side and preset == presets[0]:
                shares = _cpu_shares(side_by_side, device)
                log.info("train %s at %d px in %d processes side by side ...", preset, size, side_by_side)
                sbs = bench_train_side_by_side(cfg, preset, cache_dir, steps, batch_size or cfg.train.batch_size,
                                               size, shares, rounds=rounds, options=options_for(preset))
                sbs["row"] = names[0]
                sbs["ratio_to_one_process"] = sbs["images_per_s_real"] / res["train"][names[0]]["images_per_s_real"]
                res["train_side_by_side"] = sbs

    schema = get_schema(cfg.data)
    res["infer"] = {}
    for preset in presets:
        log.info("inference %s ...", preset)
        res["infer"][preset] = bench_infer(preset, schema.k, schema.flip_perm, size_for(preset), mcfg.in_chans,
                                           device, infer_batch, min_time, options_for(preset))

    # one face at a time on one core: the first .pt checkpoint, else the first preset untrained
    pts = [c for c in checkpoints if Path(c).suffix != ".onnx"]
    if pts:
        model, meta = load_model(pts[0], "cpu", schema=schema)
        crop_size = checkpoint_crop(meta, pts[0])[0]
        res["batch1_model"] = str(pts[0])
    else:
        torch.manual_seed(0)
        model = create_model(presets[0], schema.k, in_chans=mcfg.in_chans, input_size=size_for(presets[0]),
                             **options_for(presets[0]))
        crop_size = cfg.crop.side
        meta = {"model_config": model.config, "schema": schema.to_dict(),
                "crop": crop_stamp(crop_size, cfg.crop.expand, cfg.data.label_origin)}
        res["batch1_model"] = f"{presets[0]} (untrained)"
    log.info("batch 1, one core: %s ...", res["batch1_model"])
    res["batch1"] = bench_batch1(model, meta, crop_size, max(min_time, 0.01) * 3, use_dlib=use_dlib,
                                 faces=sample_test_crops(resolve_data_dir(data) if accuracy else None, cfg, meta),
                                 expand=checkpoint_crop(meta)[1])
    if video:
        log.info("video: %s ...", res["batch1_model"])
        res["video"] = bench_video(model, meta, cfg)
    # more architectures at batch 1, untrained (speed does not depend on the weights), each
    # from a crop of its input size (no resize, as the recipes cache them) beside dlib again
    res["batch1_presets"] = {}
    for preset in batch1_presets:
        torch.manual_seed(0)
        size = size_for(preset)
        model = create_model(preset, schema.k, in_chans=mcfg.in_chans, input_size=size, **options_for(preset))
        meta = {"model_config": model.config, "schema": schema.to_dict(),
                "crop": crop_stamp(size, cfg.crop.expand, cfg.data.label_origin)}
        log.info("batch 1, one core: %s (untrained, %d px) ...", preset, size)
        res["batch1_presets"][preset] = bench_batch1(
            model, meta, size, max(min_time, 0.01) * 3, use_dlib=use_dlib, expand=checkpoint_crop(meta)[1],
            faces=sample_test_crops(resolve_data_dir(data) if accuracy else None, cfg, meta))

    data_dir = resolve_data_dir(data) if (accuracy or detectors) else None
    if accuracy and data_dir is not None and (data_dir / cfg.data.solution).exists():
        log.info("accuracy on %s ...", data_dir)
        res["accuracy"] = bench_accuracy(data_dir, cfg, checkpoints, device, use_dlib=use_dlib)
    else:
        if checkpoints and accuracy:
            raise PipelineError(data or DEFAULT_DATA, "checkpoints given but no data set with a solution.csv")
        res["accuracy"] = {"skipped": "no data set with a solution (--data DIR)" if accuracy else "--no-accuracy"}
    if detectors and data_dir is not None and (data_dir / cfg.data.test_xml).exists():
        res["detectors"] = bench_detectors(data_dir, cfg)
    else:
        res["detectors"] = {"skipped": "no data set with a test XML (--data DIR)" if detectors else "--no-detectors"}
    return res


def _cpu_shares(processes: int, device: torch.device) -> list[tuple[int, ...]]:
    """The CPUs of each of `processes` side-by-side training processes, split as
    `pipeline train-folds` splits them."""
    if device.type != "cpu":
        raise PipelineError(None, f"--side-by-side times CPU training; the device is {device}")
    cpus = available_cpus()
    if processes > len(cpus):
        raise PipelineError(None, f"--side-by-side {processes} needs {processes} CPUs; this process may use {len(cpus)}")
    return [job.cpus for job in plan_waves(list(range(processes)), cpus, processes)[0]]


def _efficiency(tr: dict, peak: dict) -> dict:
    """Training FLOP/s as a fraction of the matmul peaks measured in the same run."""
    tr["compute_efficiency_synthetic"] = tr["train_flops_per_image"] * tr["images_per_s_synthetic"] / peak["fp32"]
    tr["compute_efficiency_real"] = tr["train_flops_per_image"] * tr["images_per_s_real"] / peak["fp32"]
    if "bf16" in peak:
        tr["compute_efficiency_synthetic_bf16_peak"] = (tr["train_flops_per_image"] *
                                                        tr["images_per_s_synthetic"] / peak["bf16"])
    return tr


def _csv(text: str | None) -> list[str]:
    """Split on the commas outside brackets, so a variant can hold a list value:
    'model.options.decoder_widths=[64,32,16,8,8],train.lr=0.4' is two overrides."""
    parts, depth, start, text = [], 0, 0, text or ""
    for i, ch in enumerate(text):
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [s.strip() for s in parts if s.strip()]


@click.command("bench")
@click.option("--presets", default=None, help="comma-separated model presets [params model.preset]")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="timed training steps per round")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(min=1),
              help="alternating real/synthetic rounds (best of each kept)")
@click.option("--batch-size", default=None, type=click.IntRange(min=1), help="training batch [params train.batch_size]")
@click.option("--input-size", default=None, type=click.IntRange(min=32), help="input px [params model.input_size / preset default]")
@click.option("--infer-batch", default=64, show_default=True, type=click.IntRange(min=1), help="batched inference size")
@click.option("--cache", default=None, help="training face cache (default: a temporary demo cache)")
@click.option("--data", default=None, help="data set with solution.csv for accuracy [../shared/data/ibug300w-mini if present]")
@click.option("--no-accuracy", is_flag=True, help="skip the accuracy section")
@click.option("--checkpoints", "checkpoints", multiple=True, help="checkpoint to score (repeatable)")
@click.argument("more_checkpoints", nargs=-1)
@click.option("--variant", "variants", multiple=True,
              help="one more training row with these comma-separated KEY=VALUE params, e.g. "
                   "--variant train.compile=on; a list keeps its commas inside brackets: "
                   "model.options.decoder_widths=[64,32,16,8,8] (repeatable; the rows share one table)")
@click.option("--side-by-side", default=0, show_default=True, type=click.IntRange(min=0),
              help="also time the first preset's training in N processes side by side, each pinned to its share "
                   "of the CPUs, as `pipeline train-folds` trains the folds (0 = off)")
@device_option
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="torch threads for the whole run [torch default]; the 1-thread figures are measured anyway")
@click.option("--min-time", default=1.0, show_default=True, type=float, help="seconds per inference measurement")
@click.option("--matmul-n", default=2048, show_default=True, type=click.IntRange(min=64))
@click.option("--no-dlib", is_flag=True, help="skip dlib even when installed")
@click.option("--no-detectors", is_flag=True, help="skip the face detector table")
@click.option("--no-video", is_flag=True, help="skip the video section")
@click.option("--batch1-presets", default=None,
              help="comma-separated presets also timed one face at a time, untrained, from crops of their input size")
@click.option("--out", "out_path", default="bench.json", show_default=True)
@config_options
def bench_cmd(presets, steps, rounds, batch_size, input_size, infer_batch, cache, data, no_accuracy, checkpoints,
              more_checkpoints, variants, side_by_side, device, threads, min_time, matmul_n, no_dlib, no_detectors,
              no_video, batch1_presets, out_path, cfg):
    """Training and inference speed, compute efficiency and accuracy in one run."""
    check_output(out_path)
    names = _csv(presets) or [cfg.model.preset]
    more = _csv(batch1_presets)
    unknown = [n for n in [*names, *more] if n not in list_presets()]
    if unknown:
        raise PipelineError(None, f"unknown preset(s) {unknown} (known: {', '.join(list_presets())})")
    if input_size is not None and input_size % 32:
        raise PipelineError(None, f"--input-size must be a multiple of 32, got {input_size}")
    if threads is not None:
        torch.set_num_threads(threads)
    res = run_bench(cfg, names, steps, batch_size, input_size, data, [*checkpoints, *more_checkpoints], device,
                    cache, infer_batch, rounds, min_time, matmul_n, not no_dlib, not no_accuracy, not no_detectors,
                    not no_video, more, [_csv(v) for v in variants], side_by_side)
    write_json(out_path, res)
    click.echo(format_table(res))
    click.echo(f"\nwrote {out_path}")
