"""Scale/shift TTA (predict.tta_jitter): each view is mapped back exactly, on the flip's
pixel-centre convention."""

import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.inference.tta import predict_crops
from pipeline.keypoints.preprocess import MEAN, STD
from pipeline.keypoints.views import jitter_views, unwarp_coords, warp_view

S = 32
TARGETS = torch.tensor([[10.0, 12.0], [16.3, 15.5], [21.7, 9.2], [15.5, 15.5], [8.0, 22.4]])  # content coords


class FindContent(torch.nn.Module):
    """A keypoint-equivariant model: channels 0 and 1 of the face hold each pixel's own
    column and row, so any view of it shows an affine field p -> (where the content at p
    came from); the model reads that field at three pixels near the centre, solves for the
    affine map and answers where the content points TARGETS lie in what it sees. Bilinear
    sampling reproduces an affine field exactly, so the answer is exact on every view."""

    def forward(self, x):
        b, _, h, w = x.shape
        field = torch.stack([x[:, i] * STD[i] + MEAN[i] for i in (0, 1)], 1) * 255  # (B, 2, H, W) content px
        cy, cx = h // 2, w // 2
        p0, px, py = field[:, :, cy, cx], field[:, :, cy, cx + 4], field[:, :, cy + 4, cx]  # (B, 2)
        m = torch.stack([(px - p0) / 4, (py - p0) / 4], -1)  # (B, 2, 2): d content / d (x, y)
        offset = p0 - (m @ torch.tensor([float(cx), float(cy)]))  # content = m @ p + offset
        q = TARGETS[None].expand(b, -1, -1) - offset[:, None, :]  # (B, K, 2)
        return torch.linalg.solve(m[:, None], q[..., None])[..., 0]


def coordinate_faces(n=2):
    faces = np.zeros((n, S, S, 3), np.uint8)
    faces[..., 0] = np.arange(S)[None, None, :]
    faces[..., 1] = np.arange(S)[None, :, None]
    faces[..., 2] = 90
    return faces


@pytest.mark.parametrize("flip_perm", [None, list(range(len(TARGETS)))], ids=["noflip", "flip"])
def test_jitter_of_an_equivariant_model_equals_no_jitter(flip_perm):
    faces = coordinate_faces()
    kw = dict(input_size=S, in_chans=3, flip_perm=flip_perm)
    plain = predict_crops(FindContent(), faces, **kw)
    jit = predict_crops(FindContent(), faces, jitter=jitter_views(0.1), **kw)
    np.testing.assert_allclose(plain["plain"], TARGETS.numpy()[None].repeat(2, 0), atol=1e-3)
    np.testing.assert_allclose(jit["tta"], plain["plain"], atol=1e-3)
    np.testing.assert_allclose(jit["plain"], plain["plain"], atol=1e-6)  # "plain" stays the unjittered view
    # each single view too, not only their mean (errors could cancel)
    for v in jitter_views(0.1):
        one = predict_crops(FindContent(), faces, jitter=[v], **kw)["tta"]
        np.testing.assert_allclose(one, plain["plain"], atol=1e-3, err_msg=str(v))


def test_a_shape_blind_model_shows_each_view_mapped_back():
    # a model that answers the same input pixel whatever it sees: its answer on view v maps
    # back to unwarp(c, v), so the TTA mean is the mean of those (and differs from plain)
    c = torch.tensor([[5.0, 7.0], [20.0, 26.0]])

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return c.expand(x.shape[0], -1, -1)

    views = jitter_views(0.2)
    out = predict_crops(Fixed(), np.zeros((3, S, S, 3), np.uint8), input_size=S, in_chans=3, flip_perm=None,
                        jitter=views)
    want = torch.stack([c] + [unwarp_coords(c, v, S, S) for v in views]).mean(0).numpy()
    np.testing.assert_allclose(out["tta"], want[None].repeat(3, 0), atol=1e-5)
    assert np.abs(out["tta"] - out["plain"]).max() > 0.02  # the views nearly cancel: zoom in and out, +- shift
    # the view map itself: zoom 1.2 about the centre (15.5) sends 5 -> 15.5 + 1.2 * (5 - 15.5)
    np.testing.assert_allclose(unwarp_coords(torch.tensor([[15.5 + 1.2 * (5 - 15.5), 15.5]]), (1.2, 0, 0), S, S),
                               [[5.0, 15.5]], atol=1e-5)


def test_warp_fills_outside_and_keeps_identity():
    x = torch.rand(1, 3, S, S)
    np.testing.assert_allclose(warp_view(x, (1.0, 0.0, 0.0)), x, atol=1e-5)
    fill = torch.tensor([-1.0, -2.0, -3.0])
    out = warp_view(x, (1.0, 0.5, 0.0), fill)  # shifted right by half the side: the left half is outside
    np.testing.assert_allclose(out[0, :, :, :S // 2 - 1], fill[:, None, None].expand(3, S, S // 2 - 1), atol=1e-6)
    assert jitter_views(0) == []


def test_tta_jitter_param_defaults_off_and_is_checked():
    assert load_config(None).predict.tta_jitter == 0.0
    with pytest.raises(PipelineError, match="tta_jitter"):
        load_config(None, ["predict.tta_jitter=0.9"])
