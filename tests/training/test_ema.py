"""The weights' moving average: its arithmetic (warm-up of the decay, BatchNorm buffers
averaged, the step counter copied) and its state round trip."""

import pytest
import torch
from torch import nn

from pipeline.training.ema import ModelEma


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())


def test_ema_follows_the_weights_with_the_warmed_up_decay():
    net = _net()
    ema = ModelEma(net, 0.9)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    assert all(torch.equal(v, ema.module.state_dict()[k]) for k, v in start.items())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 3, 8, 8)
    net(x).square().mean().backward()  # train mode: the BN running stats move too
    opt.step()
    ema.update()
    d = min(0.9, 1 / 10)  # first update: (1 + 0) / (10 + 0)
    for k, w in net.state_dict().items():
        got = ema.module.state_dict()[k]
        if w.is_floating_point():
            torch.testing.assert_close(got, d * start[k] + (1 - d) * w, rtol=0, atol=1e-6)
        else:  # num_batches_tracked
            assert torch.equal(got, w) and int(got) == 1
    assert not torch.equal(net.state_dict()["1.running_mean"], start["1.running_mean"])
    for _ in range(200):
        ema.update()
    assert ema.current_decay() == 0.9  # warmed up: (1 + n) / (10 + n) > 0.9 from n = 81
    for k, w in net.state_dict().items():  # the weights stood still: the average reached them
        torch.testing.assert_close(ema.module.state_dict()[k], w, rtol=0, atol=1e-6)
    assert all(not p.requires_grad for p in ema.module.parameters()) and not ema.module.training


def test_ema_state_round_trip_continues_the_same_average():
    a, b = _net(), _net()
    ema_a, ema_b = ModelEma(a, 0.99), ModelEma(b, 0.99)
    with torch.no_grad():
        for p in a.parameters():
            p.add_(1.0)
    ema_a.update()
    ema_b.load_state_dict(ema_a.state_dict())
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        ema_a.update()
        ema_b.update()
    assert ema_b.updates == ema_a.updates == 4
    for k, v in ema_a.module.state_dict().items():
        assert torch.equal(v, ema_b.module.state_dict()[k]), k


def test_decay_out_of_range_is_refused():
    with pytest.raises(ValueError):
        ModelEma(_net(), 1.0)
