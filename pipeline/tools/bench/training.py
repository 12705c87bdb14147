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


def bench_train(cfg: dict, preset: str, cache_dir: Path, steps: int, batch_size: int, input_size: int,
                device: torch.device, rounds: int = 2, warmup: int = 2, options: dict | None = None) -> dict[str, float]:
    """images/s of training steps through the real data path and on a synthetic batch, both
    on the setup `pipeline train` builds (`train.build_training`, `train.train_steps`) for
    this preset, input size and batch, on every face of the cache."""
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
        sync(device)
        t0 = time.perf_counter()
        train_steps(setup, take, progress=False)
        sync(device)
        elapsed = time.perf_counter() - t0
        return take.images / elapsed, take.wait_s / elapsed, elapsed

    # the first steps carry the one-off costs (train.compile's compilation, oneDNN's
    # primitive creation): warmup_s is their time beyond `warmup` steps at the best pace
    first = run(synth_feed, warmup)[2]
    run(real_feed, warmup)
    real, syn = [], []
    for _ in range(rounds):  # alternate, so both see the same background load
        real.append(run(real_feed, steps))
        syn.append(run(synth_feed, steps))
    best_real, wait_frac, _ = max(real)
    best_syn = max(syn)[0]
    flops = 3.0 * model_flops(setup.model, input_size, in_chans)
    return {"images_per_s_real": best_real, "images_per_s_synthetic": best_syn,
            "data_overhead": 1.0 - best_real / best_syn, "ratio_real_synthetic": best_real / best_syn,
            "data_wait_frac_real": wait_frac, "train_flops_per_image": flops, "batch_size": bs,
            "input_size": input_size, "steps": steps, "num_workers": cfg["train"]["num_workers"],
            "warmup_s": max(0.0, first - warmup * bs / best_syn)}
