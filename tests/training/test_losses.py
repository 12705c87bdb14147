"""Losses: zero at the truth, hand-computed values, the structure term."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.errors import PipelineError
from pipeline.keypoints.schema import IBUG68, NOSE1
from pipeline.training.losses import LOSS_KINDS, build_loss, keypoint_loss, neighbour_offsets, structure_loss

# B = 2, K = 2: errors (0, 0), (3, 4) in the first face, (6, 8), (0, 0) in the second
TARGET = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
PRED = TARGET + torch.tensor([[[0.0, 0.0], [3.0, 4.0]], [[6.0, 8.0], [0.0, 0.0]]])
EXPECTED = {
    "l1": (3 + 4 + 6 + 8) / 8,  # mean |error| over 8 coordinates
    "mse": (9 + 16 + 36 + 64) / 8,
    "l2": (0 + 5 + 10 + 0) / 4,  # mean distance over 4 points
    "euclidean": ((0 + 5) + (10 + 0)) / 2,  # summed over the points, mean over 2 faces
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
S_EXPECTED = {"l1": (3 + 4 + 3 + 4) / 6, "mse": (9 + 16 + 9 + 16) / 6, "l2": 10 / 3, "euclidean": 10.0}


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

def test_gaussian_maps_are_normalised_and_centred_on_the_soft_argmax_grid():
    from pipeline.models.head import soft_argmax
    from pipeline.training.losses import gaussian_maps

    target = torch.tensor([[[30.0, 21.5], [40.25, 33.0], [-60.0, 10.0]]])  # (1, 3, 2) input px
    maps, inside = gaussian_maps(target, (16, 16), (64, 64), 1.0)
    assert inside.tolist() == [[True, True, False]]  # the third point is far off the map
    torch.testing.assert_close(maps[0, :2].sum((-2, -1)), torch.ones(2))
    # the expectation of a map (read with soft_argmax's own grid) is its target
    coords, _ = soft_argmax(maps[:, :2].clamp_min(1e-30).log(), (64, 64))
    torch.testing.assert_close(coords, target[:, :2], atol=1e-3, rtol=0)


def test_js_divergence_is_zero_for_equal_maps_and_at_most_ln2():
    from pipeline.training.losses import js_divergence

    p = torch.zeros(1, 2, 4, 4)
    p[0, 0, 0, 0] = p[0, 1, 3, 3] = 1.0
    q = torch.full((1, 2, 4, 4), 1 / 16)
    assert js_divergence(q, q).abs().max() < 1e-6
    disjoint = js_divergence(p[:, :1], p[:, 1:])
    assert abs(disjoint.item() - np.log(2)) < 1e-5
    assert (js_divergence(p, q) < np.log(2)).all()


@pytest.mark.parametrize("sharpness", [1.0, 30.0])  # 30: peaked maps whose tails underflow to ~0
def test_js_divergence_value_and_gradient_match_the_plain_formula(sharpness):
    # the fused autograd Function must give the same loss and gradient as autograd of the
    # textbook formula (eps terms included), or the regulariser would train differently
    from pipeline.training.losses import js_divergence

    def plain(p, q, eps=1e-12):
        log_m = (0.5 * (p + q) + eps).log()
        return 0.5 * ((p * ((p + eps).log() - log_m)).sum((-2, -1)) + (q * ((q + eps).log() - log_m)).sum((-2, -1)))

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 7, 9, generator=g, dtype=torch.float64) * sharpness).requires_grad_()
    q = (torch.randn(3, 5, 63, generator=g, dtype=torch.float64) * 3).softmax(-1).reshape(3, 5, 7, 9)
    weights = torch.randn(3, 5, generator=g, dtype=torch.float64)
    results = []
    for fn in (js_divergence, plain):
        p = logits.reshape(3, 5, 63).softmax(-1).reshape(3, 5, 7, 9)
        js = fn(p, q)
        results.append((js, *torch.autograd.grad((js * weights).sum(), logits)))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-14, rtol=0)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-14, rtol=0)


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
