"""show, heatmaps and filters, checked by decoding what each command wrote (size, non-blank content)."""


import numpy as np

from pipeline.keypoints.draw import GAP, HEADER_H, sheet_size
from pipeline.keypoints.metrics import per_face_mae
from pipeline.tools.viz import filter_grid

from helpers import check_picture, run

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
