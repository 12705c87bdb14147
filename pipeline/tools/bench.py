"""`pipeline bench`: training throughput, compute efficiency, inference speed and accuracy,
all measured in one run on one device, printed as a fixed-width table and written as JSON.

Sections (each figure lands in the JSON under the same names):

* train/<preset>: images/s of full training steps (forward, loss, backward, optimizer
  step) on the setup `pipeline train` builds (`train.build_training`, `train.train_steps`),
  fed by its real data path (`train.make_epoch_loader`: face cache -> FaceDataset with
  TrainAugment -> DataLoader -> DeviceLoader's producer thread) and by a synthetic batch
  already on the device; `data_overhead` = 1 - real / synthetic (goal <= 5%);
  `data_wait_frac_real` = the share of the real rounds' time spent waiting for a batch (what
  the trainer logs as "data wait").
* efficiency: training FLOPs per image (3 x the forward FLOPs of `model_flops`: forward +
  backward ~ 3 forwards) x images/s, over the fp32 matmul peak measured in the same run
  (torch.matmul of 2048x2048 fp32, best of a few reps; on CUDA bf16 too).
* infer/<preset>: faces/s of `predict_crops` (uint8 crops -> coordinates) with and without
  flip TTA, batch 1 and batched, with the default thread count and with 1 thread.
* batch1: one face at a time on one core, the first checkpoint through every inference
  backend (eager torch, the torch backend, onnxruntime fp32 and int8) beside dlib's
  predictor on the same crops, in alternating rounds (`bench_batch1`).
* detectors (data set with a test XML): recall / unmatched detections per photo / photos/s
  of every installed face detector (`bench_detectors`, pipeline/detection/detectors.py).
* accuracy (data set with a solution.csv): MAE / NME / faces/s of the given checkpoints
  (exported .onnx models too),
  of the mean-shape-in-box baseline (mean training shape in box-normalised coordinates,
  placed into each test box) and of dlib's 68-point shape predictor when installed
  (`pip install 'pipeline[dlib]'`).

Timings on a shared machine are noisy: real and synthetic steps are measured in
alternating rounds and the best round of each is kept, so their ratio is taken under the
same load."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import click
import numpy as np
import torch

from pipeline.core.config import config_options
from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

DEFAULT_DATA = Path("..") / "shared" / "data" / "ibug300w-mini"


# ------------------------------------------------------------------------------ helpers

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """torch.set_num_threads(n) inside the block (None: unchanged)."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of an n x n x n torch.matmul (2 n^3 FLOPs) over `reps` timed runs."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up (allocations, BLAS thread pool)
    _sync(device)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


class _Steps:
    """A DeviceLoader look-alike for `train_one_epoch`: `steps` batches of `feed`, counting
    the images and the seconds spent waiting for them (`wait_s`, as the trainer reads it)."""

    def __init__(self, feed, steps: int):
        self.feed, self.steps, self.wait_s, self.images = feed, steps, 0.0, 0

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return self.feed.batches(self)


class _TrainEpochs:
    """The real feed: `pipeline train`'s epochs (`make_epoch_loader`: sampler, augmentation,
    DataLoader, DeviceLoader's producer thread) one after another. A round that ends
    mid-epoch leaves the rest of it; the next round starts the next epoch."""

    def __init__(self, setup):
        self.setup, self.epoch = setup, 0

    def batches(self, take: _Steps):
        from pipeline.stages.train import make_epoch_loader

        done = 0
        while done < take.steps:
            loader = make_epoch_loader(self.setup, self.epoch)
            self.epoch += 1
            epoch = iter(loader)
            try:
                for batch in itertools.islice(epoch, take.steps - done):
                    done += 1
                    take.images += len(batch[0])
                    yield batch
            finally:
                epoch.close()  # stops the loader's producer thread
                take.wait_s += loader.wait_s


class _Repeat:
    """The synthetic feed: the same on-device batch, `take.steps` times."""

    def __init__(self, batch):
        self.batch = batch

    def batches(self, take: _Steps):
        for _ in range(take.steps):
            take.images += len(self.batch[0])
            yield self.batch


def demo_cache(workdir: Path, size: int, n_train: int = 320, n_test: int = 16) -> Path:
    """A small demo data set cropped into <workdir>/cache (for a bench from a fresh clone);
    320 faces: an epoch as long as a fold's in the default run (20 batches of 16)."""
    from pipeline.core.config import load_config
    from pipeline.stages.crop import run_crop
    from pipeline.stages.demo import generate_demo

    demo = generate_demo(workdir / "demo", n_train=n_train, n_test=n_test, seed=0)
    cfg = load_config(None, [f"data.dir={demo}", f"crop.side={size}", "crop.n_jobs=1"])
    run_crop(cfg, workdir / "cache")
    return workdir / "cache"


# ------------------------------------------------------------------------------ training

def bench_train(cfg: dict, preset: str, cache_dir: Path, steps: int, batch_size: int, input_size: int,
                device: torch.device, rounds: int = 2, warmup: int = 2, options: dict | None = None) -> dict[str, float]:
    """images/s of training steps through the real data path and on a synthetic batch, both
    on the setup `pipeline train` builds (`train.build_training`, `train.train_steps`) for
    this preset, input size and batch, on every face of the cache."""
    from pipeline.formats.cache import load_cache
    from pipeline.models import model_flops
    from pipeline.keypoints.preprocess import normalize_batch
    from pipeline.stages.train import StepState, build_training, train_steps

    cache = load_cache(Path(cache_dir) / "train")
    if cache.keypoints is None:
        raise PipelineError(Path(cache_dir) / "train", "bench needs a labelled training cache")
    bs = min(batch_size, len(cache))
    cfg = {**cfg, "model": {**cfg["model"], "preset": preset, "input_size": input_size, "options": dict(options or {})},
           "train": {**cfg["train"], "batch_size": bs}}
    setup = build_training(cfg, cache, np.arange(len(cache)), device)
    # constant, low lr: the schedule does not change the cost of a step, and random
    # synthetic targets must not make the loss diverge
    setup.state = StepState(0, 10 ** 9, 0, cfg["train"]["lr"] * 0.1)
    in_chans, k = cfg["model"]["in_chans"], cache.schema.k
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (bs, in_chans, input_size, input_size), dtype=torch.uint8, generator=g)
    target = torch.rand(bs, k, 2, generator=g) * (input_size - 1)
    synth = (normalize_batch(images.to(device), setup.channels_last), target.to(device), torch.arange(bs))
    real_feed, synth_feed = _TrainEpochs(setup), _Repeat(synth)

    def run(feed, n):
        take = _Steps(feed, n)
        _sync(device)
        t0 = time.perf_counter()
        train_steps(setup, take, progress=False)
        _sync(device)
        elapsed = time.perf_counter() - t0
        return take.images / elapsed, take.wait_s / elapsed

    run(real_feed, warmup)
    run(synth_feed, warmup)
    real, syn = [], []
    for _ in range(rounds):  # alternate, so both see the same background load
        real.append(run(real_feed, steps))
        syn.append(run(synth_feed, steps))
    best_real, wait_frac = max(real)
    best_syn = max(syn)[0]
    flops = 3.0 * model_flops(setup.model, input_size, in_chans)
    return {"images_per_s_real": best_real, "images_per_s_synthetic": best_syn,
            "data_overhead": 1.0 - best_real / best_syn, "ratio_real_synthetic": best_real / best_syn,
            "data_wait_frac_real": wait_frac, "train_flops_per_image": flops, "batch_size": bs,
            "input_size": input_size, "steps": steps, "num_workers": cfg["train"]["num_workers"]}


# ------------------------------------------------------------------------------ inference

def _faces_per_s(model, faces: np.ndarray, *, input_size: int, in_chans: int, flip_perm, batch_size: int,
                 device: torch.device, min_time: float) -> float:
    """faces/s of predict_crops over `faces`, repeated until `min_time` seconds have passed."""
    from pipeline.inference.tta import predict_crops

    def once(x):
        predict_crops(model, x, input_size=input_size, in_chans=in_chans, flip_perm=flip_perm,
                      batch_size=batch_size, device=device)

    once(faces[:batch_size])  # warm-up
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while True:
        once(faces)
        n += len(faces)
        _sync(device)
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return n / dt


def bench_infer(preset: str, num_keypoints: int, flip_perm: Sequence[int], input_size: int, in_chans: int,
                device: torch.device, batch: int, min_time: float = 1.0, options: dict | None = None,
                single_thread: bool = True) -> dict[str, float]:
    """faces/s: {bs1, bs<batch>} x {plain, flip TTA} x {default threads, 1 thread (CPU)}."""
    from pipeline.models import create_model

    torch.manual_seed(0)
    model = create_model(preset, num_keypoints, in_chans=in_chans, input_size=input_size,
                         **(options or {})).to(device).eval()
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    threads = [None, 1] if (single_thread and device.type == "cpu") else [None]
    for nt in threads:
        tag = "" if nt is None else "_1thread"
        with num_threads(nt):
            for bs in (1, batch):
                faces = rng.integers(0, 256, (max(bs, 4) if bs == 1 else bs, input_size, input_size, 3),
                                     dtype=np.uint8)
                for tta, perm in (("plain", None), ("flip", list(flip_perm))):
                    out[f"bs{bs if bs == 1 else 'N'}_{tta}{tag}"] = _faces_per_s(
                        model, faces, input_size=input_size, in_chans=in_chans, flip_perm=perm,
                        batch_size=bs, device=device, min_time=min_time)
    out["batch"] = batch
    out["input_size"] = input_size
    return out


def bench_batch1(model, meta: dict, crop_size: int, min_time: float = 1.0, faces: np.ndarray | None = None,
                 expand: float = 1.25, use_dlib: bool = True, rounds: int = 3,
                 backends: Sequence[str] = ("torch-eager", "torch", "onnx", "onnx-int8")) -> dict[str, Any]:
    """One face at a time on one core (batch 1, 1 thread), the full per-face path of
    `predict_crops` (uint8 crop -> resize, normalise -> network -> crop px), plain and flip
    TTA, for: the eager model as trained (torch-eager), the torch backend (BatchNorm folded,
    channels_last), onnxruntime (in-memory export of the same weights; skipped when not
    installed) and onnxruntime int8 (`export --int8`, calibrated here on the timed crops:
    a speed figure; its accuracy comes from scoring an exported model in the accuracy
    section); beside dlib's 68-point predictor on the same crops (its box: the face box
    inside the crop). Neither side times decoding or cropping.

    Every method runs `rounds` times in alternation for min_time / rounds seconds each and
    keeps its best round, so on a shared machine all of them see the same background load
    and the ratios to dlib hold even when the absolute figures do not."""
    from pipeline.inference.predictor import prepare_torch
    from pipeline.tools.export import network_inputs, quantize_int8
    from pipeline.inference.tta import predict_crops
    from pipeline.formats.onnx_meta import OnnxModel, onnx_available, onnx_bytes

    cfg = meta["model_config"]
    size, chans, perm = int(cfg["input_size"]), int(cfg["in_chans"]), list(meta["schema"]["flip"])
    if faces is None:
        faces = np.random.default_rng(0).integers(0, 256, (16, crop_size, crop_size, 3), dtype=np.uint8)
    out: dict[str, Any] = {"input_size": size, "crop_size": int(faces.shape[1]), "threads": 1,
                           "faces": len(faces), "rounds": rounds}
    cpu = torch.device("cpu")
    model = model.to(cpu).eval()
    methods: dict[str, Any] = {}  # name -> fn(face index)
    with num_threads(1):
        for name in backends:
            if name.startswith("onnx") and not onnx_available():
                out[name] = {"skipped": "onnxruntime not installed (pip install 'pipeline[onnx]')"}
                continue
            if name == "torch-eager":
                runner = model
            elif name == "torch":
                runner = prepare_torch(model)
            else:
                data = onnx_bytes(model, size, chans)
                if name == "onnx-int8":
                    data = quantize_int8(data, network_inputs(faces, size, chans))
                runner = OnnxModel(data, cfg, threads=1)
            for tta, p in (("plain", None), ("flip", perm)):
                methods[f"{name}/{tta}"] = (lambda i, r=runner, p=p: predict_crops(
                    r, faces[i:i + 1], input_size=size, in_chans=chans, flip_perm=p, batch_size=1, device=cpu))
        dlib, predictor = _dlib_or_skip(out) if use_dlib else (None, None)
        if predictor is not None:
            s = faces.shape[1]
            lo, hi = round(s / 2 - s / expand / 2), round(s / 2 + s / expand / 2) - 1  # the box in the crop
            rect = dlib.rectangle(lo, lo, hi, hi)
            crops = [np.ascontiguousarray(f) for f in faces]
            methods["dlib/plain"] = lambda i: predictor(crops[i], rect)
        best = {k: 0.0 for k in methods}
        for fn in methods.values():
            fn(0)  # warm-up (first-call allocations, lazy initialisation)
        for _ in range(rounds):
            for name, fn in methods.items():
                n, t0 = 0, time.perf_counter()
                while True:
                    fn(n % len(faces))
                    n += 1
                    dt = time.perf_counter() - t0
                    if dt >= min_time / rounds:
                        break
                best[name] = max(best[name], n / dt)
    for key, v in best.items():
        name, tta = key.split("/")
        out.setdefault(name, {})[tta] = v
    return out


def _test_crops(data_dir: Path | None, cfg: dict, meta: dict, n: int = 32) -> np.ndarray | None:
    """Up to n test faces of the data set, cropped at the model's crop geometry (None: no data)."""
    from pipeline.formats.checkpoint import checkpoint_crop
    from pipeline.formats.annotations import load_xml
    from pipeline.formats.annotations import crop_faces
    from pipeline.keypoints.schema import get_schema

    if data_dir is None or not (data_dir / cfg["data"]["test_xml"]).exists():
        return None
    xml = data_dir / cfg["data"]["test_xml"]
    faces = load_xml(xml, get_schema(dict(cfg["data"], dir=str(data_dir))), require_parts=False)[:n]
    size, expand = checkpoint_crop(meta)
    return crop_faces(faces, data_dir, size, expand, 1, xml)[0]


def bench_detectors(data_dir: Path, cfg: dict, limit: int | None = None) -> dict[str, Any]:
    """Recall at IoU >= 0.5 of the test XML boxes, unmatched detections per photo and
    photos/s (1 thread) of every installed face detector (pipeline.detection.detectors)."""
    from pipeline.detection.detectors import DETECTORS, INSTALL, available, evaluate

    xml = data_dir / cfg["data"]["test_xml"]
    out: dict[str, Any] = {"xml": str(xml)}
    for name in DETECTORS:
        if not available(name):
            out[name] = {"skipped": f"not installed ({INSTALL[name]})"}
            continue
        log.info("detector %s ...", name)
        with num_threads(1):
            out[name] = evaluate(xml, name, 0.5, limit)
    return out


# ------------------------------------------------------------------------------ accuracy

def box_normalised(keypoints: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """(N, K, 2) original px -> box coordinates: ((x - left) / width, (y - top) / height)."""
    b = np.asarray(boxes, dtype=np.float64)
    return (np.asarray(keypoints, dtype=np.float64) - b[:, None, :2]) / b[:, None, 2:4]


def place_in_boxes(shape: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """A (K, 2) box-normalised shape -> (N, K, 2) original px in each (left, top, w, h) box."""
    b = np.asarray(boxes, dtype=np.float64)
    return b[:, None, :2] + np.asarray(shape, dtype=np.float64)[None] * b[:, None, 2:4]


def mean_shape_baseline(train_kp: np.ndarray, train_boxes: np.ndarray, test_boxes: np.ndarray) -> np.ndarray:
    """The mean training shape in box-normalised coordinates, placed into every test box."""
    return place_in_boxes(box_normalised(train_kp, train_boxes).mean(0), test_boxes)


def _dlib_or_skip(out: dict) -> tuple:
    """(dlib, predictor), or (None, None) with the reason under out["dlib"]."""
    try:
        return dlib_predictor()
    except ImportError as e:
        out["dlib"] = {"skipped": f"dlib not installed ({e}); pip install 'pipeline[dlib]'"}
        return None, None


def dlib_predictor():
    """(dlib module, 68-point shape predictor) or raise ImportError."""
    import importlib.util

    import dlib

    try:
        import face_recognition_models

        path = face_recognition_models.pose_predictor_model_location()
    except ModuleNotFoundError as e:  # it imports pkg_resources, gone from new setuptools
        if e.name != "pkg_resources":
            raise
        spec = importlib.util.find_spec("face_recognition_models")
        if spec is None or spec.origin is None:
            raise
        path = str(Path(spec.origin).parent / "models" / "shape_predictor_68_face_landmarks.dat")
    return dlib, dlib.shape_predictor(path)


def _score(pred, truth, eyes) -> dict[str, float]:
    from pipeline.keypoints.metrics import mae, nme

    return {"mae": mae(pred, truth), "nme": nme(pred, truth, eyes) if eyes is not None else float("nan")}


def bench_accuracy(data_dir: Path, cfg: dict, checkpoints: Sequence[str], device: torch.device,
                   batch_size: int = 64, use_dlib: bool = True) -> dict[str, Any]:
    from pipeline.inference.predictor import load_predictor
    from pipeline.formats.checkpoint import checkpoint_crop
    from pipeline.formats.annotations import load_xml, read_image, safe_image_path
    from pipeline.formats.annotations import crop_faces
    from pipeline.inference.tta import predict_original
    from pipeline.keypoints.schema import get_schema
    from pipeline.formats.submission import read_solution

    dcfg = dict(cfg["data"], dir=str(data_dir))
    schema = get_schema(dcfg)
    train = load_xml(data_dir / dcfg["train_xml"], schema, require_parts=True)
    test_xml = data_dir / dcfg["test_xml"]
    test = load_xml(test_xml, schema, require_parts=False)
    truth = read_solution(data_dir / dcfg["solution"]).reshape(len(test), schema.k, 2)
    test_boxes = np.array([f.box for f in test], dtype=np.float64)
    out: dict[str, Any] = {"data": str(data_dir), "n_test": len(test), "n_train": len(train)}

    t0 = time.perf_counter()
    pred = mean_shape_baseline(np.stack([f.keypoints for f in train]), np.array([f.box for f in train]), test_boxes)
    dt = time.perf_counter() - t0
    out["mean_shape"] = {**_score(pred, truth, schema.eyes), "faces_per_s": len(test) / max(dt, 1e-9)}

    crops_by: dict[tuple, tuple] = {}
    for path in checkpoints:
        model, ckpt = load_predictor(path, None, device, schema=schema)  # an exported .onnx runs on onnxruntime
        key = checkpoint_crop(ckpt, path)
        if key not in crops_by:
            crops_by[key] = crop_faces(test, data_dir, key[0], key[1], cfg["crop"]["n_jobs"], test_xml)
        crops, a = crops_by[key]
        tta = cfg["predict"]["tta"]
        predict_original(model, ckpt, crops[:2], a[:2], tta, batch_size, device)  # warm-up
        res = {}
        for nt, tag in ((None, ""), (1, "_1thread")):
            if nt is not None and Path(path).suffix == ".onnx":  # an onnxruntime session fixes its threads
                model = load_predictor(path, None, device, schema=schema, threads=nt)[0]
                predict_original(model, ckpt, crops[:2], a[:2], tta, batch_size, device)  # warm-up
            with num_threads(nt):
                _sync(device)
                t0 = time.perf_counter()
                pred = predict_original(model, ckpt, crops, a, tta, batch_size, device)["final"]
                _sync(device)
                res["faces_per_s" + tag] = len(test) / (time.perf_counter() - t0)
        out[f"checkpoint:{path}"] = {**_score(pred, truth, schema.eyes), **res, "tta": tta,
                                     "preset": ckpt["model_config"]["preset"],
                                     "input_size": ckpt["model_config"]["input_size"]}

    dlib, predictor = _dlib_or_skip(out) if use_dlib else (None, None)
    if predictor is not None:
        by_image: dict[str, list[int]] = {}
        for i, f in enumerate(test):
            by_image.setdefault(f.image, []).append(i)
        pred = np.zeros_like(truth)
        spent = 0.0
        for rel, idx in by_image.items():
            image = read_image(safe_image_path(data_dir, rel, test_xml))  # RGB uint8, not timed
            for i in idx:
                left, top, w, h = test[i].box
                rect = dlib.rectangle(int(round(left)), int(round(top)), int(round(left + w - 1)),
                                      int(round(top + h - 1)))
                t0 = time.perf_counter()
                shape = predictor(image, rect)
                spent += time.perf_counter() - t0
                pred[i] = [(p.x, p.y) for p in shape.parts()]
        out["dlib"] = {**_score(pred, truth, schema.eyes), "faces_per_s_1thread": len(test) / max(spent, 1e-9)}
    return out


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


def run_bench(cfg: dict, presets: Sequence[str], steps: int, batch_size: int | None, input_size: int | None,
              data: str | None, checkpoints: Sequence[str], device_name: str, cache: str | None = None,
              infer_batch: int = 64, rounds: int = 2, min_time: float = 1.0, matmul_n: int = 2048,
              use_dlib: bool = True, accuracy: bool = True, detectors: bool = True) -> dict[str, Any]:
    from pipeline.formats.checkpoint import checkpoint_crop, load_model
    from pipeline.core.device import resolve_device
    from pipeline.models import create_model, default_input_size
    from pipeline.keypoints.schema import get_schema

    device = resolve_device(device_name)
    mcfg = cfg["model"]
    res: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
                           "note": "timings on a shared machine are noisy; compare ratios within one run"}
    if device.type == "cuda":
        res["device_name"] = torch.cuda.get_device_name(device)
    peak = {"fp32": matmul_peak(device, torch.float32, matmul_n)}
    if device.type == "cuda":
        peak["bf16"] = matmul_peak(device, torch.bfloat16, matmul_n)
    res["matmul_peak_flops"] = peak
    log.info("matmul peak: %s", ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items()))

    def size_for(preset: str) -> int:
        if input_size:
            return input_size
        return mcfg["input_size"] if preset == mcfg["preset"] else default_input_size(preset)

    def options_for(preset: str) -> dict:
        return dict(mcfg["options"]) if preset == mcfg["preset"] else {}

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
            log.info("train %s at %d px ...", preset, size)
            tr = bench_train(cfg, preset, cache_dir, steps, batch_size or cfg["train"]["batch_size"], size, device,
                             rounds=rounds, options=options_for(preset))
            tr["compute_efficiency_synthetic"] = tr["train_flops_per_image"] * tr["images_per_s_synthetic"] / peak["fp32"]
            tr["compute_efficiency_real"] = tr["train_flops_per_image"] * tr["images_per_s_real"] / peak["fp32"]
            if "bf16" in peak:
                tr["compute_efficiency_synthetic_bf16_peak"] = (tr["train_flops_per_image"] *
                                                                tr["images_per_s_synthetic"] / peak["bf16"])
            res["train"][preset] = tr

    schema = get_schema(cfg["data"])
    res["infer"] = {}
    for preset in presets:
        log.info("inference %s ...", preset)
        res["infer"][preset] = bench_infer(preset, schema.k, schema.flip_perm, size_for(preset), mcfg["in_chans"],
                                           device, infer_batch, min_time, options_for(preset))

    # one face at a time on one core: the first .pt checkpoint, else the first preset untrained
    pts = [c for c in checkpoints if Path(c).suffix != ".onnx"]
    if pts:
        model, meta = load_model(pts[0], "cpu", schema=schema)
        crop_size = checkpoint_crop(meta, pts[0])[0]
        res["batch1_model"] = str(pts[0])
    else:
        torch.manual_seed(0)
        model = create_model(presets[0], schema.k, in_chans=mcfg["in_chans"], input_size=size_for(presets[0]),
                             **options_for(presets[0]))
        meta, crop_size = {"model_config": model.config, "schema": schema.to_dict()}, cfg["crop"]["side"]
        res["batch1_model"] = f"{presets[0]} (untrained)"
    log.info("batch 1, one core: %s ...", res["batch1_model"])
    res["batch1"] = bench_batch1(model, meta, crop_size, max(min_time, 0.01) * 3, use_dlib=use_dlib,
                                 faces=_test_crops(resolve_data_dir(data) if accuracy else None, cfg, meta),
                                 expand=checkpoint_crop(meta)[1])

    data_dir = resolve_data_dir(data) if (accuracy or detectors) else None
    if accuracy and data_dir is not None and (data_dir / cfg["data"]["solution"]).exists():
        log.info("accuracy on %s ...", data_dir)
        res["accuracy"] = bench_accuracy(data_dir, cfg, checkpoints, device, use_dlib=use_dlib)
    else:
        if checkpoints and accuracy:
            raise PipelineError(data or DEFAULT_DATA, "checkpoints given but no data set with a solution.csv")
        res["accuracy"] = {"skipped": "no data set with a solution (--data DIR)" if accuracy else "--no-accuracy"}
    if detectors and data_dir is not None and (data_dir / cfg["data"]["test_xml"]).exists():
        res["detectors"] = bench_detectors(data_dir, cfg)
    else:
        res["detectors"] = {"skipped": "no data set with a test XML (--data DIR)" if detectors else "--no-detectors"}
    return res


def format_table(res: dict[str, Any]) -> str:
    lines = [f"device {res['device']}{' (' + res['device_name'] + ')' if 'device_name' in res else ''}  "
             f"torch {res['torch']}  threads {res['threads']}",
             "matmul peak: " + ", ".join(f"{k} {v / 1e9:8.1f} GFLOP/s" for k, v in res["matmul_peak_flops"].items())]
    lines.append("")
    lines.append(f"{'training':<16} {'px':>4} {'batch':>5} {'real img/s':>11} {'synth img/s':>11} "
                 f"{'real/synth':>10} {'wait':>6} {'GFLOP/img':>9} {'eff synth':>9} {'eff real':>9}")
    for preset, t in res["train"].items():
        lines.append(f"{preset:<16} {t['input_size']:>4} {t['batch_size']:>5} {t['images_per_s_real']:>11.1f} "
                     f"{t['images_per_s_synthetic']:>11.1f} {t['ratio_real_synthetic']:>10.3f} "
                     f"{100 * t['data_wait_frac_real']:>5.1f}% "
                     f"{t['train_flops_per_image'] / 1e9:>9.3f} {100 * t['compute_efficiency_synthetic']:>8.1f}% "
                     f"{100 * t['compute_efficiency_real']:>8.1f}%")
    lines.append("")
    keys = [k for k in next(iter(res["infer"].values())) if k not in ("batch", "input_size")] if res["infer"] else []
    if keys:
        batch = next(iter(res["infer"].values()))["batch"]
        lines.append(f"inference faces/s (bsN = batch {batch}; flip = flip TTA, 2 forwards)")
        lines.append(f"{'preset':<16} {'px':>4} " + " ".join(f"{k:>16}" for k in keys))
        for preset, r in res["infer"].items():
            lines.append(f"{preset:<16} {r['input_size']:>4} " + " ".join(f"{r[k]:>16.1f}" for k in keys))
    lines.append("")
    acc = res["accuracy"]
    if "skipped" in acc:
        lines.append(f"accuracy: skipped ({acc['skipped']})")
    else:
        lines.append(f"accuracy on {acc['data']} ({acc['n_test']} test faces)")
        lines.append(f"{'method':<40} {'MAE px':>8} {'NME %':>7} {'faces/s':>9} {'faces/s 1 thr':>13}")
        for name, r in acc.items():
            if not isinstance(r, dict):
                continue
            if "skipped" in r:
                lines.append(f"{name:<40} skipped: {r['skipped']}")
                continue
            fps = r.get("faces_per_s", float("nan"))
            fps1 = r.get("faces_per_s_1thread", float("nan"))
            label = name if len(name) <= 40 else "..." + name[-37:]
            lines.append(f"{label:<40} {r['mae']:>8.3f} {100 * r['nme']:>7.2f} {fps:>9.1f} {fps1:>13.1f}")
    lines += [""] + format_batch1(res)
    lines += [""] + format_detectors(res.get("detectors", {"skipped": "not run"}))
    return "\n".join(lines)


def format_batch1(res: dict[str, Any]) -> list[str]:
    b1 = res.get("batch1")
    if not b1:
        return []
    ref = b1.get("dlib", {}).get("plain")
    lines = [f"one face at a time, one core (batch 1, 1 thread; {res.get('batch1_model')}; {b1['faces']} crops of "
             f"{b1['crop_size']} px -> input {b1['input_size']} px; best of {b1['rounds']} alternating rounds): "
             "faces/s" + (", x dlib" if ref else ""),
             f"{'backend':<40} {'plain':>9} {'flip TTA':>9}" + (f" {'plain/dlib':>10} {'flip/dlib':>10}" if ref else "")]
    for name in ("torch-eager", "torch", "onnx", "onnx-int8"):
        r = b1.get(name)
        if r is None:
            continue
        if "skipped" in r:
            lines.append(f"{name:<40} skipped: {r['skipped']}")
            continue
        row = f"{name:<40} {r['plain']:>9.1f} {r['flip']:>9.1f}"
        if ref:
            row += f" {r['plain'] / ref:>10.2f} {r['flip'] / ref:>10.2f}"
        lines.append(row)
    if ref:
        lines.append(f"{'dlib 68-point predictor (same crops)':<40} {ref:>9.1f}")
    elif "dlib" in b1:
        lines.append(f"{'dlib':<40} skipped: {b1['dlib']['skipped']}")
    return lines


def format_detectors(det: dict[str, Any]) -> list[str]:
    if "skipped" in det:
        return [f"face detectors: skipped ({det['skipped']})"]
    lines = [f"face detectors on {det['xml']} (recall at IoU >= 0.5 of the converted boxes; unmatched detections "
             "include real faces the XML does not label)",
             f"{'detector':<44} {'recall':>7} {'unmatched/photo':>15} {'median IoU':>10} {'photos/s 1 thr':>14}"]
    for name, r in det.items():
        if not isinstance(r, dict):
            continue
        if "skipped" in r:
            lines.append(f"{name:<44} skipped: {r['skipped']}")
            continue
        label = f"{name}: {r['detector']}"[:44]
        lines.append(f"{label:<44} {100 * r['recall']:>6.1f}% {r['unmatched_per_photo']:>15.3f} "
                     f"{r['median_iou']:>10.3f} {r['photos_per_s']:>14.1f}")
    return lines


def _csv(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


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
@click.option("--device", default="auto", show_default=True)
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="torch threads for the whole run [torch default]; the 1-thread figures are measured anyway")
@click.option("--min-time", default=1.0, show_default=True, type=float, help="seconds per inference measurement")
@click.option("--matmul-n", default=2048, show_default=True, type=click.IntRange(min=64))
@click.option("--no-dlib", is_flag=True, help="skip dlib even when installed")
@click.option("--no-detectors", is_flag=True, help="skip the face detector table")
@click.option("--out", "out_path", default="bench.json", show_default=True)
@config_options
def bench_cmd(presets, steps, rounds, batch_size, input_size, infer_batch, cache, data, no_accuracy, checkpoints,
              more_checkpoints, device, threads, min_time, matmul_n, no_dlib, no_detectors, out_path, cfg):
    """Training and inference speed, compute efficiency and accuracy in one run."""
    from pipeline.core.io import write_json
    from pipeline.models import list_presets

    names = _csv(presets) or [cfg["model"]["preset"]]
    unknown = [n for n in names if n not in list_presets()]
    if unknown:
        raise PipelineError(None, f"unknown preset(s) {unknown} (known: {', '.join(list_presets())})")
    if input_size is not None and input_size % 32:
        raise PipelineError(None, f"--input-size must be a multiple of 32, got {input_size}")
    if threads is not None:
        torch.set_num_threads(threads)
    res = run_bench(cfg, names, steps, batch_size, input_size, data, [*checkpoints, *more_checkpoints], device,
                    cache, infer_batch, rounds, min_time, matmul_n, not no_dlib, not no_accuracy, not no_detectors)
    write_json(out_path, res)
    click.echo(format_table(res))
    click.echo(f"\nwrote {out_path}")
