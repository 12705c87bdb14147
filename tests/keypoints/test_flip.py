"""Flip helpers: the same convention as KeypointSchema.flip_coords and the augmentation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.keypoints.flip import flip_coords, flip_images
from pipeline.keypoints.schema import IBUG68, NOSE1, KeypointSchema
from pipeline.models import soft_argmax

GRID9 = KeypointSchema("grid9", tuple(f"p{i}" for i in range(9)), (2, 1, 0, 5, 4, 3, 8, 7, 6))


def test_flip_images():
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    y = flip_images(x)
    assert y.shape == x.shape
    for col in range(5):
        assert torch.equal(y[..., col], x[..., 4 - col])
    assert torch.equal(flip_images(y), x)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert torch.equal(flip_images(cl), y)


@pytest.mark.parametrize("schema", [IBUG68, NOSE1, GRID9], ids=lambda s: s.name)
@pytest.mark.parametrize("width", [96, 224, 95.0])
def test_unflip_matches_schema_flip_coords(schema, width):
    coords = np.random.default_rng(0).uniform(-3, width + 3, (4, schema.k, 2)).astype(np.float32)
    ours = flip_coords(torch.from_numpy(coords), width, schema.flip_perm).numpy()
    np.testing.assert_allclose(ours, schema.flip_coords(coords, width), atol=1e-5)


def test_unflip_is_an_involution():
    c = torch.rand(3, 68, 2, dtype=torch.float64) * 96
    perm = torch.tensor(IBUG68.flip_perm)
    twice = flip_coords(flip_coords(c, 96, perm), 96, perm)
    assert torch.allclose(twice, c)
    assert twice.dtype == torch.float64


def test_ibug_eye_corners_swap():
    c = torch.zeros(1, 68, 2)
    c[0, 36] = torch.tensor([30.0, 40.0])  # outer corner of the eye on the image left
    out = flip_coords(c, 96, IBUG68.flip_perm)
    assert torch.equal(out[0, 45], torch.tensor([65.0, 40.0]))  # now the other eye's, mirrored


def test_flip_tta_equivariance_with_soft_argmax():
    """A detector that is exactly right on both the image and its mirror: its prediction on
    the mirror, mapped back, equals its prediction on the image."""
    h, w = 16, 24
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 9, h, w, generator=g) * 4  # (B, K, H, W), one map per point
    coords, _ = soft_argmax(logits)
    # on the mirrored face the detector's map for point i is the mirrored map of the
    # point that lands on i, flip_perm[i]
    perm = torch.tensor(GRID9.flip_perm)
    mirrored, _ = soft_argmax(flip_images(logits)[:, perm])
    np.testing.assert_allclose(mirrored.numpy(), GRID9.flip_coords(coords.numpy(), w), atol=1e-4)
    back = flip_coords(mirrored, w, GRID9.flip_perm)
    assert torch.allclose(back, coords, atol=1e-4)


def test_flip_of_a_one_hot_map_lands_on_the_mirrored_pixel():
    logits = torch.full((1, 1, 8, 10), -1e4)
    logits[0, 0, 5, 2] = 1e4
    flipped, _ = soft_argmax(flip_images(logits))
    assert torch.equal(flipped[0, 0], torch.tensor([10 - 1 - 2.0, 5.0]))


def test_unflip_on_the_device_of_the_coords():
    c = torch.rand(2, 9, 2)
    out = flip_coords(c, 32, list(GRID9.flip_perm))
    assert out.device == c.device and out.shape == c.shape
