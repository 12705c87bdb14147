"""Atomic writers: the same object gives the same bytes whatever the temp file is called."""

import torch

from pipeline.core.io import torch_save


def test_two_saves_of_one_checkpoint_are_byte_identical(tmp_path):
    obj = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "history": [{"val_mae": 1.5}]}
    torch_save(tmp_path / "a" / "last.pt", obj)
    torch_save(tmp_path / "b" / "best.pt", obj)
    assert (tmp_path / "a" / "last.pt").read_bytes() == (tmp_path / "b" / "best.pt").read_bytes()
    assert torch.load(tmp_path / "a" / "last.pt", weights_only=True)["epoch"] == 3
