"""Losses: zero at the truth, hand-computed values, the structure term."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.core.errors import PipelineError
from pipeline.keypoints.schema import IBUG68, NOSE1
from pipeline.training.losses import LOSS_KINDS, build_loss, keypoint_loss, neighbour_offsets, structure_loss, wing

# B = 2, K = 2: errors (0, 0), (3, 4) in the first face, (6, 8), (0, 0) in the second
TARGET = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
PRED = TARGET + torch.tensor([[[0.0, 0.0], [3.0, 4.0]], [[6.0, 8.0], [0.0, 0.0]]])
EXPECTED = {
    "l1": (3 + 4 + 6 + 8) / 8,  # mean |error| over 8 coordinates
    "mse": (9 + 16 + 36 + 64) / 8,
    "l2": (0 + 5 + 10 + 0) / 4,  # mean distance over 4 points
    "euclidean": ((0 + 5) + (10 + 0)) / 2,  # summed over the points, mean over 2 faces
    # every error below the default width 10: 10 ln(1 + e / 2), mean over 8 coordinates (4 of them 0)
    "wing": 10 * (math.log(2.5) + math.log(3) + math.log(4) + math.log(5)) / 8,
}


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_hand_computed(kind):
    assert keypoint_loss(PRED, TARGET, kind).item() == pytest.approx(EXPECTED[kind])


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_zero_at_the_truth_with_finite_gradients(kind):
    pred = TARGET.clone().requires_grad_()
    loss = keypoint_loss(pred, TARGET, kind)
    assert loss.item() == 0
    loss.backward()
    assert torch.isfinite(pred.grad).all()  # no NaN from the norm at a zero error


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_positive_off_the_truth(kind):
    assert keypoint_loss(TARGET + 0.1, TARGET, kind).item() > 0


# three points; neighbours: 0 -> 1, 1 -> 0, 2 -> 0. Point 1 moves from (1, 0) to (4, 4):
# offsets 0-1 and 1-0 are off by (3, 4) (distance 5), 2-0 is exact.
S_TARGET = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
S_PRED = torch.tensor([[[0.0, 0.0], [4.0, 4.0], [0.0, 1.0]]])
S_NEIGHBOURS = torch.tensor([[1], [0], [0]])
S_EXPECTED = {"l1": (3 + 4 + 3 + 4) / 6, "mse": (9 + 16 + 9 + 16) / 6, "l2": 10 / 3, "euclidean": 10.0,
              "wing": 10 * (2 * math.log(2.5) + 2 * math.log(3)) / 6}


def test_neighbour_offsets():
    off = neighbour_offsets(S_PRED, S_NEIGHBOURS)
    assert off.shape == (1, 3, 1, 2)
    assert torch.equal(off[0, :, 0], torch.tensor([[-4.0, -4.0], [4.0, 4.0], [0.0, 1.0]]))


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_structure_hand_computed(kind):
    assert structure_loss(S_PRED, S_TARGET, S_NEIGHBOURS, kind).item() == pytest.approx(S_EXPECTED[kind])


def ibug_case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mean_shape = np.random.default_rng(seed).uniform(10, 90, (68, 2))
    neighbours = torch.as_tensor(IBUG68.neighbours(mean_shape))
    # quarter-pixel positions: shifts and offsets are exact in float32
    target = torch.randint(0, 4 * 96, (4, 68, 2), generator=g) / 4
    return neighbours, target, g


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_structure_zero_at_truth_and_under_translation_positive_otherwise(kind):
    neighbours, target, g = ibug_case()
    assert neighbours.shape == (68, 2)
    assert structure_loss(target, target, neighbours, kind).item() == 0
    # a common shift keeps every offset: only the point loss sees it
    assert structure_loss(target + torch.tensor([3.0, -2.5]), target, neighbours, kind).item() == 0
    noisy = target + torch.randn(target.shape, generator=g)
    assert structure_loss(noisy, target, neighbours, kind).item() > 0


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_build_loss_total_and_parts(kind):
    neighbours, target, g = ibug_case(1)
    loss_fn = build_loss(kind, 0.2, neighbours)
    total, parts = loss_fn(target, target)
    assert total.item() == 0 and parts["main"].item() == 0 and parts["structure"].item() == 0
    pred = (target + torch.randn(target.shape, generator=g)).requires_grad_()
    total, parts = loss_fn(pred, target)
    assert parts["main"].item() == pytest.approx(keypoint_loss(pred, target, kind).item())
    assert parts["structure"].item() == pytest.approx(structure_loss(pred, target, neighbours, kind).item())
    assert total.item() == pytest.approx(parts["main"].item() + 0.2 * parts["structure"].item(), rel=1e-6)
    assert not parts["main"].requires_grad  # logging values
    total.backward()
    assert torch.isfinite(pred.grad).all()


def test_build_loss_without_structure():
    neighbours, target, _ = ibug_case(2)
    pred = target + 1.0
    total, parts = build_loss("l1", 0.0, neighbours)(pred, target)
    assert total.item() == pytest.approx(1.0) and parts["structure"].item() == 0
    # a single-point schema has no neighbours: the structure term is zero, not an error
    nb = NOSE1.neighbours(np.zeros((1, 2)))
    assert nb.shape == (1, 0)
    total, parts = build_loss("l2", 0.2, nb)(torch.ones(2, 1, 2), torch.zeros(2, 1, 2))
    assert total.item() == pytest.approx(2 ** 0.5) and parts["structure"].item() == 0
    total, _ = build_loss("mse", 0.2, None)(torch.ones(2, 3, 2), torch.zeros(2, 3, 2))
    assert total.item() == 1


def test_numpy_neighbours_and_device_buffer():
    neighbours, target, _ = ibug_case(3)
    loss_fn = build_loss("euclidean", 0.5, neighbours.numpy())
    assert loss_fn.neighbours.dtype == torch.long
    assert "neighbours" not in loss_fn.state_dict()
    total, _ = loss_fn(target + 1, target)
    assert total.item() == pytest.approx(68 * 2 ** 0.5, rel=1e-5)  # shift: structure term 0


def test_wing_is_continuous_at_its_width_steeper_than_l1_below_it_and_l1_above():
    err = torch.tensor([0.0, 9.999, 10.0, 10.001, 30.0], dtype=torch.float64, requires_grad=True)
    loss = wing(err, 10.0, 2.0)
    assert loss[1].item() == pytest.approx(loss[3].item(), abs=1e-2)  # no jump at the width
    loss.sum().backward()
    slope = err.grad.tolist()
    assert slope[0] == pytest.approx(10 / 2)  # width / curvature near 0
    assert slope[1] == pytest.approx(10 / 12, rel=1e-3)  # width / (curvature + width) just below
    assert slope[3] == slope[4] == 1.0  # the L1 slope above
    assert loss[4].item() == pytest.approx(30 - 10 + 10 * math.log(6))


def test_wing_shape_is_in_input_pixels_at_any_coordinate_scale():
    """On [-1, 1] coordinates the width and curvature scale with the errors, so a wing
    loss on normalised coordinates is the pixel one times the scale: the same shape."""
    _, target, g = ibug_case(4)
    pred = target + 3 * torch.randn(target.shape, generator=g)
    scale = 2 / 96
    total, parts = build_loss("wing", 0.0, coord_scale=scale, wing_width=6.0, wing_curvature=1.5)(pred, target)
    assert total.item() == pytest.approx(scale * keypoint_loss(pred, target, "wing", (6.0, 1.5)).item(), rel=1e-5)
    with pytest.raises(PipelineError, match="wing_curvature must be a number > 0"):
        build_loss("wing", 0.0, wing_curvature=0.0)


def test_wing_params_reach_the_training_loss():
    from pipeline.core.params_schema import TrainParams
    from pipeline.training.losses import loss_from_params
    tcfg = TrainParams(loss="wing", wing_width=4.0, wing_curvature=0.5)
    loss_fn = loss_from_params(tcfg, 64, None)
    assert loss_fn.kind == "wing" and loss_fn.wing_shape == pytest.approx((4.0 / 32, 0.5 / 32))


def test_bad_arguments():
    with pytest.raises(PipelineError, match="unknown loss 'huber'"):
        build_loss("huber", 0.2, None)
    with pytest.raises(PipelineError, match="unknown loss"):
        keypoint_loss(PRED, TARGET, "l3")
    with pytest.raises(PipelineError, match="structure_lambda"):
        build_loss("l1", -1.0, None)
    neighbours, target, _ = ibug_case()
    with pytest.raises(ValueError, match="neighbours are for 68 keypoints"):
        build_loss("l1", 0.2, neighbours)(target[:, :5], target[:, :5])


# ------------------------------------------------------------------ heatmap regulariser

def full_map_gaussian_js(probs, target, input_hw, sigma, eps=1e-12):
    """The regulariser as written in the DSNT paper: a Gaussian over every map pixel,
    normalised over the map, and the textbook JS formula summed over every pixel."""
    (h, w), (H, W) = probs.shape[-2:], input_hw
    x = (target[..., 0] + 0.5) * (w / W) - 0.5
    y = (target[..., 1] + 0.5) * (h / H) - 0.5
    gx = torch.exp(-(torch.arange(w, dtype=probs.dtype) - x[..., None]).square() / (2 * sigma ** 2))
    gy = torch.exp(-(torch.arange(h, dtype=probs.dtype) - y[..., None]).square() / (2 * sigma ** 2))
    g = gy[..., :, None] * gx[..., None, :]
    mass = g.sum((-2, -1))
    q = g / mass.clamp_min(1e-12)[..., None, None]
    log_m = (0.5 * (probs + q) + eps).log()
    js = 0.5 * ((probs * ((probs + eps).log() - log_m)).sum((-2, -1))
                + (q * ((q + eps).log() - log_m)).sum((-2, -1)))
    return js, mass > 0.25 * (2 * np.pi * sigma ** 2), q


# targets (input px, 64 x 64 input, 16 x 16 maps): well inside, between pixels, on the
# border (half the Gaussian on the map), just off it, and far off it
JS_TARGETS = torch.tensor([[[30.0, 21.5], [40.25, 33.0], [0.0, 50.0], [70.0, 10.0], [-60.0, 10.0]]],
                          dtype=torch.float64)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("sharpness", [1.0, 30.0])  # 30: peaked maps whose tails underflow to ~0
def test_gaussian_js_reads_a_window_but_equals_the_full_map_formula(sigma, sharpness):
    # the window and the "ln 2 / 2 times the mass outside" term must give the loss and the
    # gradient of the full-map formula, or the regulariser would train differently
    from pipeline.training.losses import gaussian_js

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 16, 16, generator=g, dtype=torch.float64) * sharpness).requires_grad_()
    target = JS_TARGETS.expand(3, 5, 2)
    # the loss averages the targets inside only (an outside one has no usable Gaussian)
    weights = torch.randn(3, 5, generator=g, dtype=torch.float64) * torch.tensor([1.0, 1, 1, 0, 0])
    results = []
    for fn in (gaussian_js, full_map_gaussian_js):
        probs = logits.reshape(3, 5, 256).softmax(-1).reshape(3, 5, 16, 16)
        js, inside = fn(probs, target, (64, 64), sigma)[:2]
        results.append((js[:, :3], inside, *torch.autograd.grad((js * weights).sum(), logits)))
    assert results[0][1].tolist() == results[1][1].tolist() == [[True, True, True, False, False]] * 3
    # the Gaussian beyond 5 sigma (< 4e-6 of its peak) is the only difference
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(results[0][2], results[1][2], atol=1e-5, rtol=0)


def test_gaussian_js_is_zero_at_its_own_gaussian_and_ln2_for_disjoint_mass():
    from pipeline.models.head import soft_argmax
    from pipeline.training.losses import gaussian_js

    target = JS_TARGETS[:, :3].float()
    q = full_map_gaussian_js(torch.full((1, 3, 16, 16), 1 / 256), target, (64, 64), 1.0)[2]
    js, inside = gaussian_js(q, target, (64, 64), 1.0)
    assert inside.all() and js.abs().max() < 1e-6
    # the Gaussian's expectation (read with soft_argmax's own grid) is its target, away from the border
    coords, _ = soft_argmax(q[:, :2].clamp_min(1e-30).log(), (64, 64))
    torch.testing.assert_close(coords, target[:, :2], atol=1e-3, rtol=0)
    far = torch.zeros(1, 1, 16, 16)
    far[0, 0, 15, 0] = 1.0  # all the mass in a corner, far from a target at (30, 21.5): disjoint maps
    assert abs(gaussian_js(far, target[:, :1], (64, 64), 1.0)[0].item() - np.log(2)) < 1e-5


def test_heatmap_term_needs_maps_and_pulls_the_maps_towards_the_target():
    from pipeline.models.head import soft_argmax

    target = torch.tensor([[[20.0, 20.0]]])
    loss_fn = build_loss("l1", 0.0, coord_scale=2 / 64, heatmap_lambda=1.0, heatmap_sigma=1.0)
    assert loss_fn.needs_maps
    logits = torch.zeros(1, 1, 16, 16, requires_grad=True)
    coords, probs = soft_argmax(logits, (64, 64))
    with pytest.raises(ValueError):
        loss_fn(coords, target)
    total, parts = loss_fn(coords, target, probs, (64, 64))
    assert parts["heatmap"] > 0.1
    total.backward()
    # descending the gradient concentrates mass at the target's map pixel (4.5 -> cell 4 or 5)
    with torch.no_grad():
        new_probs = soft_argmax(logits - 50 * logits.grad, (64, 64))[1]
    assert new_probs[0, 0, 4:6, 4:6].sum() > probs[0, 0, 4:6, 4:6].sum()


def test_coord_scale_scales_point_and_structure_losses_alike():
    pred, target = torch.randn(2, 68, 2) * 10, torch.randn(2, 68, 2) * 10
    nb = torch.as_tensor(np.stack([(np.arange(68) + 1) % 68, (np.arange(68) + 2) % 68], 1))
    plain = build_loss("l1", 0.2, nb)(pred, target)[0]
    scaled = build_loss("l1", 0.2, nb, coord_scale=0.25)(pred, target)[0]
    torch.testing.assert_close(scaled, plain * 0.25)


@pytest.mark.parametrize("bad", [{"heatmap_lambda": -1.0}, {"heatmap_sigma": 0.0},
                                 {"coord_scale": float("nan")}])
def test_loss_rejects_out_of_range_settings(bad):
    from pipeline.core.errors import PipelineError

    with pytest.raises(PipelineError):
        build_loss("l1", 0.2, None, **bad)
