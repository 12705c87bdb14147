"""Training throughput: images/s of `pipeline train`'s own steps (`build_training`,
`train_steps`) through the real data path (`make_epoch_loader`: cache -> FaceDataset with
TrainAugment -> DataLoader -> DeviceLoader's producer thread) and on a synthetic on-device batch,
in alternating rounds."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.core.heap import keep_freed_memory
from pipeline.core.params_schema import Config
from pipeline.formats.cache import load_cache
from pipeline.keypoints.preprocess import normalize_batch
from pipeline.models import model_flops
from pipeline.stages.crop import run_crop
from pipeline.synth.layout import generate_demo
from pipeline.tools.bench.timing import sync
from pipeline.training.loop import StepState, train_steps
from pipeline.training.setup import build_training, make_epoch_loader


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
    demo = generate_demo(workdir / "demo", n_train=n_train, n_test=n_test, seed=0)
    cfg = load_config(None, [f"data.dir={demo}", f"crop.side={size}", "crop.n_jobs=1"])
    run_crop(cfg, workdir / "cache")
    return workdir / "cache"


def bench_train(cfg: Config, preset: str, cache_dir: Path, steps: int, batch_size: int, input_size: int,
                device: torch.device, rounds: int = 2, warmup: int = 2, options: dict | None = None) -> dict[str, float]:
    """images/s of training steps through the real data path and on a synthetic batch, both
    on the setup `pipeline train` builds (training/setup.py `build_training`, training/loop.py `train_steps`) for
    this preset, input size and batch, on every face of the cache."""
    return bench_train_variants([cfg], preset, cache_dir, steps, batch_size, input_size, device, rounds, warmup,
                                options)[0]


class _Variant:
    """One config's training setup and its two feeds, timed round after round."""

    def __init__(self, cfg: Config, cache, bs: int, input_size: int, device: torch.device):
        self.cfg, self.device = cfg, device
        self.setup = build_training(cfg, cache, np.arange(len(cache)), device)
        # constant, low lr: the schedule does not change the cost of a step, and random
        # synthetic targets must not make the loss diverge
        self.setup.state = StepState(0, 10 ** 9, 0, cfg.train.lr * 0.1)
        in_chans, k = cfg.model.in_chans, cache.schema.k
        g = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (bs, in_chans, input_size, input_size), dtype=torch.uint8, generator=g)
        target = torch.rand(bs, k, 2, generator=g) * (input_size - 1)
        synth = (normalize_batch(images.to(device), self.setup.channels_last), target.to(device), torch.arange(bs))
        self.real_feed, self.synth_feed = _TrainEpochs(self.setup), _Repeat(synth)
        self.first_s = 0.0  # seconds of the warm-up steps
        self.real: list[tuple[float, float, float]] = []
        self.synth: list[tuple[float, float, float]] = []

    def run(self, feed, n: int) -> tuple[float, float, float]:
        """(images/s, share of the time waiting for data, seconds) of n steps."""
        take = _Steps(feed, n)
        # the heap policy is process-wide: each variant runs under its own
        keep_freed_memory(self.setup.runtime.keep_freed_memory)
        sync(self.device)
        t0 = time.perf_counter()
        train_steps(self.setup, take, progress=False)
        sync(self.device)
        elapsed = time.perf_counter() - t0
        return take.images / elapsed, take.wait_s / elapsed, elapsed


def _labelled_cache(cache_dir: Path):
    cache = load_cache(Path(cache_dir) / "train")
    if cache.keypoints is None:
        raise PipelineError(Path(cache_dir) / "train", "bench needs a labelled training cache")
    return cache


def _bench_config(cfg: Config, preset: str, input_size: int, bs: int, options: dict | None,
                  base_options: dict) -> Config:
    """`cfg` with the timed preset, input size and batch; a variant's own model.options (those
    that differ from `base_options`, e.g. decoder_levels=4) apply on top of the preset's."""
    own = {k: v for k, v in cfg.model.options.items() if base_options.get(k) != v}
    model = cfg.model.model_copy(update={"preset": preset, "input_size": input_size,
                                         "options": {**(options or {}), **own}})
    return cfg.model_copy(update={"model": model, "train": cfg.train.model_copy(update={"batch_size": bs})})


def bench_train_variants(cfgs: list[Config], preset: str, cache_dir: Path, steps: int, batch_size: int,
                         input_size: int, device: torch.device, rounds: int = 2, warmup: int = 2,
                         options: dict | None = None) -> list[dict[str, float]]:
    """`bench_train` of several configs (e.g. train.channels_last on and off), timed in
    interleaved rounds -- each round runs every config's real and synthetic steps in turn --
    so their ratios see the same background load. One result per config."""
    cache = _labelled_cache(cache_dir)
    bs = min(batch_size, len(cache))
    variants = []
    base_options = cfgs[0].model.options
    for cfg in cfgs:
        cfg = _bench_config(cfg, preset, input_size, bs, options, base_options)
        v = _Variant(cfg, cache, bs, input_size, device)
        # the first steps carry the one-off costs (train.compile's compilation, oneDNN's
        # primitive creation): warmup_s is their time beyond `warmup` steps at the best pace
        v.first_s = v.run(v.synth_feed, warmup)[2]
        v.run(v.real_feed, warmup)
        variants.append(v)
    for _ in range(rounds):
        for v in variants:
            v.real.append(v.run(v.real_feed, steps))
            v.synth.append(v.run(v.synth_feed, steps))
    out = []
    for v in variants:
        best_real, wait_frac, _ = max(v.real)
        best_syn = max(v.synth)[0]
        in_chans = v.cfg.model.in_chans
        flops = 3.0 * model_flops(v.setup.model, input_size, in_chans)
        out.append({"images_per_s_real": best_real, "images_per_s_synthetic": best_syn,
                    "data_overhead": 1.0 - best_real / best_syn, "ratio_real_synthetic": best_real / best_syn,
                    "data_wait_frac_real": wait_frac, "train_flops_per_image": flops, "batch_size": bs,
                    "input_size": input_size, "steps": steps, "num_workers": v.cfg.train.num_workers,
                    "warmup_s": max(0.0, v.first_s - warmup * bs / best_syn)})
    return out
