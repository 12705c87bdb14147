"""Atomic writers: the same object gives the same bytes whatever the temp file is called;
an output folder replaces only an earlier output."""

import pytest
import torch

from pipeline.core.errors import PipelineError
from pipeline.core.io import check_replaceable, staging_dir, torch_save


def test_two_saves_of_one_checkpoint_are_byte_identical(tmp_path):
    obj = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "history": [{"val_mae": 1.5}]}
    torch_save(tmp_path / "a" / "last.pt", obj)
    torch_save(tmp_path / "b" / "best.pt", obj)
    assert (tmp_path / "a" / "last.pt").read_bytes() == (tmp_path / "b" / "best.pt").read_bytes()
    assert torch.load(tmp_path / "a" / "last.pt", weights_only=True)["epoch"] == 3


def test_check_replaceable_refuses_only_a_foreign_file_or_folder(tmp_path):
    def ours(d):
        return (d / "mark").exists()

    check_replaceable(tmp_path / "none", ours, "ours")  # absent
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", ours, "ours")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "mark").write_text("")
    check_replaceable(tmp_path / "old", ours, "ours")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("keep")
    (tmp_path / "file").write_text("keep")
    for name in ("theirs", "file"):
        with pytest.raises(PipelineError) as e:
            check_replaceable(tmp_path / name, ours, "ours (no mark)")
        assert str(e.value) == f"{tmp_path / name}: exists and is not ours (no mark); refusing to replace it"


def test_staging_dir_replaces_its_own_output_and_keeps_a_foreign_folder(tmp_path):
    dest = tmp_path / "out"
    for _ in range(2):  # the second run replaces the first one's output
        with staging_dir(dest, "mark") as tmp:
            (tmp / "mark").write_text("")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("keep")
    with pytest.raises(PipelineError, match="exists and is not an output of this stage \\(no mark\\); refusing"):
        with staging_dir(tmp_path / "theirs", "mark"):
            pass
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "keep"
    with staging_dir(tmp_path / "theirs", "mark", is_ours=lambda d: (d / "notes.txt").exists()) as tmp:
        (tmp / "mark").write_text("")
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["mark"]
