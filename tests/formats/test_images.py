"""The GIF writer: frames, delays and loop read back with Pillow, and with FFmpeg
(cv2.VideoCapture) where OpenCV has it."""


import cv2
import numpy as np
import pytest

from pipeline.formats.images import encode_gif, write_gif

from helpers import read_gif

# colours a palette of a frame's own keeps exactly
IMG = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]],
                [[255, 255, 255], [0, 0, 0], [51, 102, 153]]], dtype=np.uint8)


def test_gif_round_trips_a_tiny_known_image():
    frames = [IMG, IMG[::-1].copy(), IMG[:, ::-1].copy()]
    w, h, loop, got = read_gif(encode_gif(frames, delay_cs=7, loop=0))
    assert (w, h, loop, len(got)) == (3, 2, 0, 3)
    assert all(delay == 7 for delay, _ in got)
    for (_, rgb), want in zip(got, frames):
        np.testing.assert_array_equal(rgb, want)


def test_gif_of_a_photo_keeps_its_colours_and_refuses_odd_frames():
    rng = np.random.default_rng(0)
    photo = cv2.GaussianBlur(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), (0, 0), 3)
    _, _, _, got = read_gif(encode_gif([photo, 255 - photo], delay_cs=5))
    assert len(got) == 2 and np.abs(got[0][1].astype(int) - photo).mean() < 4  # within a few levels
    with pytest.raises(ValueError, match="no frames"):
        encode_gif([])
    with pytest.raises(ValueError, match="expected"):
        encode_gif([photo, photo[:10]])


def test_ffmpeg_reads_the_same_pixels(tmp_path):
    frames = [np.repeat(np.repeat(f, 8, 0), 8, 1) for f in (IMG, IMG[::-1].copy(), IMG[:, ::-1].copy())]
    p = write_gif(tmp_path / "t.gif", frames)
    assert p.read_bytes().startswith(b"GIF89a") and not list(tmp_path.glob("*.tmp"))
    cap = cv2.VideoCapture(str(p))
    if not cap.isOpened():
        pytest.skip("cv2.VideoCapture cannot read GIF here (no FFmpeg)")
    got = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        got.append(f)
    assert len(got) == 3
    np.testing.assert_array_equal(got[0][::8, ::8, ::-1], IMG)
