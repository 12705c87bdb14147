"""Face morphing: frames between two faces, written as a GIF; the model options it shares
with the other commands that predict."""


import cv2
import numpy as np
import pytest

from pipeline.tools.morph import morph_frames

from helpers import read_gif, run


def test_morph_frames_start_at_a_and_end_at_b():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
    b = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
    pa = rng.uniform(5, 34, (10, 2))
    pb = pa + rng.uniform(-3, 3, (10, 2))
    frames = morph_frames(a, b, pa, pb, 4)
    assert len(frames) == 4 and all(f.shape == a.shape and f.dtype == np.uint8 for f in frames)
    assert np.abs(frames[0].astype(int) - a).max() <= 1
    assert np.abs(frames[-1].astype(int) - b).max() <= 1
    assert not np.array_equal(frames[1], frames[2])


def test_morph_gif_has_the_requested_frames(viz_ws, tmp_path):
    p = tmp_path / "m.gif"
    assert run(["morph", "0", "1", "--checkpoint", viz_ws["ckpt"], "--cache", viz_ws["cache"], "--data-dir",
                viz_ws["data"], "--frames", 5, "--size", 40, "--fps", 20, "--out", p, "--mp4"]) == 0
    w, h, loop, frames = read_gif(p.read_bytes())
    assert (w, h, loop, len(frames)) == (40, 40, 0, 5)
    assert all(d == 5 for d, _ in frames)
    first, last = frames[0][1], frames[-1][1]
    assert first.std() > 8 and len(np.unique(first.reshape(-1, 3), axis=0)) > 10
    assert not np.array_equal(first, last)
    cap = cv2.VideoCapture(str(p.with_suffix(".mp4")))
    if cap.isOpened():
        n = 0
        while cap.read()[0]:
            n += 1
        assert n == 5


def test_morph_rejects_too_few_frames(viz_ws, tmp_path, capsys):
    assert run(["morph", "0", "1", "--checkpoint", viz_ws["ckpt"], "--cache", viz_ws["cache"], "--frames", 1,
                "--out", tmp_path / "m.gif"]) == 2
    assert "--frames" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["predict-image", "predict-video", "video-stats", "morph", "predict", "bench"])
def test_commands_that_predict_share_the_model_options(command):
    """One wording of --checkpoint / --device / --backend (pipeline/inference/options.py):
    the same names, defaults and choices on every command that predicts with models."""
    import importlib

    from pipeline.cli import COMMANDS

    module, attr = COMMANDS[command].split(":")
    params = {p.name: p for p in getattr(importlib.import_module(module), attr).params}
    if command not in ("predict", "bench"):
        assert params["checkpoints"].opts == ["--checkpoint"]
        assert params["checkpoints"].multiple and params["checkpoints"].required
    if command != "predict":
        assert params["device"].opts == ["--device"] and params["device"].default == "auto"
    if command != "bench":
        assert list(params["backend"].type.choices) == ["torch", "onnx"] and params["backend"].default == "torch"
