"""Augmentations move keypoints with the pixels.

Gaussian dots are drawn at the keypoints of a dark image; after a transform the brightest
pixel near each transformed keypoint must lie within 1.5 px of it, and (for the purely
geometric steps) the dot's intensity centroid within 0.1 px, which catches half-pixel
convention errors (x * s versus (x + 0.5) * s - 0.5, pivots at W / 2 versus (W - 1) / 2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from pipeline.keypoints.geometry import crop_to_input, input_to_crop
from pipeline.keypoints.preprocess import resize_batch
from pipeline.keypoints.schema import IBUG68, KeypointSchema
from pipeline.training.affine import op_matrix, resize_matrix, scale_matrix
from pipeline.training.augment import TrainAugment
from pipeline.training.randaugment import (
    GEOMETRIC_OPS,
    PHOTOMETRIC_OPS,
    RANDAUG_OPS,
    KeypointRandAugment,
    apply_ops,
    as_points,
    photometric,
    randaug_magnitudes,
)

SEEDS = range(30)
PEAK = 190  # below Solarize's threshold at m = 7 (255 * 23 / 30 = 195.5), so dots stay bright

# 3 x 3 grid of spread points; columns mirror under a horizontal flip (0 <-> 2 ...)
GRID = np.array([[x, y] for y in (30.0, 47.5, 65.0) for x in (30.0, 47.5, 65.0)])
GRID[:, 0] += np.array([0.3, -0.2, 0.4, 0.1, 0.0, -0.3, 0.2, 0.25, -0.1])  # sub-pixel positions
GRID[:, 1] += np.array([0.1, 0.4, -0.2, 0.3, -0.4, 0.0, 0.2, -0.1, 0.35])
SCHEMA = KeypointSchema("grid9", tuple(f"p{i}" for i in range(9)), (2, 1, 0, 5, 4, 3, 8, 7, 6))


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def dots(points, size: int = 96, channels: int = 3, sigma: float = 1.2, peaks=None) -> torch.Tensor:
    """uint8 (C, size, size): a gaussian dot of height `peaks[i]` at each point, background 0."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    img = np.zeros((size, size))
    for i, (x, y) in enumerate(np.asarray(points, dtype=np.float64)):
        p = PEAK if peaks is None else peaks[i]
        img = np.maximum(img, p * np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma ** 2)))
    img = np.round(img).astype(np.uint8)
    return torch.from_numpy(np.repeat(img[None], channels, axis=0).copy())


def visible(p, size: int, margin: float = 4.0) -> bool:
    return margin <= p[0] <= size - 1 - margin and margin <= p[1] <= size - 1 - margin


def brightest_near(image: torch.Tensor, p, r: int = 3) -> tuple[np.ndarray, int]:
    """Position and value of the brightest pixel within r px (per axis) of p. When several
    pixels share the maximum (Equalize / Posterize merge nearby levels), their mean position."""
    a = image.float().mean(0).numpy()
    cx, cy = int(round(p[0])), int(round(p[1]))
    x0, x1 = max(cx - r, 0), min(cx + r, a.shape[1] - 1)
    y0, y1 = max(cy - r, 0), min(cy + r, a.shape[0] - 1)
    win = a[y0:y1 + 1, x0:x1 + 1]
    iy, ix = np.nonzero(win == win.max())
    return np.array([x0 + ix.mean(), y0 + iy.mean()]), int(round(float(win.max())))


def centroid_near(image: torch.Tensor, p, r: int = 4) -> np.ndarray:
    a = image.float().mean(0).numpy().astype(np.float64)
    yy, xx = np.mgrid[0:a.shape[0], 0:a.shape[1]]
    w = a * (((xx - p[0]) ** 2 + (yy - p[1]) ** 2) <= r * r)
    return np.array([(w * xx).sum() / w.sum(), (w * yy).sum() / w.sum()])


def check_dots(image: torch.Tensor, kp: torch.Tensor, tol: float = 1.5, centroid_tol: float | None = None,
               min_checked: int = 1) -> int:
    """Assert the dot of every visible keypoint is where kp says; returns how many were checked."""
    size = image.shape[-1]
    checked = 0
    for i, p in enumerate(kp.numpy().astype(np.float64)):
        if not visible(p, size):
            continue
        pos, _ = brightest_near(image, p)
        assert np.linalg.norm(pos - p) <= tol, f"point {i}: brightest pixel {pos} vs keypoint {p}"
        if centroid_tol is not None:
            c = centroid_near(image, p)
            assert np.linalg.norm(c - p) <= centroid_tol, f"point {i}: centroid {c} vs keypoint {p}"
        checked += 1
    assert checked >= min_checked
    return checked


def apply_op(image: torch.Tensor, keypoints, op: str, value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One RandAugment op with signed magnitude `value` on a square (image, keypoints),
    through the augmentation's own path (`apply_ops`, no scale or flip)."""
    return apply_ops(image, as_points(keypoints), np.eye(3), image.shape[-1], [(op, value)], 0.0, None, True)


def random_op_value(op: str, g: torch.Generator, size: int = 96) -> float:
    """A signed magnitude of `op` from torchvision's table at a random bin."""
    m = int(torch.randint(31, (), generator=g))
    mags, signed = randaug_magnitudes(op, 31, size, size)
    v = 0.0 if mags is None else float(mags[m])
    if signed and float(torch.rand((), generator=g)) < 0.5:
        v = -v
    return v


# --------------------------------------------------------------------- coordinates

def test_crop_input_roundtrip_numpy_and_torch():
    rng = np.random.default_rng(0)
    pts = rng.uniform(-10, 140, size=(5, 68, 2))
    for cache, inp in [(96, 96), (128, 96), (96, 128), (77, 96), (160, 64)]:
        fwd = crop_to_input(pts, cache, inp)
        assert fwd.dtype == np.float64
        np.testing.assert_allclose(fwd, (pts + 0.5) * inp / cache - 0.5, rtol=0, atol=1e-12)
        np.testing.assert_allclose(input_to_crop(fwd, cache, inp), pts, rtol=0, atol=1e-10)
        t = torch.from_numpy(pts.astype(np.float32))
        tf = crop_to_input(t, cache, inp)
        assert isinstance(tf, torch.Tensor) and tf.dtype == torch.float32
        torch.testing.assert_close(input_to_crop(tf, cache, inp), t, rtol=0, atol=1e-4)
        # the matrix form used inside the augmentations is the same map
        m = resize_matrix(cache, inp)
        np.testing.assert_allclose(pts @ m[:2, :2].T + m[:2, 2], fwd, atol=1e-10)
    # pixel-centre convention: centre maps to centre, edges to edges
    np.testing.assert_allclose(crop_to_input(np.array([[47.5, 47.5], [-0.5, 95.5]]), 96, 48),
                               [[23.5, 23.5], [-0.5, 47.5]])
    assert crop_to_input(np.array([[3, 4]]), 96, 96).dtype == np.float64  # ints promoted


def test_the_input_resize_moves_pixels_as_crop_to_input_moves_points():
    """Prediction's cache -> input resize (`preprocess.resize_batch`: predict, validation,
    export) puts each dot where `crop_to_input` puts its point; `input_to_crop` maps it back."""
    for cache, inp in [(128, 96), (64, 96), (96, 96)]:
        pts = GRID * cache / 96
        img = dots(pts, cache, sigma=1.2 * cache / 96)
        out = resize_batch(img[None].float(), inp)[0]
        kp = crop_to_input(torch.from_numpy(pts.astype(np.float32)), cache, inp)
        assert out.shape == (3, inp, inp) and kp.dtype == torch.float32
        check_dots(out, kp, centroid_tol=0.1, min_checked=9)
        np.testing.assert_allclose(input_to_crop(kp.numpy().astype(np.float64), cache, inp), pts, atol=1e-4)
        if cache == inp:
            assert torch.equal(out, img.float())


# --------------------------------------------------------------------- geometric ops, one at a time

@pytest.mark.parametrize("op", GEOMETRIC_OPS)
def test_geometric_op_moves_dots(op):
    img = dots(GRID)
    kp0 = torch.from_numpy(GRID.astype(np.float32))
    moved = 0
    for seed in SEEDS:
        g = gen(seed)
        value = random_op_value(op, g)
        out, kp = apply_op(img, kp0, op, value)
        assert out.dtype == torch.uint8 and out.shape == img.shape
        check_dots(out, kp, centroid_tol=0.1, min_checked=1)
        moved += int(not torch.allclose(kp, kp0))
    assert moved >= 20  # the op really did something in most draws


@pytest.mark.parametrize("cache,inp", [(96, 96), (128, 96), (64, 96)])
def test_random_scale_moves_dots(cache, inp):
    pts = GRID * cache / 96
    img = dots(pts, cache, sigma=1.2 * cache / 96)
    aug = TrainAugment(SCHEMA, cache, inp, scale_min=0.6, scale_max=1.6, flip_p=0.0, randaug_n=0)
    for seed in SEEDS:
        out, kp = aug(img, torch.from_numpy(pts.astype(np.float32)), gen(seed))
        assert out.shape == (3, inp, inp)
        check_dots(out, kp, centroid_tol=0.1, min_checked=4)
        # scaling is about the centre: the middle point moves radially only
        factor, _, _ = aug.draw(gen(seed))
        c = (inp - 1) / 2
        expect = (crop_to_input(pts, cache, inp) - c) * factor + c
        np.testing.assert_allclose(kp.numpy(), expect, atol=1e-3)


def test_scale_one_equals_crop_to_input():
    np.testing.assert_allclose(scale_matrix(128, 96, 1.0), resize_matrix(128, 96), atol=1e-12)
    aug = TrainAugment(SCHEMA, 96, 96, scale_min=1.0, scale_max=1.0, flip_p=0.0, randaug_n=0)
    img = dots(GRID)
    out, kp = aug(img, torch.from_numpy(GRID.astype(np.float32)), gen(0))
    assert torch.equal(out, img)
    np.testing.assert_allclose(kp.numpy(), GRID, atol=1e-5)


def test_flip_mirrors_pixels_and_remaps_indices():
    peaks = [250, 230, 210, 190, 170, 150, 130, 110, 90]  # one intensity per keypoint
    img = dots(GRID, peaks=peaks)
    kp0 = torch.from_numpy(GRID.astype(np.float32))
    aug = TrainAugment(SCHEMA, 96, 96, scale_min=1.0, scale_max=1.0, flip_p=1.0, randaug_n=0)
    out, kp = aug(img, kp0, gen(0))
    assert torch.equal(out, img.flip(-1))  # an exact mirror, x -> W - 1 - x
    np.testing.assert_allclose(kp.numpy(), SCHEMA.flip_coords(GRID, 96), atol=1e-5)
    for i, p in enumerate(kp.numpy()):
        pos, value = brightest_near(out, p)
        assert np.linalg.norm(pos - p) <= 1.5
        # output point i is the mirror of input point flip_perm[i]: it carries that dot
        assert value == brightest_near(img, GRID[SCHEMA.flip_perm[i]])[1], (i, value)
    # the left column stays "left": x of point 0 < x of point 2 before and after
    assert kp[0, 0] < kp[2, 0] and kp0[0, 0] < kp0[2, 0]


def test_flip_probability_and_scale_together():
    img = dots(GRID)
    aug = TrainAugment(SCHEMA, 96, 96, flip_p=0.5, randaug_n=0)
    flips = 0
    for seed in SEEDS:
        _, flip, _ = aug.draw(gen(seed))
        flips += flip
        out, kp = aug(img, torch.from_numpy(GRID.astype(np.float32)), gen(seed))
        check_dots(out, kp, centroid_tol=0.1, min_checked=4)
    assert 5 <= flips <= 25


def test_ibug68_flip_keeps_left_right_semantics():
    # synthetic frontal layout: every point and its mirror partner placed symmetrically
    rng = np.random.default_rng(1)
    pts = np.zeros((68, 2))
    perm = np.asarray(IBUG68.flip_perm)
    for i in range(68):
        j = perm[i]
        if j < i:
            continue
        x, y = rng.uniform(15, 40), rng.uniform(15, 80)
        if i == j:  # on the symmetry axis
            pts[i] = (47.5, y)
        else:  # i is on the image left (subject's right side in iBUG order)
            pts[i], pts[j] = (x, y), (95 - x, y)
    aug = TrainAugment(IBUG68, 96, 96, scale_min=1.0, scale_max=1.0, flip_p=1.0, randaug_n=0)
    _, kp = aug(torch.zeros(3, 96, 96, dtype=torch.uint8), torch.from_numpy(pts.astype(np.float32)), gen(0))
    kp = kp.numpy()
    # 36 is still the outer corner of the eye on the image left, 45 the one on the right
    assert kp[36, 0] < kp[45, 0]
    np.testing.assert_allclose(kp[36], [95 - pts[45, 0], pts[45, 1]], atol=1e-4)
    np.testing.assert_allclose(kp, IBUG68.flip_coords(pts, 96), atol=1e-4)
    # a symmetric face flips onto itself
    np.testing.assert_allclose(kp, pts, atol=1e-4)


def test_points_outside_keep_their_coordinates():
    kp0 = torch.tensor([[5.0, 40.0], [90.0, 50.0]])
    out, kp = apply_op(dots(kp0.numpy()), kp0, "TranslateX", 43.0)
    np.testing.assert_allclose(kp.numpy(), [[48.0, 40.0], [133.0, 50.0]])  # 133 > 95: not clipped
    _, kp = apply_op(dots(kp0.numpy()), kp0, "TranslateY", -60.5)
    np.testing.assert_allclose(kp.numpy(), [[5.0, -20.0], [90.0, -10.0]])  # int(magnitude), like torchvision
    aug = TrainAugment(SCHEMA, 96, 96, scale_min=2.0, scale_max=2.0, flip_p=0.0, randaug_n=0)
    _, kp = aug(dots(GRID), torch.tensor([[0.0, 0.0], [95.0, 95.0]] + [[47.5, 47.5]] * 7), gen(0))
    np.testing.assert_allclose(kp[:2].numpy(), [[-47.5, -47.5], [142.5, 142.5]], atol=1e-4)


# --------------------------------------------------------------------- agreement with torchvision

def test_randaug_tables_match_torchvision():
    from torchvision.transforms.v2 import RandAugment
    space = getattr(RandAugment, "_AUGMENTATION_SPACE", None)
    if space is None:
        pytest.skip("torchvision's RandAugment table is not inspectable")
    assert tuple(space) == RANDAUG_OPS
    assert set(GEOMETRIC_OPS) | set(PHOTOMETRIC_OPS) | {"Identity"} == set(RANDAUG_OPS)
    for op, (fn, signed) in space.items():
        ref = fn(31, 96, 80)
        mine, mine_signed = randaug_magnitudes(op, 31, 96, 80)
        assert signed == mine_signed
        assert (ref is None) == (mine is None)
        if ref is not None:
            assert torch.equal(ref, mine), op


@pytest.mark.parametrize("op", GEOMETRIC_OPS)
def test_geometric_op_matches_torchvision(op):
    """Images as torchvision's own kernels warp them (+-1 away from the border); keypoints as
    torchvision's keypoint kernels with the pivot corrected to the image's pixel centre."""
    if not hasattr(TF, "affine_keypoints"):
        pytest.skip("torchvision without keypoint kernels")
    rng = np.random.default_rng(0)
    img = torch.from_numpy(rng.integers(0, 256, (3, 96, 96)).astype(np.uint8))
    img = TF.gaussian_blur_image(img, [7, 7], [2.0, 2.0])  # smooth, so interpolation differences stay small
    pts = torch.from_numpy(rng.uniform(0, 95, (20, 2)).astype(np.float32))
    bil = InterpolationMode.BILINEAR
    ones = torch.full((1, 96, 96), 255, dtype=torch.uint8)
    for value in (0.3, -0.17) if op.startswith("Shear") else (30.0, -7.0) if op == "Rotate" else (10.2, -43.5):
        out, kp = apply_op(img, pts, op, value)
        if op.startswith("Shear"):
            deg = math.degrees(math.atan(value))
            shear = [deg, 0.0] if op == "ShearX" else [0.0, deg]
            ref = TF.affine_image(img, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, interpolation=bil,
                                  fill=0, center=[0, 0])
            ref_kp = TF.affine_keypoints(pts, canvas_size=(96, 96), angle=0.0, translate=[0, 0], scale=1.0,
                                         shear=shear, center=[-0.5, -0.5])[0]
        elif op == "Rotate":
            ref = TF.rotate_image(img, angle=value, interpolation=bil, fill=0)
            ref_kp = TF.rotate_keypoints(pts, canvas_size=(96, 96), angle=value, center=[47.5, 47.5])[0]
        else:
            t = [int(value), 0] if op == "TranslateX" else [0, int(value)]
            ref = TF.affine_image(img, angle=0.0, translate=t, scale=1.0, shear=[0.0, 0.0], interpolation=bil, fill=0)
            ref_kp = TF.affine_keypoints(pts, canvas_size=(96, 96), angle=0.0, translate=t, scale=1.0,
                                         shear=[0.0, 0.0], center=[47.5, 47.5])[0]
        torch.testing.assert_close(kp, ref_kp, rtol=0, atol=1e-3)
        # compare where the whole 5x5 neighbourhood comes from inside the source image
        inside = apply_op(ones, torch.zeros(0, 2), op, value)[0][0] == 255
        inside = torch.nn.functional.max_pool2d((~inside).float()[None], 5, 1, 2)[0] == 0
        diff = (out.int() - ref.int()).abs()[:, inside]
        assert inside.sum() > 1000 and int(diff.max()) <= 1, (op, value)


@pytest.mark.parametrize("channels", [3, 1])
def test_fast_photometric_equals_torchvision(channels):
    ra = KeypointRandAugment(2, 7)
    rng = np.random.default_rng(channels)
    for trial in range(4):
        img = torch.from_numpy(rng.integers(0, 256, (channels, 40, 40)).astype(np.uint8))
        if trial % 2:
            img = (img // 4 + 60).to(torch.uint8)  # low contrast, narrow histogram
        for op in PHOTOMETRIC_OPS:
            for m in (0, 7, 20, 30):
                ra.magnitude = m
                ra._table.clear()
                v, signed = ra.value(op, 40, 40)
                v = 0.0 if v is None else v
                for sv in (v, -v) if signed else (v,):
                    fast = photometric(img, op, sv, fast=True)
                    ref = photometric(img, op, sv, fast=False)
                    assert fast.dtype == torch.uint8 and torch.equal(fast, ref), (op, m, sv)


# --------------------------------------------------------------------- photometric ops

@pytest.mark.parametrize("op", PHOTOMETRIC_OPS)
def test_photometric_op_leaves_keypoints(op):
    img = dots(GRID)
    img[0] = (img[0].int() * 3 // 4).to(torch.uint8)  # some colour, so Color does something
    kp0 = torch.from_numpy(GRID.astype(np.float32))
    changed = 0
    for seed in range(10):
        value = random_op_value(op, gen(seed))
        out, kp = apply_op(img, kp0, op, value)
        assert torch.equal(kp, kp0)
        assert out.shape == img.shape and out.dtype == torch.uint8
        changed += int(not torch.equal(out, img))
        if op != "Solarize":  # the others keep the dots the brightest spots
            check_dots(out, kp, min_checked=9)
    assert changed >= 1


# --------------------------------------------------------------------- the full augmentation

@pytest.mark.parametrize("channels", [3, 1])
def test_train_augment_full_moves_dots(channels):
    img = dots(GRID, channels=channels)
    kp0 = torch.from_numpy(GRID.astype(np.float32))
    aug = TrainAugment(SCHEMA, 96, 96)  # defaults: scale 0.75..4/3, flip 0.5, RandAugment(2, 7)
    geometric = checked = 0
    for seed in range(40):
        out, kp = aug(img, kp0, gen(seed))
        assert out.dtype == torch.uint8 and out.shape == (channels, 96, 96)
        assert kp.dtype == torch.float32 and kp.shape == (9, 2)
        ops = [op for op, _ in aug.draw(gen(seed))[2]]
        if "Solarize" in ops:  # may turn the (brightened) dots dark: nothing to find
            continue
        check_dots(out, kp, min_checked=3)
        checked += 1
        geometric += any(op in GEOMETRIC_OPS for op in ops)
    assert checked >= 30 and geometric >= 10  # RandAugment's geometric ops were exercised


def test_train_augment_cache_differs_from_input():
    pts = GRID * 128 / 96
    img = dots(pts, 128, sigma=1.6)
    aug = TrainAugment(SCHEMA, 128, 96)
    for seed in SEEDS:
        out, kp = aug(img, torch.from_numpy(pts.astype(np.float32)), gen(seed))
        assert out.shape == (3, 96, 96)
        if all(op != "Solarize" for op, _ in aug.draw(gen(seed))[2]):
            check_dots(out, kp, min_checked=3)


def test_same_seed_same_output():
    img = dots(GRID)
    kp0 = torch.from_numpy(GRID.astype(np.float32))
    aug = TrainAugment(SCHEMA, 96, 96, randaug_n=3, randaug_m=12)

    def batch(g=None):
        outs = [aug(img, kp0, g) for _ in range(16)]
        return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])

    a, b = batch(gen(5)), batch(gen(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = batch(gen(6))
    assert not torch.equal(a[0], c[0])
    # without a generator: torch's global RNG
    torch.manual_seed(11)
    d = batch()
    torch.manual_seed(11)
    e = batch()
    assert torch.equal(d[0], e[0]) and torch.equal(d[1], e[1])
    # a passed generator leaves the global RNG alone
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    batch(gen(1))
    assert torch.equal(before, torch.random.get_rng_state())


def test_zero_ops_and_validation():
    img = dots(GRID)
    aug = TrainAugment(SCHEMA, 96, 96, randaug_n=0)
    assert aug.draw(gen(0))[2] == []
    with pytest.raises(ValueError):
        TrainAugment(SCHEMA, 96, 96, scale_min=1.5, scale_max=1.0)
    with pytest.raises(ValueError):
        KeypointRandAugment(2, 31)
    with pytest.raises(ValueError):
        aug(dots(GRID, 64), torch.zeros(9, 2))  # not cache_size
    out, kp = TrainAugment(SCHEMA, 96, 96)(img, torch.zeros(0, 2), gen(0))
    assert out.shape == (3, 96, 96) and kp.shape == (0, 2)


def test_from_config_uses_train_section():
    from pipeline.core.config import load_config
    from pipeline.core.params_schema import DEFAULTS
    cfg = load_config(None, ["model.input_size=64", "train.randaug_n=1", "train.flip=0.0"])
    aug = TrainAugment.from_config(IBUG68, 96, cfg)
    assert aug.input_size == 64 and aug.randaug.num_ops == 1 and aug.flip_p == 0.0
    assert aug.randaug.magnitude == DEFAULTS.train.randaug_m
    out, kp = aug(torch.zeros(3, 96, 96, dtype=torch.uint8), torch.rand(68, 2) * 95, gen(0))
    assert out.shape == (3, 64, 64) and kp.shape == (68, 2)


def test_op_matrix_is_none_for_photometric():
    for op in PHOTOMETRIC_OPS + ("Identity",):
        assert op_matrix(op, 0.5, 96, 96) is None
    for op in GEOMETRIC_OPS:
        assert op_matrix(op, 0.0, 96, 96) is not None


def test_rotation_turns_dots_about_the_centre_within_the_range():
    """train.rotate: the dots (pixels) and keypoints turn together about the image centre by
    an angle within [-rotate, rotate]; rotate 0 draws exactly what it drew before (same ops,
    same scale and flip from the same generator)."""
    img = dots(GRID)
    kp0 = torch.from_numpy(GRID.astype(np.float32))
    aug = TrainAugment(SCHEMA, 96, 96, scale_min=1.0, scale_max=1.0, flip_p=0.0, randaug_n=0, rotate=25.0)
    c = (96 - 1) / 2
    angles = []
    for seed in SEEDS:
        out, kp = aug(img, kp0, gen(seed))
        check_dots(out, kp, centroid_tol=0.1, min_checked=4)
        (op, angle), = aug.draw(gen(seed))[2]
        assert op == "Rotate" and -25.0 <= angle <= 25.0
        d0, d = GRID - c, kp.numpy() - c
        np.testing.assert_allclose(np.linalg.norm(d, axis=1), np.linalg.norm(d0, axis=1), atol=1e-3)
        angles.append(angle)
    assert max(angles) - min(angles) > 10  # not one fixed angle
    off = TrainAugment(SCHEMA, 96, 96, randaug_n=2, rotate=0.0)
    for seed in SEEDS:  # one uniform for scale, one for flip, two per RandAugment op: no more
        u = torch.rand(2 + 2 * 2, generator=gen(seed)).tolist()
        _, flip, ops = off.draw(gen(seed))
        assert flip == (u[1] < 0.5) and ops == off.randaug.ops_from_uniforms(u[2:], 96, 96)


def test_erase_fills_one_rectangle_with_one_grey_and_keeps_every_label():
    """train.erase: the sample equals the erase-0 sample of the same seed (the erase draws
    come after every other draw) but for one axis-aligned rectangle of one grey level, of
    2-33% of the image's area; keypoints unchanged; erase 0 leaves the generator where it was."""
    img = torch.randint(0, 256, (3, 96, 96), dtype=torch.uint8, generator=gen(0))
    kp0 = torch.from_numpy(GRID.astype(np.float32))
    plain = TrainAugment(SCHEMA, 96, 96, randaug_n=2, rotate=10.0)
    erased = TrainAugment(SCHEMA, 96, 96, randaug_n=2, rotate=10.0, erase=1.0)
    areas = []
    for seed in SEEDS:
        want, want_kp = plain(img, kp0, gen(seed))
        out, kp = erased(img, kp0, gen(seed))
        assert torch.equal(kp, want_kp)
        changed = (out != want).any(dim=0)  # (H, W)
        rows, cols = torch.nonzero(changed.any(dim=1)).flatten(), torch.nonzero(changed.any(dim=0)).flatten()
        top, bottom, left, right = int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1
        block = out[:, top:bottom, left:right]
        assert (block == block[0, 0, 0]).all()  # one grey over the whole rectangle
        outside = torch.ones_like(changed)
        outside[top:bottom, left:right] = False
        assert not changed[outside].any()
        areas.append((bottom - top) * (right - left) / 96 ** 2)
    assert all(0.015 <= a <= 0.34 for a in areas) and max(areas) > 2 * min(areas)
    g, h = gen(0), gen(0)
    plain(img, kp0, g)
    plain.draw(h)
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=h))  # erase 0: no draw beyond draw()'s
    never = TrainAugment(SCHEMA, 96, 96, randaug_n=2, erase=0.0)
    assert torch.equal(never(img, kp0, gen(1))[0], TrainAugment(SCHEMA, 96, 96, randaug_n=2)(img, kp0, gen(1))[0])
