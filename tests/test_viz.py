"""Pictures: show, heatmaps, filters, predict-image, morph and the GIF encoder, each
checked by decoding what the command wrote (size, non-blank content)."""

import json
import struct

import cv2
import numpy as np
import pytest

from conftest import run
from pipeline.core.config import load_config
from pipeline.keypoints.draw import GAP, HEADER_H, sheet_size
from pipeline.detection.haar import cascade_available, haar_to_box, iou
from pipeline.keypoints.metrics import per_face_mae
from pipeline.tools.morph import CUBE_PALETTE, encode_gif, lzw_encode, morph_frames, quantize_cube
from pipeline.tools.viz import filter_grid

needs_haar = pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def viz_ws(tiny_workspace, demo_dir, tmp_path_factory):
    """tiny_workspace + a 1-epoch resunet-tiny (32 px) for fold 0, its predictions
    (test.npz, oof.npz as `pipeline predict` lays them out) and a regression checkpoint."""
    import torch

    from pipeline.formats.cache import load_cache
    from pipeline.formats.checkpoint import load_model, save_checkpoint
    from pipeline.inference.tta import predict_original
    from pipeline.models import create_model
    from pipeline.keypoints.schema import IBUG68
    from pipeline.stages.train import fit

    ws = tiny_workspace
    out = tmp_path_factory.mktemp("vizws")
    cfg = load_config(None, [f"data.dir={demo_dir}", "crop.side=32", "model.input_size=32", "train.epochs=1",
                             "train.batch_size=16", "train.device=cpu", "folds.k=2"])
    fit(cfg, 0, ws / "cache", ws / "folds.csv", out / "models", resume=False)
    ckpt_path = out / "models" / "fold0" / "best.pt"
    model, ckpt = load_model(ckpt_path, "cpu")
    train, test = load_cache(ws / "cache" / "train"), load_cache(ws / "cache" / "test")
    import pandas as pd

    fold = pd.read_csv(ws / "folds.csv")["fold"].to_numpy()
    dev = torch.device("cpu")
    ens = predict_original(model, ckpt, test.faces, test.crop_to_orig, "flip", 64, dev)["final"]
    val = np.flatnonzero(fold == 0)
    tta = np.full((len(train), 68, 2), np.nan)
    tta[val] = predict_original(model, ckpt, train.faces[val], train.crop_to_orig[val], "flip", 64, dev)["tta"]
    (out / "pred").mkdir()
    np.savez(out / "pred" / "test.npz", ensemble=ens, per_fold=ens[None], folds=np.array([0]))
    np.savez(out / "pred" / "oof.npz", tta=tta, plain=tta, fold=fold)
    reg = create_model("vgg-seed", 68, 3, 32)
    save_checkpoint(out / "reg.pt", {"model_config": reg.config, "model": reg.state_dict(), "epoch": 0,
                                     "schema": IBUG68.to_dict(), "config": cfg, "best_mae": 0.0})
    return {"cache": ws / "cache", "pred": out / "pred", "ckpt": ckpt_path, "reg": out / "reg.pt",
            "data": demo_dir, "n_val": len(val)}




def check_picture(path, shape=None, min_std=8.0, min_colors=20):
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert img is not None, f"{path} does not decode"
    if shape is not None:
        assert img.shape[:2] == tuple(shape)
    assert img.std() > min_std
    assert len(np.unique(img.reshape(-1, 3), axis=0)) >= min_colors
    return img


# ------------------------------------------------------------------------------ show


def test_show_writes_both_sheets(viz_ws, tmp_path):
    out = tmp_path / "show"
    assert run(["show", "--cache", viz_ws["cache"], "--predictions", viz_ws["pred"], "--data-dir", viz_ws["data"],
                "--out", out, "--n", 4, "--worst", 3, "--tile", 64]) == 0
    # 4 tiles -> 2 x 2; 3 tiles -> 2 columns, 2 rows
    check_picture(out / "test_sheet.png", (HEADER_H + 2 * 64 + 3 * GAP, 2 * 64 + 3 * GAP))
    check_picture(out / "worst_oof.png", sheet_size(3, 64, 2, True))
    assert not list(out.glob(".*")), "temp files left behind"


def test_show_missing_predictions_is_a_clean_error(viz_ws, tmp_path, capsys):
    assert run(["show", "--cache", viz_ws["cache"], "--predictions", tmp_path, "--data-dir", viz_ws["data"],
                "--out", tmp_path / "o"]) == 2
    assert "run `pipeline predict` first" in capsys.readouterr().err


def test_per_face_mae_skips_unpredicted_faces():
    truth = np.zeros((3, 2, 2))
    pred = np.stack([np.ones((2, 2)), np.full((2, 2), np.nan), np.full((2, 2), -3.0)])
    err = per_face_mae(pred, truth)
    assert err[0] == 1 and np.isnan(err[1]) and err[2] == 3


# ------------------------------------------------------------------------------ heatmaps / filters


def test_heatmaps_of_a_test_face(viz_ws, tmp_path):
    p = tmp_path / "h.png"
    assert run(["heatmaps", "1", "--checkpoint", viz_ws["ckpt"], "--cache", viz_ws["cache"], "--points", "36,45,30",
                "--tile", 48, "--out", p]) == 0
    img = check_picture(p, (48 + 2 * GAP, 4 * 48 + 5 * GAP))
    # the map panels are coloured (a colormap), not the gray face
    panel = img[GAP:GAP + 48, 2 * GAP + 48:2 * GAP + 96].astype(int)
    assert np.abs(panel[..., 0] - panel[..., 2]).mean() > 5


def test_heatmaps_default_points_and_bad_points(viz_ws, tmp_path, capsys):
    p = tmp_path / "h.png"
    assert run(["heatmaps", "0", "--checkpoint", viz_ws["ckpt"], "--cache", viz_ws["cache"], "--tile", 32,
                "--out", p]) == 0
    check_picture(p, (32 + 2 * GAP, 6 * 32 + 7 * GAP))  # face + 5 default points
    assert run(["heatmaps", "0", "--checkpoint", viz_ws["ckpt"], "--cache", viz_ws["cache"], "--points", "68",
                "--out", p]) == 2
    assert "--points" in capsys.readouterr().err
    assert run(["heatmaps", "99", "--checkpoint", viz_ws["ckpt"], "--cache", viz_ws["cache"], "--out", p]) == 2
    assert "out of range" in capsys.readouterr().err


def test_heatmaps_of_a_regression_model_is_a_pipeline_error(viz_ws, tmp_path, capsys):
    assert run(["heatmaps", "0", "--checkpoint", viz_ws["reg"], "--cache", viz_ws["cache"],
                "--out", tmp_path / "h.png"]) == 2
    err = capsys.readouterr().err
    assert "no heatmaps" in err and "vgg-seed" in err
    assert not (tmp_path / "h.png").exists()


def test_filters_grid(viz_ws, tmp_path):
    import torch

    w = torch.load(viz_ws["ckpt"], weights_only=True)["model"]["stem.conv1.conv.weight"]
    o, _, kh, _ = w.shape
    p = tmp_path / "f.png"
    assert run(["filters", "--checkpoint", viz_ws["ckpt"], "--tile", 24, "--out", p]) == 0
    cols = int(np.ceil(np.sqrt(o)))
    rows = int(np.ceil(o / cols))
    side = 24 // kh * kh
    check_picture(p, (rows * side + (rows + 1) * GAP, cols * side + (cols + 1) * GAP))
    # the regression model's first conv works too
    assert run(["filters", "--checkpoint", viz_ws["reg"], "--out", tmp_path / "g.png"]) == 0


def test_filter_grid_normalises_each_filter():
    w = np.zeros((2, 1, 2, 2))
    w[0, 0] = [[-1, 0], [1, 3]]
    w[1, 0] = 5.0  # constant: mid gray
    g = filter_grid(w, tile=2, cols=2)  # scale 1: each filter 2x2 px
    f0 = g[GAP:GAP + 2, GAP:GAP + 2, 0]
    assert f0.min() == 0 and f0.max() == 255 and f0[0, 1] == 64
    assert (g[GAP:GAP + 2, 2 * GAP + 2:2 * GAP + 4] == 128).all()


# ------------------------------------------------------------------------------ predict-image


def test_box_conversion_and_iou():
    b = haar_to_box(np.array([[0.0, 0.0, 100.0, 100.0]]))[0]
    np.testing.assert_allclose(b[2:], [86, 93])
    np.testing.assert_allclose([b[0] + b[2] / 2, b[1] + b[3] / 2], [50, 59])
    m = iou(np.array([[0, 0, 10, 10]]), np.array([[0, 0, 10, 10], [5, 0, 10, 10], [20, 20, 5, 5]]))
    np.testing.assert_allclose(m[0], [1, 5 / 15, 0])


@needs_haar
def test_predict_image_blank_photo_gives_zero_faces(viz_ws, tmp_path, caplog):
    photo = tmp_path / "blank.png"
    cv2.imwrite(str(photo), np.full((120, 160, 3), 127, np.uint8))
    out = tmp_path / "out"
    assert run(["predict-image", photo, "--checkpoint", viz_ws["ckpt"], "--out-dir", out, "--csv"]) == 0
    res = json.loads((out / "blank_keypoints.json").read_text())
    assert res["n_faces"] == 0 and res["faces"] == [] and (res["width"], res["height"]) == (160, 120)
    assert cv2.imread(str(out / "blank_keypoints.png")).shape == (120, 160, 3)
    assert (out / "keypoints.csv").read_text().count("\n") == 1  # header only
    assert "no face found" in caplog.text


@needs_haar
def test_predict_image_unreadable_photo_exits_2(viz_ws, tmp_path, capsys):
    photo = tmp_path / "bad.jpg"
    photo.write_bytes(b"not an image")
    assert run(["predict-image", photo, "--checkpoint", viz_ws["ckpt"], "--out-dir", tmp_path / "o"]) == 2
    assert "cannot decode" in capsys.readouterr().err


@pytest.mark.skipif(cascade_available(), reason="this OpenCV has the Haar cascade")
def test_predict_image_without_cascade_says_how_to_fix(viz_ws, tmp_path, capsys):
    assert run(["predict-image", tmp_path / "x.png", "--checkpoint", viz_ws["ckpt"], "--out-dir", tmp_path,
                "--detector", "haar"]) == 2
    assert "opencv-python-headless<5" in capsys.readouterr().err


@needs_haar
@pytest.mark.realdata
def test_predict_image_finds_a_real_face(viz_ws, real_dir, tmp_path):
    from pipeline.formats.annotations import load_xml
    from pipeline.keypoints.schema import IBUG68

    face = load_xml(real_dir / "labels_ibug_300W_train.xml", IBUG68)[0]  # helen/trainset/100032540_1.jpg
    out = tmp_path / "out"
    assert run(["predict-image", real_dir / face.image, "--checkpoint", viz_ws["ckpt"], "--out-dir", out,
                "--csv"]) == 0
    stem = (real_dir / face.image).stem
    res = json.loads((out / f"{stem}_keypoints.json").read_text())
    assert res["n_faces"] >= 1
    f0 = res["faces"][0]
    assert np.asarray(f0["points"]).shape == (68, 2)
    # the calibrated detector box lands on the annotated one
    assert iou(np.array([f0["box"]]), np.array([face.box]))[0, 0] > 0.5
    check_picture(out / f"{stem}_keypoints.png", (res["height"], res["width"]))
    assert (out / "keypoints.csv").read_text().count("\n") == 1 + res["n_faces"]


# ------------------------------------------------------------------------------ GIF encoder


def lzw_decode(data: bytes, min_code_size: int) -> bytes:
    """Independent GIF LZW decoder (giflib's rules: widen after the code that fills the
    width, table full at 4096)."""
    clear, eoi = 1 << min_code_size, (1 << min_code_size) + 1
    bits, total, pos = int.from_bytes(data, "little"), len(data) * 8, 0
    out, width, table, prev, nxt = bytearray(), min_code_size + 1, {}, None, eoi + 1
    while True:
        assert pos + width <= total, "no end-of-information code"
        code = (bits >> pos) & ((1 << width) - 1)
        pos += width
        if code == clear:
            table = {i: bytes([i]) for i in range(clear)}
            width, prev, nxt = min_code_size + 1, None, eoi + 1
            continue
        if code == eoi:
            return bytes(out)
        if prev is None:
            entry = table[code]
        else:
            if code in table:
                entry = table[code]
            else:
                assert code == nxt, f"bad code {code}"
                entry = table[prev] + table[prev][:1]
            if nxt < 4096:
                table[nxt] = table[prev] + entry[:1]
                nxt += 1
                if nxt == 1 << width and width < 12:
                    width += 1
        out += entry
        prev = code


def parse_gif(data: bytes):
    """Walk the GIF block structure: (width, height, global palette, loop, [(delay, indices)])."""
    assert data[:6] == b"GIF89a"
    w, h, packed, _, _ = struct.unpack("<HHBBB", data[6:13])
    pos, pal = 13, None
    if packed & 0x80:
        n = 2 << (packed & 7)
        pal = np.frombuffer(data[pos:pos + 3 * n], np.uint8).reshape(n, 3)
        pos += 3 * n
    frames, loop, delay = [], None, None

    def sub_blocks(pos):
        chunks = []
        while data[pos]:
            chunks.append(data[pos + 1:pos + 1 + data[pos]])
            pos += 1 + data[pos]
        return b"".join(chunks), pos + 1

    while True:
        b = data[pos]
        if b == 0x3B:
            assert pos == len(data) - 1, "bytes after the trailer"
            break
        if b == 0x21:
            label = data[pos + 1]
            body, pos = sub_blocks(pos + 2)
            if label == 0xFF and body.startswith(b"NETSCAPE2.0"):
                loop = struct.unpack("<H", body[12:14])[0]  # "NETSCAPE2.0", 1, loop
            elif label == 0xF9:
                delay = struct.unpack("<H", body[1:3])[0]
        elif b == 0x2C:  # image descriptor
            _, _, fw, fh, fpacked = struct.unpack("<HHHHB", data[pos + 1:pos + 10])
            assert (fw, fh) == (w, h) and fpacked == 0
            mcs = data[pos + 10]
            lzw, pos = sub_blocks(pos + 11)
            idx = np.frombuffer(lzw_decode(lzw, mcs), np.uint8)
            assert idx.size == w * h
            frames.append((delay, idx.reshape(h, w)))
        else:
            raise AssertionError(f"unknown block 0x{b:02x} at {pos}")
    return w, h, pal, loop, frames


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


# ------------------------------------------------------------------------------ morph


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
    data = p.read_bytes()
    assert data.startswith(b"GIF89a")
    w, h, pal, loop, frames = parse_gif(data)
    assert (w, h, loop, len(frames)) == (40, 40, 0, 5)
    assert all(d == 5 for d, _ in frames)
    first, last = pal[frames[0][1]], pal[frames[-1][1]]
    assert first.std() > 8 and len(np.unique(frames[0][1])) > 10
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
