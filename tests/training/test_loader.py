"""DeviceLoader: the background producer keeps the DataLoader's order and content, hands
its exceptions to the consumer, stops when the loop is left, and counts only the time the
consumer blocks (`wait_s`); train_one_epoch reads the losses in groups and still stops
at the first non-finite one."""

from __future__ import annotations

import threading
from contextlib import closing

import pytest
import torch
from torch.utils.data import Dataset

from pipeline.training import loader as data
from pipeline.training.loader import DeviceLoader, EpochSampler, make_loader, normalize_batch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Faces(Dataset):
    """n random uint8 (3, 8, 8) images; each item also draws from torch's global RNG, as
    TrainAugment does, so the test sees whether the draws keep their order."""

    def __init__(self, n: int = 20, fail_at: int | None = None):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g)
        self.fail_at, self.calls = fail_at, []
        self.requested: dict[int, threading.Event] = {}  # set when that item is asked for

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        self.calls.append(i)
        if i in self.requested:
            self.requested[i].set()
        if i == self.fail_at:
            raise ValueError(f"item {i} is broken")
        return self.images[i], torch.rand(2, 2), i


def _loader(ds, device="cpu", depth=2, batch_size=3) -> DeviceLoader:
    return DeviceLoader(make_loader(ds, batch_size, EpochSampler(len(ds), seed=5), torch.device(device)),
                        torch.device(device), depth=depth)


def _producers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "DeviceLoader" and t.is_alive()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("depth", [1, 2, 5])
def test_batches_match_a_plain_loop_in_order_and_content(device, depth):
    ds = Faces(20)
    torch.manual_seed(7)
    plain = list(make_loader(ds, 3, EpochSampler(len(ds), seed=5), torch.device("cpu")))
    torch.manual_seed(7)
    got = list(_loader(ds, device, depth))
    assert len(got) == len(plain) == 7
    for (images, kp, idx), (p_images, p_kp, p_idx) in zip(got, plain):
        assert images.device.type == device and images.dtype == torch.float32
        assert torch.equal(idx, p_idx)
        assert torch.equal(images.cpu(), normalize_batch(p_images))
        assert torch.equal(kp.cpu(), p_kp)  # the augmentation draws, in the same order
    assert not _producers_alive()


def test_the_next_batches_are_assembled_while_the_consumer_holds_one():
    ds = Faces(30)
    order = list(EpochSampler(len(ds), seed=5))
    ds.requested = {order[6]: threading.Event()}  # the first item of the third batch
    with closing(iter(_loader(ds, depth=2))) as batches:
        next(batches)
        # batches 1 and 2 are assembled without the consumer asking (a plain loop would
        # wait here forever: the timeout only turns that into a failure)
        assert ds.requested[order[6]].wait(timeout=60)
    assert not _producers_alive()


def test_producer_exception_is_raised_in_the_consumer_after_the_good_batches():
    ds = Faces(20, fail_at=None)
    order = list(EpochSampler(len(ds), seed=5))
    ds.fail_at = order[7]  # in the third batch of 3
    seen = []
    with pytest.raises(ValueError, match=f"item {order[7]} is broken"):
        for _, _, idx in _loader(ds):
            seen.append(idx.tolist())
    assert seen == [order[0:3], order[3:6]]
    assert not _producers_alive()


def test_leaving_the_loop_early_stops_the_producer():
    ds = Faces(60)
    loader = _loader(ds, depth=2)
    with closing(iter(loader)) as batches:
        next(batches)
    assert not _producers_alive()
    # bounded read-ahead: the consumed batch, `depth` queued, one more being assembled
    assert len(ds.calls) <= 3 * (1 + 2 + 1) < len(ds)


def test_an_error_in_the_training_loop_stops_the_producer():
    from pipeline.training.loop import NonFiniteLoss, StepState, train_one_epoch

    ds = Faces(60)
    model, loss_fn = _Tiny(), _LossNaNAt(step=4)
    with pytest.raises(NonFiniteLoss, match="loss became nan at step 4"):
        train_one_epoch(model, _loader(ds), loss_fn, torch.optim.SGD(model.parameters(), lr=0.1), None,
                        StepState(0, 100, 0, 0.1), torch.device("cpu"), None, progress=False, read_every=10)
    assert not _producers_alive()
    assert len(ds.calls) < len(ds)  # stopped at the first read (step 10), not at the epoch's end


def test_on_the_cpu_no_optimizer_step_runs_on_a_non_finite_loss():
    """The default read interval off CUDA is every step, before backward: the weights
    stay those of the last finite step, as with a per-step check."""
    from pipeline.training.loop import NonFiniteLoss, StepState, train_one_epoch

    model = _Tiny()
    state = StepState(0, 100, 0, 0.1)
    snapshot = {}

    class Watch(_LossNaNAt):
        def __call__(self, pred, target, probs, input_hw):
            if state.step == 4:  # the weights after 4 good steps
                snapshot.update({k: v.clone() for k, v in model.state_dict().items()})
            return super().__call__(pred, target, probs, input_hw)

    with pytest.raises(NonFiniteLoss, match="at step 4"):
        train_one_epoch(model, _loader(Faces(20)), Watch(step=4), torch.optim.SGD(model.parameters(), lr=0.1),
                        None, state, torch.device("cpu"), None, progress=False)
    assert state.step == 4
    assert all(torch.equal(v, snapshot[k]) for k, v in model.state_dict().items())


def test_non_finite_loss_is_found_at_the_epoch_end_read():
    from pipeline.training.loop import NonFiniteLoss, StepState, train_one_epoch

    model = _Tiny()
    with pytest.raises(NonFiniteLoss, match="at step 12"):  # the 3rd of 5 steps, 10 taken before
        train_one_epoch(model, _loader(Faces(15)), _LossNaNAt(step=2), torch.optim.SGD(model.parameters(), lr=0.1),
                        None, StepState(10, 100, 0, 0.1), torch.device("cpu"), None, progress=False,
                        read_every=100)


def test_epoch_loss_does_not_depend_on_how_often_it_is_read():
    from pipeline.training.loop import StepState, train_one_epoch

    results = []
    for every in (1, 4, 100):
        torch.manual_seed(0)
        model = _Tiny()
        torch.manual_seed(1)
        results.append(train_one_epoch(model, _loader(Faces(20)), _LossNaNAt(step=None),
                                       torch.optim.SGD(model.parameters(), lr=0.1), None, StepState(0, 100, 0, 0.1),
                                       torch.device("cpu"), None, progress=False, read_every=every)["loss"])
    assert results[0] == results[1] == results[2]


class _FakeClock:
    """Stands in for time.perf_counter in pipeline.training.loader. The consumer reads it twice per
    batch (before and after getting it); `waiting[k]` is set when the consumer has read it
    before batch k, i.e. when it has started waiting for batch k."""

    def __init__(self, batches: int):
        self.now, self.reads = 0.0, 0
        self.waiting = [threading.Event() for _ in range(batches + 1)]

    def perf_counter(self) -> float:
        if self.reads % 2 == 0:
            self.waiting[self.reads // 2].set()
        self.reads += 1
        return self.now


class _SlowFaces(Faces):
    """Batch size 1; item `i` in `cost` takes cost[i] fake seconds, spent only once the
    consumer waits for it (a batch the consumer does not wait for must count nothing)."""

    def __init__(self, clock: _FakeClock, cost: dict[int, float]):
        super().__init__(6)
        self.clock, self.cost = clock, cost

    def __getitem__(self, i: int):
        if i in self.cost:
            assert self.clock.waiting[self.position[i]].wait(timeout=60), "consumer never waited"
            self.clock.now += self.cost[i]
        return super().__getitem__(i)


def test_wait_s_counts_the_time_the_consumer_is_blocked(monkeypatch):
    clock = _FakeClock(batches=6)
    monkeypatch.setattr(data, "time", clock)
    ds = _SlowFaces(clock, {})
    order = list(EpochSampler(len(ds), seed=5))
    ds.position = {i: k for k, i in enumerate(order)}
    ds.cost = {order[2]: 1.0, order[4]: 10.0}  # batches 2 and 4 are slow
    loader = _loader(ds, depth=2, batch_size=1)
    assert [int(idx) for _, _, idx in loader] == order
    assert loader.wait_s == 11.0
    assert not _producers_alive()


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3 * 8 * 8, 4)

    def forward(self, images):
        return self.fc(images.flatten(1)).view(-1, 2, 2)


class _LossNaNAt:
    """L1 loss, NaN at its `step`-th call (0-based; None: never)."""

    needs_maps = False

    def __init__(self, step: int | None):
        self.step, self.calls = step, 0

    def __call__(self, pred, target, probs, input_hw):
        loss = (pred - target).abs().mean()
        if self.calls == self.step:
            loss = loss * float("nan")
        self.calls += 1
        return loss, {}


def test_an_epochs_batches_are_the_same_at_any_worker_count(tiny_workspace):
    """Issue 48, finding 3: every sample's augmentation is drawn from its own generator,
    seeded by (train.seed, epoch, sample), never from a worker's reseeded global RNG, so
    train.num_workers changes where the batches are made, not what they hold: a resumed run
    or another machine with another worker count trains the same model."""
    from pipeline.core.config import load_config
    from pipeline.training.setup import build_training, load_fold, make_epoch_loader

    ws = tiny_workspace
    cache, train_idx, _ = load_fold(ws / "cache", ws / "folds.csv", 0)

    def batches(workers: int, epoch: int = 1):
        cfg = load_config(None, ["crop.side=32", "model.input_size=32", "train.batch_size=8", "folds.k=2",
                                 "folds.train=[0,1]", "train.rotate=10", "train.erase=0.5", "train.randaug_n=2",
                                 f"train.num_workers={workers}", "train.device=cpu"])
        setup = build_training(cfg, cache, train_idx, torch.device("cpu"))
        return [(images.clone(), kp.clone(), idx.clone()) for images, kp, idx in make_epoch_loader(setup, epoch)]

    plain, two = batches(0), batches(2)
    assert len(plain) == len(two) > 1
    for (images, kp, idx), (w_images, w_kp, w_idx) in zip(plain, two):
        assert torch.equal(idx, w_idx) and torch.equal(images, w_images) and torch.equal(kp, w_kp)
    # control: the draws do move on with the epoch
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(plain, batches(0, epoch=2)))
