"""Helpers the tests share (the fixtures are in conftest.py): `from helpers import ...`."""

import io
import subprocess
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image

from pipeline.core.params_schema import SECTIONS, is_speed_only, section_fields

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the command line

def run(argv) -> int:
    """`pipeline` main(argv) in-process -> its exit code (0 when it returns)."""
    from pipeline.cli import main

    try:
        main([str(a) for a in argv])
    except SystemExit as e:
        return e.code
    return 0


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """`run` plus what it printed: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = run(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------ params

def speed_only_keys() -> set[str]:
    """The params marked speed_only (pipeline/core/params_schema.py), as 'section.key'."""
    return {f"{s}.{k}" for s in SECTIONS for k, f in section_fields(s).items() if is_speed_only(f)}


# ------------------------------------------------------------------ pictures (tests/tools, tests/formats)

def check_picture(path, shape=None, min_std=8.0, min_colors=20):
    """The picture at `path` decodes (BGR), has `shape` (H, W) if given and is not blank:
    some contrast and at least `min_colors` colours."""
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert img is not None, f"{path} does not decode"
    if shape is not None:
        assert img.shape[:2] == tuple(shape)
    assert img.std() > min_std
    assert len(np.unique(img.reshape(-1, 3), axis=0)) >= min_colors
    return img


def read_gif(data: bytes):
    """An animated GIF read with Pillow: (width, height, loop, [(delay in 1/100 s, RGB (H, W, 3))])."""
    im = Image.open(io.BytesIO(data))
    assert im.format == "GIF" and data[:6] == b"GIF89a"
    frames = []
    for i in range(im.n_frames):
        im.seek(i)
        frames.append((round(im.info["duration"] / 10), np.asarray(im.convert("RGB"))))
    return im.size[0], im.size[1], im.info.get("loop"), frames


# ------------------------------------------------------------------ models

class Fixed(torch.nn.Module):
    """A stand-in model: the same coordinates (K, 2), in input pixels, for any input."""

    def __init__(self, coords):
        super().__init__()
        self.coords = torch.as_tensor(coords, dtype=torch.float32)

    def forward(self, x):
        return self.coords.expand(x.shape[0], -1, -1)  # (B, K, 2)


# ------------------------------------------------------------------ git + DVC projects (test_dvc, tools/test_blend)

GIT_IDENTITY = {f"GIT_{role}_{field}": value for role in ("AUTHOR", "COMMITTER")
                for field, value in (("NAME", "test"), ("EMAIL", "test@example.com"))}


def git_dvc_project(root: Path, env: dict, dvc, message: str = "tiny project", timeout: float = 600):
    """Make `root` a git repository with DVC initialised and everything in it committed;
    returns `run(*args) -> stdout`, which runs a command there under `env` (plus a git
    identity) and fails the test on a non-zero exit."""
    env = {**env, **GIT_IDENTITY}

    def run(*args) -> str:
        r = subprocess.run([str(a) for a in args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
        return r.stdout

    run("git", "init", "-q")
    run(dvc, "init", "-q")
    run("git", "add", "-A")
    run("git", "commit", "-q", "-m", message)
    return run
