"""An exponential moving average of a network's weights (Polyak averaging, as timm's
ModelEmaV3): after every optimizer step each floating-point tensor of the state dict,
BatchNorm running statistics included, moves towards the trained one,
ema = d * ema + (1 - d) * w, and integer buffers (BatchNorm's step counter) are copied.

The decay warms up as min(decay, (1 + n) / (10 + n)) after n updates, so the average of a
short run is not dominated by its random initial weights. Its state (the averaged tensors
and n) goes into the checkpoint, so a resumed run continues the same average."""

from __future__ import annotations

import copy

import torch
from torch import nn


class ModelEma:
    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.source, self.decay, self.updates = model, float(decay), 0
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self._pairs = self._tensor_pairs()

    def _tensor_pairs(self):
        src, dst = self.source.state_dict(), self.module.state_dict()
        floats = [(dst[k], src[k]) for k in dst if dst[k].is_floating_point()]
        others = [(dst[k], src[k]) for k in dst if not dst[k].is_floating_point()]
        return floats, others

    def current_decay(self) -> float:
        return min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """Move the average one step towards the source model's current weights."""
        floats, others = self._pairs
        weight = 1.0 - self.current_decay()
        for e, w in floats:
            e.lerp_(w, weight)
        for e, w in others:
            e.copy_(w)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.updates = int(state["updates"])
