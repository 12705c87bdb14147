"""The GIF encoder, checked with an independent decoder (tests/conftest.py)."""


import cv2
import numpy as np
import pytest

from pipeline.formats.images import CUBE_PALETTE, encode_gif, lzw_encode, quantize_cube

from conftest import lzw_decode, parse_gif


def test_lzw_hand_made_bytes():
    # [0, 0, 0, 0] -> clear 256, 0, 258 ('00'), 0, end 257, all 9 bits, LSB first
    assert lzw_encode(bytes(4)) == b"\x00\x01\x08\x04\x10\x10"


@pytest.mark.parametrize("alphabet", [1, 3, 256])
def test_lzw_round_trip_through_table_resets(alphabet):
    rng = np.random.default_rng(alphabet)
    for n in [0, 1, 2, 255, 256, 257, 511, 5000, 40000]:
        data = rng.integers(0, alphabet, n, dtype=np.uint8).tobytes()
        assert lzw_decode(lzw_encode(data), 8) == data, n
    # code widths at the end of the stream: runs of zeros whose last code fills 9 bits
    for n in (32639, 32640, 32641):
        assert lzw_decode(lzw_encode(bytes(n)), 8) == bytes(n)


def test_gif_round_trips_a_tiny_known_image(tmp_path):
    # colours on the 6x6x6 cube survive quantisation (and its dithering) exactly
    img = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]],
                    [[255, 255, 255], [0, 0, 0], [51, 102, 153]]], dtype=np.uint8)
    data = encode_gif([img, img[::-1].copy()], delay_cs=7, loop=0)
    w, h, pal, loop, frames = parse_gif(data)
    assert (w, h, loop, len(frames)) == (3, 2, 0, 2)
    assert np.array_equal(pal, CUBE_PALETTE)
    assert frames[0][0] == 7
    assert np.array_equal(pal[frames[0][1]], img) and np.array_equal(pal[frames[1][1]], img[::-1])
    assert np.array_equal(frames[0][1], quantize_cube(img))
    # and FFmpeg (through cv2.VideoCapture) reads the same pixels, where it is built in
    p = tmp_path / "t.gif"
    p.write_bytes(encode_gif([np.repeat(np.repeat(img, 8, 0), 8, 1)] * 3))
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
    assert np.array_equal(got[0][::8, ::8, ::-1], img)


def test_quantize_dither_keeps_the_mean():
    flat = np.full((64, 64, 3), 100, np.uint8)
    q = CUBE_PALETTE[quantize_cube(flat)].astype(float)
    assert abs(q.mean() - 100) < 2 and len(np.unique(q[..., 0])) == 2
