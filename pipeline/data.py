"""The training data path: uint8 faces stay in RAM (memory-mapped cache), samples are
augmented as uint8, batches are collated as uint8 tensors, and only on the training
device are they converted to float and normalised. On CUDA batches come from pinned
memory with non_blocking copies, and the next batch is already in flight while the
current one trains."""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from pipeline.preprocess import faces_to_chw, normalize_batch


class FaceDataset(Dataset):
    """Faces `indices` of a cache, each passed through `transform(image, keypoints)`.

    The cache array is memory-mapped; each item reads one face (no per-epoch disk
    reads once the pages are in RAM) and stays uint8 end to end."""

    def __init__(self, faces: np.ndarray, keypoints: np.ndarray | None, indices: np.ndarray,
                 transform, in_chans: int = 3):
        self.faces = faces  # (N, S, S, 3) uint8, memory-mapped
        self.keypoints = keypoints  # (N, K, 2) float32 crop px, or None (test set)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.transform = transform
        self.in_chans = in_chans

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        idx = int(self.indices[i])
        image = faces_to_chw(self.faces[idx:idx + 1], self.in_chans)[0]  # (C, S, S) uint8
        if self.keypoints is None:
            kp = torch.zeros(0, 2)
        else:
            kp = torch.from_numpy(np.asarray(self.keypoints[idx], dtype=np.float32))
        image, kp = self.transform(image, kp)
        return image, kp, idx


class EpochSampler(Sampler[int]):
    """Shuffles with a generator seeded by (seed, epoch), so a resumed run sees exactly the
    batches the uninterrupted run would have seen. Under DDP each of `world` ranks takes
    every world-th index of the same permutation (padded so all ranks take equal steps)."""

    def __init__(self, n: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1):
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0
        self.rank, self.world = rank, world

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        if self.world > 1:
            order += order[: len(self) * self.world - self.n]
            order = order[self.rank::self.world]
        return iter(order)

    def __len__(self) -> int:
        return -(-self.n // self.world)


def seed_worker(worker_id: int) -> None:
    # augmentations draw from torch's global RNG; DataLoader seeds each worker from the
    # base seed, numpy is seeded from it too so nothing else drifts
    np.random.seed(torch.initial_seed() % 2**32)


def make_loader(dataset: Dataset, batch_size: int, sampler: Sampler | None, device: torch.device,
                num_workers: int = 0, drop_last: bool = False, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    # no persistent_workers: the trainer builds a fresh loader per epoch (seeded by the
    # epoch, for exact resume), so persistent workers would only outlive their loader
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=device.type == "cuda", drop_last=drop_last,
                      worker_init_fn=seed_worker, generator=g)


class DeviceLoader:
    """Wraps a DataLoader: moves (uint8 images, keypoints) to `device` with non_blocking
    copies, one batch ahead, and normalises there. Records the seconds spent waiting for
    data (`wait_s`) so the trainer can log the data-wait fraction."""

    def __init__(self, loader: DataLoader, device: torch.device, channels_last: bool = False):
        self.loader, self.device, self.channels_last = loader, device, channels_last
        self.wait_s = 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def _to_device(self, batch):
        images, kp, idx = batch
        nb = self.device.type == "cuda"
        images = images.to(self.device, non_blocking=nb)
        kp = kp.to(self.device, non_blocking=nb)
        return normalize_batch(images, self.channels_last), kp, idx

    def __iter__(self):
        self.wait_s = 0.0
        it = iter(self.loader)
        while True:
            t0 = time.perf_counter()
            batch = next(it, None)
            if batch is None:
                return
            batch = self._to_device(batch)
            self.wait_s += time.perf_counter() - t0
            # with workers, the loader already assembles the following batches in the
            # background while this one trains; on CUDA the copy is asynchronous
            yield batch
