"""The training data path: uint8 faces stay in RAM (memory-mapped cache), samples are
augmented as uint8, batches are collated as uint8 tensors, and only on the training
device are they converted to float and normalised. On CUDA batches come from pinned
memory, copied on a side stream; a background thread (`DeviceLoader`) assembles the next
batches while the current one trains."""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from pipeline.keypoints.preprocess import faces_to_chw, normalize_batch


class FaceDataset(Dataset):
    """Faces `indices` of a cache, each passed through `transform(image, keypoints)`.

    The cache array is memory-mapped; each item reads one face (no per-epoch disk
    reads once the pages are in RAM) and stays uint8 end to end.

    With a `seed`, item i of epoch e (`set_epoch`) is transformed with
    `generator=sample_generator(i)`, a generator of its own seeded by (seed, e, i): its
    augmentation is the same in the main process and in any DataLoader worker, whatever
    the number of workers and the order they take the items in."""

    def __init__(self, faces: np.ndarray, keypoints: np.ndarray | None, indices: np.ndarray,
                 transform, in_chans: int = 3, seed: int | None = None):
        self.faces = faces  # (N, S, S, 3) uint8, memory-mapped
        self.keypoints = keypoints  # (N, K, 2) float32 crop px, or None (test set)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.transform = transform
        self.in_chans = in_chans
        self.seed, self.epoch = seed, 0

    def __len__(self) -> int:
        return len(self.indices)

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose draws the items make (before a loader's workers copy the dataset)."""
        self.epoch = epoch

    def sample_generator(self, i: int) -> torch.Generator | None:
        """Item i's own generator for this epoch, or None without a seed (the transform then
        draws from torch's global RNG)."""
        if self.seed is None:
            return None
        # SeedSequence mixes the three numbers into well-spread state: neighbouring items
        # and epochs get unrelated streams
        state = np.random.SeedSequence([self.seed, self.epoch, i]).generate_state(1, np.uint64)[0]
        return torch.Generator().manual_seed(int(state))

    def __getitem__(self, i: int):
        idx = int(self.indices[i])
        image = faces_to_chw(self.faces[idx:idx + 1], self.in_chans)[0]  # (C, S, S) uint8
        if self.keypoints is None:
            kp = torch.zeros(0, 2)
        else:
            kp = torch.from_numpy(np.asarray(self.keypoints[idx], dtype=np.float32))
        generator = self.sample_generator(i)
        image, kp = self.transform(image, kp) if generator is None else self.transform(image, kp, generator=generator)
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
    # training's augmentations draw from each sample's own generator (FaceDataset's seed);
    # anything drawing from the global RNGs in a worker gets torch's per-worker seed, numpy
    # the same one
    np.random.seed(torch.initial_seed() % 2**32)
    # one thread per worker for OpenCV's warpAffine too (DataLoader does this for torch
    # only): N workers each starting a pool of one thread per core oversubscribe the CPUs
    cv2.setNumThreads(0)


def make_loader(dataset: Dataset, batch_size: int, sampler: Sampler | None, device: torch.device,
                num_workers: int = 0, drop_last: bool = False, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    # no persistent_workers: the trainer builds a fresh loader per epoch (seeded by the
    # epoch, for exact resume), so persistent workers would only outlive their loader
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=device.type == "cuda", drop_last=drop_last,
                      worker_init_fn=seed_worker, generator=g)


class DeviceLoader:
    """Wraps a DataLoader: a background thread assembles the next `depth` batches (the
    DataLoader's work: sampling, augmenting, collating; on CUDA also pinning and the
    host -> device copy on a side stream, and the normalisation there) while the current
    one trains. Batches come out in the DataLoader's order, unchanged.

    `wait_s` is the time the consumer spent blocked waiting for a batch during the last
    iteration, so the trainer can log the data-wait fraction. An exception raised while
    producing a batch is re-raised in the consumer at that batch. The thread stops when the
    iteration ends, fails or is closed: iterate through `closing(iter(loader))` or call
    `close()` on the iterator when leaving a loop early (a generator left unclosed is only
    closed when garbage collected)."""

    def __init__(self, loader, device: torch.device, channels_last: bool = False, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.loader, self.device, self.channels_last, self.depth = loader, device, channels_last, depth
        self.wait_s = 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        self.wait_s = 0.0
        stage = (_CudaStage if self.device.type == "cuda" else _HostStage)(self.device, self.channels_last)
        producer = _Producer(iter(self.loader), stage, self.depth)
        try:
            while True:
                t0 = time.perf_counter()
                item = producer.get()
                if item is _END:
                    return
                batch = stage.ready(item)
                self.wait_s += time.perf_counter() - t0
                yield batch
        finally:
            producer.stop()


_END = object()  # the producer's last item: the DataLoader is exhausted


class _Failure:
    """An exception raised by the producer thread, carried to the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


class _Producer:
    """A daemon thread that puts stage(batch) for each batch of `batches` into a queue of
    `depth` slots, then _END (or a _Failure). stop() makes it finish and joins it."""

    def __init__(self, batches, stage, depth: int):
        self.batches, self.stage = batches, stage
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="DeviceLoader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # one intra-op thread for this thread's torch ops: the training step's threads
        # already fill the cores, and a second OpenMP team for the small per-sample ops
        # oversubscribes them (measured on 2 cores: training at half speed). Under OpenMP
        # the main thread keeps its own count, but threads started after this one inherit
        # 1 (none are started during training: DataLoader workers are processes)
        torch.set_num_threads(1)
        try:
            device = getattr(self.stage, "device", None)
            if device is not None and device.type == "cuda":
                # a new thread's current CUDA device is 0: pinning (num_workers 0) and any
                # allocation here would otherwise touch GPU 0 from every DDP rank
                torch.cuda.set_device(device)  # indexed: resolve_device and DDP give cuda:N
            for batch in self.batches:
                self.queue.put(self.stage(batch))
                if self.stopping.is_set():  # the consumer left early: produce no more
                    return
            self.queue.put(_END)
        except BaseException as error:  # noqa: BLE001 -- handed to the consumer, which re-raises it
            if not self.stopping.is_set():
                self.queue.put(_Failure(error))

    def get(self):
        item = self.queue.get()
        if isinstance(item, _Failure):
            raise item.error
        return item

    def stop(self) -> None:
        """Ask the thread to finish and wait for it. Emptying the queue unblocks a put in
        progress; after that put the thread sees `stopping` and returns, so at most the
        batch it is assembling is finished first."""
        self.stopping.set()
        while self.thread.is_alive():
            try:
                while True:
                    self.queue.get_nowait()
            except queue.Empty:
                pass
            self.thread.join(timeout=0.01)
        self.batches = None  # the DataLoader iterator: its worker processes end with it


class _HostStage:
    """The CPU leg of a batch: normalised in the producer thread, ready as it comes."""

    def __init__(self, device: torch.device, channels_last: bool):
        self.device, self.channels_last = device, channels_last

    def __call__(self, batch):  # in the producer thread
        images, kp, idx = batch  # (B, C, H, W) uint8, (B, K, 2) float32, (B,) int64
        return normalize_batch(images.to(self.device), self.channels_last), kp.to(self.device), idx

    def ready(self, item):  # in the consumer thread
        return item


class _CudaStage:
    """The CUDA leg of a batch: pinned host tensors are copied on a side stream (so the
    copy overlaps the current step's kernels) and normalised there; the consumer makes
    its stream wait for that work before using the batch."""

    def __init__(self, device: torch.device, channels_last: bool):
        self.device, self.channels_last = device, channels_last
        self.stream = torch.cuda.Stream(device)

    def __call__(self, batch):  # in the producer thread
        images, kp, idx = batch
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            images = normalize_batch(images.to(self.device, non_blocking=True), self.channels_last)
            kp = kp.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return images, kp, idx, done

    def ready(self, item):  # in the consumer thread
        images, kp, idx, done = item
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(done)
        # the tensors were allocated on the side stream: tell the caching allocator they
        # are in use on the compute stream, or their memory could be reused too early
        images.record_stream(compute)
        kp.record_stream(compute)
        return images, kp, idx
