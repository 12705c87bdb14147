"""The embedded demo data set: synthetic drawn faces in exactly the competition layout
(JPEGs, `labels_ibug_300W_train.xml`, `labels_ibug_300W_test_parsed.xml`, `solution.csv`).

A template face of 68 points with iBUG semantics (the subject's right side on the image
left, so the flip permutation is right on it) is varied in shape and expression, turned
in depth (yaw) and in the image plane, scaled and placed in a cluttered photo, then lit,
blurred, noised and sometimes occluded. Faces of one seed are byte-identical."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import click
import cv2
import numpy as np

from pipeline.cli import config_options
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

TRAIN_XML = "labels_ibug_300W_train.xml"
TEST_XML = "labels_ibug_300W_test_parsed.xml"


def _template() -> tuple[np.ndarray, np.ndarray]:
    """(68, 2) points in a face frame (x right, y down, about [-1, 1]) and (68,) depths."""
    pts = np.zeros((68, 2))
    a = np.pi * np.arange(17) / 16
    pts[0:17] = np.stack([-0.9 * np.cos(a), -0.15 + 1.05 * np.sin(a)], 1)  # jaw, image-left ear -> chin -> right
    t = np.linspace(0, 1, 5)
    pts[17:22] = np.stack([-0.75 + 0.6 * t, -0.45 - 0.1 * np.sin(np.pi * t)], 1)  # brow on the image left
    pts[22:27] = np.stack([0.15 + 0.6 * t, -0.45 - 0.1 * np.sin(np.pi * t)], 1)
    pts[27:31] = np.stack([np.zeros(4), np.linspace(-0.3, 0.15, 4)], 1)  # nose bridge to tip
    pts[31:36] = [[-0.2, 0.25], [-0.1, 0.28], [0, 0.3], [0.1, 0.28], [0.2, 0.25]]  # nostrils
    pts[36:42] = [[-0.55, -0.25], [-0.47, -0.31], [-0.33, -0.31], [-0.25, -0.25], [-0.33, -0.2], [-0.47, -0.2]]
    pts[42:48] = [[0.25, -0.25], [0.33, -0.31], [0.47, -0.31], [0.55, -0.25], [0.47, -0.2], [0.33, -0.2]]
    pts[48:60] = [[-0.35, 0.5], [-0.22, 0.43], [-0.1, 0.4], [0, 0.42], [0.1, 0.4], [0.22, 0.43],
                  [0.35, 0.5], [0.22, 0.6], [0.1, 0.64], [0, 0.65], [-0.1, 0.64], [-0.22, 0.6]]
    pts[60:68] = [[-0.28, 0.5], [-0.1, 0.47], [0, 0.47], [0.1, 0.47], [0.28, 0.5], [0.1, 0.54],
                  [0, 0.55], [-0.1, 0.54]]
    z = np.zeros(68)
    z[0:17] = -0.4 * np.cos(a - np.pi / 2) ** 2  # ears lie behind the face plane
    z[17:27], z[36:48] = 0.15, 0.1
    z[27:31] = np.linspace(0.2, 0.45, 4)
    z[31:36] = [0.25, 0.32, 0.38, 0.32, 0.25]
    z[48:68] = 0.2
    return pts, z


TEMPLATE, DEPTH = _template()


def _shape(rng: np.random.Generator) -> np.ndarray:
    """A face's 68 points in the face frame: identity, expression, yaw."""
    p = TEMPLATE.copy()
    p[0:17, 0] *= rng.uniform(0.85, 1.1)  # jaw width
    p[0:17, 1] = -0.15 + (p[0:17, 1] + 0.15) * rng.uniform(0.9, 1.15)  # face length
    p[17:27, 1] -= rng.uniform(-0.05, 0.1)  # brows raised
    eye_open = rng.uniform(0.4, 1.4)
    for lo in (36, 42):
        c = p[lo:lo + 6, 1].mean()
        p[lo:lo + 6, 1] = c + (p[lo:lo + 6, 1] - c) * eye_open
    mouth_open = rng.uniform(0, 0.12)
    p[[65, 66, 67], 1] += mouth_open
    p[55:60, 1] += mouth_open
    p[48:68, 0] *= rng.uniform(0.85, 1.2)  # mouth width
    p += rng.normal(0, 0.012, p.shape)
    yaw = rng.uniform(-0.55, 0.55)
    p[:, 0] = p[:, 0] * np.cos(yaw) + DEPTH * np.sin(yaw)
    return p


def _clutter(rng, h, w) -> np.ndarray:
    """A photo background: colour gradient plus random shapes and lines."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = (xx * rng.uniform(-1, 1) + yy * rng.uniform(-1, 1)) / (w + h) + 0.5
    img = (c0 * (1 - t[..., None]) + c1 * t[..., None]).astype(np.uint8)
    for _ in range(rng.integers(6, 20)):
        col = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.integers(3)
        x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
        if kind == 0:
            cv2.rectangle(img, (x, y), (x + int(rng.integers(5, w // 3)), y + int(rng.integers(5, h // 3))), col, -1)
        elif kind == 1:
            cv2.circle(img, (x, y), int(rng.integers(3, w // 6)), col, -1)
        else:
            cv2.line(img, (x, y), (int(rng.integers(0, w)), int(rng.integers(0, h))), col, int(rng.integers(1, 5)))
    return img


def _draw_face(img: np.ndarray, pts: np.ndarray, rng: np.random.Generator, scale: float) -> None:
    """Draw the face whose landmarks (image px) are `pts` onto img."""
    ip = lambda idx: np.round(pts[list(idx)]).astype(np.int32)  # noqa: E731
    skin = np.array([rng.uniform(90, 230), rng.uniform(70, 200), rng.uniform(50, 180)])
    jaw = pts[0:17]
    top = np.stack([jaw[0], (jaw[0] + jaw[16]) / 2 + (pts[27] - pts[8]) * 0.55, jaw[16]])
    head = np.concatenate([jaw, cv2.approxPolyDP(top.astype(np.float32), 0, False).reshape(-1, 2)[::-1][1:-1]])
    cv2.fillPoly(img, [np.round(head).astype(np.int32)], tuple(int(v) for v in skin))
    hair = tuple(int(v) for v in rng.integers(0, 120, 3))
    cv2.polylines(img, [ip(range(0, 17))], False, tuple(int(v * 0.6) for v in skin), max(1, int(scale / 30)))
    lw = max(1, int(scale / 18))
    cv2.polylines(img, [ip(range(17, 22))], False, hair, lw)
    cv2.polylines(img, [ip(range(22, 27))], False, hair, lw)
    for lo in (36, 42):
        cv2.fillPoly(img, [ip(range(lo, lo + 6))], (235, 235, 235))
        c = pts[lo:lo + 6].mean(0)
        r = max(1, int(np.linalg.norm(pts[lo + 3] - pts[lo]) / 5))
        cv2.circle(img, tuple(int(v) for v in np.round(c)), r, tuple(int(v) for v in rng.integers(20, 110, 3)), -1)
        cv2.polylines(img, [ip(range(lo, lo + 6))], True, (30, 30, 30), 1)
    dark = tuple(int(v * 0.55) for v in skin)
    cv2.polylines(img, [ip(range(27, 31))], False, dark, max(1, lw // 2))
    cv2.polylines(img, [ip(range(31, 36))], False, dark, max(1, lw // 2))
    lip = (int(rng.uniform(120, 200)), int(rng.uniform(30, 90)), int(rng.uniform(40, 100)))
    cv2.fillPoly(img, [ip(range(48, 60))], lip)
    cv2.fillPoly(img, [ip(range(60, 68))], (40, 20, 20))


def render_face(seed_seq: list[int]) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float, float]]:
    """One photo: (RGB uint8 image, (68, 2) landmarks in pixels, detector-like box)."""
    rng = np.random.default_rng(seed_seq)
    h, w = int(rng.integers(200, 321)), int(rng.integers(200, 321))
    img = _clutter(rng, h, w)
    shape = _shape(rng)
    scale = rng.uniform(0.16, 0.3) * min(h, w)  # px per face unit (half the face width)
    ang = np.deg2rad(rng.uniform(-35, 35))
    rot = np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])
    centre = np.array([rng.uniform(0.35, 0.65) * w, rng.uniform(0.35, 0.65) * h])
    pts = shape @ rot.T * scale + centre
    _draw_face(img, pts, rng, scale)
    # lighting: a smooth multiplicative gradient across the photo
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    g = 1 + rng.uniform(-0.35, 0.35) * ((xx - w / 2) * np.cos(ang) + (yy - h / 2) * np.sin(ang)) / max(h, w)
    img = np.clip(img.astype(np.float32) * g[..., None] * rng.uniform(0.7, 1.2), 0, 255)
    if rng.random() < 0.25:  # occluder: a hand, hair or a microphone over part of the face
        c = pts[int(rng.integers(0, 68))]
        col = tuple(float(v) for v in rng.integers(0, 256, 3))
        axes = (int(scale * rng.uniform(0.2, 0.5)), int(scale * rng.uniform(0.15, 0.4)))
        cv2.ellipse(img, (int(c[0]), int(c[1])), axes, float(rng.uniform(0, 180)), 0, 360, col, -1)
    if rng.random() < 0.5:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.3, 1.5))
    img = img + rng.normal(0, rng.uniform(1, 10), img.shape)
    img = np.clip(img, 0, 255).astype(np.uint8)
    if rng.random() < 0.2:
        img = np.repeat(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)
    # the box a face detector would give: brows to chin, jittered in place and size
    lo, hi = pts.min(0), pts.max(0)
    size = hi - lo
    jitter = rng.normal(0, 0.07, 4)
    box = (lo[0] + jitter[0] * size[0], lo[1] + jitter[1] * size[1],
           size[0] * (1 + jitter[2]), size[1] * (1 + jitter[3]))
    return img, pts, tuple(float(round(v)) for v in box)


def _render_to(path: Path, seed_seq: list[int]):
    img, pts, box = render_face(seed_seq)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
    path.write_bytes(buf.tobytes())
    return pts, box


def _xml(name: str, entries: list[tuple[str, tuple, np.ndarray | None]]) -> str:
    lines = ["<?xml version='1.0' encoding='ISO-8859-1'?>", "<dataset>", f"<name>{name}</name>",
             "<comment>Synthetic demo faces, 68-point iBUG layout.</comment>", "<images>"]
    for rel, box, pts in entries:
        lines.append(f"  <image file='{rel}'>")
        b = f"top='{int(box[1])}' left='{int(box[0])}' width='{int(box[2])}' height='{int(box[3])}'"
        if pts is None:
            lines.append(f"    <box {b}/>")
        else:
            lines.append(f"    <box {b}>")
            lines += [f"      <part name='{i:02d}' x='{x:.2f}' y='{y:.2f}'/>" for i, (x, y) in enumerate(pts)]
            lines.append("    </box>")
        lines.append("  </image>")
    lines += ["</images>", "</dataset>", ""]
    return "\n".join(lines)


def generate_demo(out_dir: str | os.PathLike, n_train: int, n_test: int, seed: int = 0, n_jobs: int = 2) -> Path:
    """Write the demo set into out_dir (built in a temp folder, then swapped in).

    Photo numbers are shared by two faces now and then (`<photo>_1`, `<photo>_2`), as in
    300-W, so that grouped folds have something to group."""
    from joblib import Parallel, delayed

    if n_train < 1 or n_test < 1:
        raise PipelineError("params.yaml", "demo.n_train and demo.n_test must be >= 1")
    out = Path(out_dir)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "images" / "train").mkdir(parents=True)
    (tmp / "images" / "test").mkdir(parents=True)
    names = {}
    for split, n in (("train", n_train), ("test", n_test)):
        rng = np.random.default_rng([seed, 7 if split == "train" else 11])
        photo, k, lst = 1000, 1, []
        for _ in range(n):
            lst.append(f"images/{split}/{photo}_{k}.jpg")
            if k == 1 and rng.random() < 0.15:
                k = 2  # the next face comes from the same photo
            else:
                photo, k = photo + int(rng.integers(1, 50)), 1
        names[split] = lst
    jobs = [(split, i, rel) for split in ("train", "test") for i, rel in enumerate(names[split])]
    res = Parallel(n_jobs=n_jobs, batch_size=16)(
        delayed(_render_to)(tmp / rel, [seed, 0 if split == "train" else 1, i]) for split, i, rel in jobs)
    train = [(rel, box, pts) for (split, _, rel), (pts, box) in zip(jobs, res) if split == "train"]
    test = [(rel, box, pts) for (split, _, rel), (pts, box) in zip(jobs, res) if split == "test"]
    (tmp / TRAIN_XML).write_text(_xml("Training faces", [(r, b, np.round(p, 2)) for r, b, p in train]))
    (tmp / TEST_XML).write_text(_xml("Test faces", [(r, b, None) for r, b, _ in test]))
    # the solution holds the same rounded values the train XML would show
    vals = np.concatenate([np.round(p, 2).reshape(-1) for _, _, p in test])
    (tmp / "solution.csv").write_text("Id,Predicted\n" + "".join(f"{i},{v:.2f}\n" for i, v in enumerate(vals)))
    old = out.parent / f".{out.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


@click.command("demo-data")
@click.argument("out", default="data/demo")
@click.option("--n-train", type=int, default=None, help="training faces [demo.n_train]")
@click.option("--n-test", type=int, default=None, help="test faces [demo.n_test]")
@click.option("--seed", type=int, default=None, help="[demo.seed]")
@config_options
def demo_data_cmd(out, n_train, n_test, seed, cfg):
    """Write the synthetic demo data set in the competition layout to OUT."""
    d = cfg["demo"]
    n_train = d["n_train"] if n_train is None else n_train
    n_test = d["n_test"] if n_test is None else n_test
    seed = d["seed"] if seed is None else seed
    import time

    t0 = time.perf_counter()
    generate_demo(out, n_train, n_test, seed)
    log.info("demo data: %d train + %d test faces in %.1f s -> %s", n_train, n_test, time.perf_counter() - t0, out)
