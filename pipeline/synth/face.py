"""A synthetic face renderer: photos of drawn faces with exact 68-point truth.

`generate_demo(out_dir, n_train, n_test, seed)` writes

Every photo draws from its own `SeedSequence([seed, split, photo])` stream, so the same
seed gives the same pixels whatever the worker count."""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from pipeline.keypoints.schema import IBUG68

# the two splits draw from separate random streams
SPLITS = {"train": 0, "test": 1}


# --------------------------------------------------------------------------------------
# the 3-D template (x to the image right, y down, z towards the camera; jaw width ~2)


def _half_template() -> dict[int, tuple[float, float, float]]:
    """Points on the image-left half and the midline; the rest is their mirror."""
    pts: dict[int, tuple[float, float, float]] = {}
    for i in range(9):  # jaw 0 (image-left ear) .. 8 (chin)
        phi = math.pi * i / 16
        x = -math.cos(phi) * (0.98 - 0.12 * math.sin(phi) ** 2)
        y = -0.22 + 1.42 * math.sin(phi) ** 0.85
        z = 0.12 - 0.42 * abs(math.cos(phi))
        pts[i] = (x, y, z)
    for j in range(5):  # image-left brow 17 (outer) .. 21 (inner)
        t = j / 4
        pts[17 + j] = (-0.80 + 0.62 * t, -0.56 - 0.11 * math.sin(math.pi * (0.25 + 0.75 * t)) + 0.03 * t,
                       0.18 + 0.10 * t)
    for j, y in enumerate((-0.36, -0.18, 0.0, 0.20)):  # bridge 27..30 (tip)
        pts[27 + j] = (0.0, y, 0.30 + 0.32 * (j / 3))
    for idx, x, y, z in ((31, -0.21, 0.33, 0.34), (32, -0.11, 0.36, 0.40), (33, 0.0, 0.38, 0.44)):
        pts[idx] = (x, y, z)
    # image-left eye: 36 outer, 37 38 upper lid, 39 inner, 40 41 lower lid (inner->outer)
    for idx, x, y in ((36, -0.60, -0.27), (37, -0.49, -0.34), (38, -0.34, -0.34), (39, -0.22, -0.26),
                      (40, -0.34, -0.21), (41, -0.49, -0.21)):
        pts[idx] = (x, y, 0.16 - 0.10 * (abs(x) - 0.22) / 0.38)
    # outer lip: 48 corner, 49 50 upper (to the midline 51); lower 58 59 (57 midline)
    for idx, x, y, z in ((48, -0.38, 0.69, 0.22), (49, -0.25, 0.61, 0.30), (50, -0.11, 0.57, 0.35),
                         (51, 0.0, 0.59, 0.36), (57, 0.0, 0.86, 0.33), (58, -0.13, 0.85, 0.31),
                         (59, -0.26, 0.80, 0.27)):
        pts[idx] = (x, y, z)
    # inner lip: 60 corner, 61 upper, 62 midline; lower 66 midline, 67
    for idx, x, y, z in ((60, -0.31, 0.69, 0.24), (61, -0.11, 0.655, 0.31), (62, 0.0, 0.66, 0.32),
                         (66, 0.0, 0.70, 0.32), (67, -0.11, 0.695, 0.31)):
        pts[idx] = (x, y, z)
    return pts


def _template() -> np.ndarray:
    half = _half_template()
    perm = IBUG68.flip_perm
    out = np.full((68, 3), np.nan)
    for i, p in half.items():
        out[i] = p
        j = perm[i]
        if j != i:
            out[j] = (-p[0], p[1], p[2])
        else:
            out[i, 0] = 0.0  # the midline, exactly
    assert not np.isnan(out).any()
    return out


TEMPLATE = _template()  # (68, 3)
# extra points for drawing only: forehead arc (ear -> top -> ear) and the ears
_FOREHEAD = np.array([(-math.cos(a) * 0.97, -0.22 - 0.95 * math.sin(a) ** 0.9, 0.10 - 0.35 * abs(math.cos(a)))
                      for a in np.linspace(0.0, math.pi, 13)])


def _rot3(yaw: float, pitch: float) -> np.ndarray:
    cy, sy, cp, sp = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rx = np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])
    return rx @ ry


# --------------------------------------------------------------------------------------
# drawing


def _poly(points: np.ndarray) -> np.ndarray:
    return np.round(points).astype(np.int32).reshape(-1, 1, 2)


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    low = rng.integers(30, 221, size=(int(rng.integers(2, 6)), int(rng.integers(2, 6)), 3), dtype=np.uint8)
    img = cv2.resize(low, (w, h), interpolation=cv2.INTER_LINEAR)
    for _ in range(int(rng.integers(8, 26))):
        col = tuple(int(c) for c in rng.integers(0, 256, 3))
        kind = rng.integers(0, 5)
        x, y = int(rng.integers(-20, w)), int(rng.integers(-20, h))
        if kind == 0:
            cv2.rectangle(img, (x, y), (x + int(rng.integers(5, w // 2)), y + int(rng.integers(5, h // 2))), col,
                          -1 if rng.random() < 0.6 else int(rng.integers(1, 4)))
        elif kind == 1:
            cv2.circle(img, (x, y), int(rng.integers(3, w // 5)), col, -1 if rng.random() < 0.6 else 2, cv2.LINE_AA)
        elif kind == 2:
            cv2.line(img, (x, y), (int(rng.integers(0, w)), int(rng.integers(0, h))), col,
                     int(rng.integers(1, 5)), cv2.LINE_AA)
        elif kind == 3:
            cv2.ellipse(img, (x, y), (int(rng.integers(4, w // 4)), int(rng.integers(4, h // 4))),
                        float(rng.uniform(0, 180)), 0, 360, col, -1, cv2.LINE_AA)
        else:
            pts = np.stack([rng.integers(0, w, 5), rng.integers(0, h, 5)], 1)
            cv2.polylines(img, [_poly(pts)], False, col, int(rng.integers(1, 3)), cv2.LINE_AA)
    if rng.random() < 0.5:
        img = cv2.GaussianBlur(img, (0, 0), float(rng.uniform(0.5, 2.0)))
    return img


def _face_geometry(rng: np.random.Generator, centre: tuple[float, float], width_px: float, roll: float):
    """Random identity, expression and pose -> (68, 2) integer keypoints, drawing extras."""
    tpl = TEMPLATE.copy()
    # identity: group-wise shifts and scales, then a little per-point noise
    tpl[:, 0] *= rng.uniform(0.88, 1.08)
    tpl[:, 1] *= rng.uniform(0.92, 1.10)
    eye_sep, eye_h = rng.uniform(-0.05, 0.05), rng.uniform(0.7, 1.4)
    for side in (range(36, 42), range(42, 48)):
        idx = list(side)
        c = tpl[idx].mean(0)
        tpl[idx, 1] = c[1] + (tpl[idx, 1] - c[1]) * eye_h
        tpl[idx, 0] += eye_sep * np.sign(c[0])
    tpl[17:27, 1] += rng.uniform(-0.07, 0.05)  # brow height
    tpl[27:36, 1] *= rng.uniform(0.9, 1.1)  # nose length
    mouth = list(range(48, 68))
    mc = tpl[mouth].mean(0)
    tpl[mouth, 0] = mc[0] + (tpl[mouth, 0] - mc[0]) * rng.uniform(0.8, 1.25)
    tpl[mouth, 1] += rng.uniform(-0.05, 0.05)
    # expression: mouth opening, smile (corners up)
    opening = rng.uniform(0.0, 0.22) if rng.random() < 0.5 else 0.0
    tpl[[55, 56, 57, 58, 59, 65, 66, 67], 1] += opening
    smile = rng.uniform(-0.03, 0.07)
    tpl[[48, 54, 60, 64], 1] -= smile
    tpl[:, :2] += rng.normal(0, 0.012, size=(68, 2))
    # pose: yaw / pitch by a 3-D rotation (asymmetric foreshortening), then roll in-plane
    yaw = math.radians(rng.uniform(-32, 32))
    pitch = math.radians(rng.uniform(-14, 14))
    r3 = _rot3(yaw, pitch)
    proj = (tpl @ r3.T)[:, :2]
    forehead = (_FOREHEAD @ r3.T)[:, :2]
    ca, sa = math.cos(roll), math.sin(roll)
    r2 = np.array([[ca, -sa], [sa, ca]])
    s = width_px / 2.0
    off = np.asarray(centre) - 0.45 * s * (r2 @ np.array([0.0, 1.0]))  # template origin above centre

    def place(p: np.ndarray) -> np.ndarray:
        return p @ r2.T * s + off

    kp = np.round(place(proj))  # integer pixel labels, as annotators give; drawn exactly
    return kp, place(forehead), s, yaw, opening


def _draw_face(img: np.ndarray, rng: np.random.Generator, kp: np.ndarray, forehead: np.ndarray, s: float,
               yaw: float, opening: float) -> None:
    if rng.random() < 0.85:  # skin tones: R > G > B, light to dark
        r = rng.uniform(90, 245)
        g = r * rng.uniform(0.62, 0.88)
        skin: tuple[float, ...] = (g * rng.uniform(0.65, 0.95), g, r)  # BGR
    else:  # painted / oddly lit faces
        skin = tuple(float(c) for c in rng.uniform(40, 240, 3))
    dark = tuple(float(c) for c in np.array(skin) * rng.uniform(0.35, 0.6))
    hair = tuple(int(c) for c in rng.integers(0, 120, 3))
    aa = cv2.LINE_AA
    t = max(1, int(round(s * 0.035)))
    jaw = kp[0:17]
    # hair behind / above the head, neck below
    if rng.random() < 0.75:
        hair_poly = np.concatenate([forehead[::-1] * 1.0 + (forehead[::-1] - forehead.mean(0)) * 0.18,
                                    jaw[[0]], jaw[[16]]])
        cv2.fillPoly(img, [_poly(hair_poly)], hair, aa)
    neck_w = np.linalg.norm(jaw[12] - jaw[4]) * 0.36
    down = (jaw[8] - forehead[6]) / (np.linalg.norm(jaw[8] - forehead[6]) + 1e-6)
    across = np.array([-down[1], down[0]])
    nb = jaw[8] - down * s * 0.3
    neck = np.array([nb + across * neck_w, nb - across * neck_w, nb - across * neck_w * 1.2 + down * s * 1.2,
                     nb + across * neck_w * 1.2 + down * s * 1.2])
    cv2.fillPoly(img, [_poly(neck)], dark, aa)
    # ears on the side that faces the camera more
    for i_ear, sign in ((1, -1), (15, 1)):
        if rng.random() < 0.7 and (sign * yaw) < 0.35:
            out = jaw[i_ear] + (jaw[i_ear] - kp[30]) * 0.1
            cv2.ellipse(img, tuple(int(v) for v in np.round(out)), (max(2, int(s * 0.1)), max(3, int(s * 0.2))),
                        math.degrees(math.atan2(down[1], down[0])) - 90, 0, 360, skin, -1, aa)
    # face: skin polygon bounded by the jaw and the forehead arc, jaw line drawn darker
    face_poly = np.concatenate([jaw, forehead[::-1][1:-1]])
    cv2.fillPoly(img, [_poly(face_poly)], skin, aa)
    cheek = kp[2] * 0.6 + kp[31] * 0.4, kp[14] * 0.6 + kp[35] * 0.4
    if rng.random() < 0.5:
        blush = tuple(float(c) for c in np.array(skin) * np.array([0.85, 0.85, 1.1]))
        for c in cheek:
            cv2.circle(img, tuple(int(v) for v in np.round(c)), max(2, int(s * 0.15)), blush, -1, aa)
    cv2.polylines(img, [_poly(jaw)], False, dark, t, aa)
    # brows
    brow_col = hair if rng.random() < 0.8 else dark
    bt = max(1, int(round(s * rng.uniform(0.04, 0.09))))
    cv2.polylines(img, [_poly(kp[17:22])], False, brow_col, bt, aa)
    cv2.polylines(img, [_poly(kp[22:27])], False, brow_col, bt, aa)
    # eyes: sclera polygon, iris, lid outline
    iris_col = tuple(int(c) for c in rng.integers(10, 140, 3))
    gaze = rng.uniform(-0.2, 0.2, 2)
    for idx in (list(range(36, 42)), list(range(42, 48))):
        e = kp[idx]
        cv2.fillPoly(img, [_poly(e)], (235, 235, 240), aa)
        c = e.mean(0) + gaze * (e[3] - e[0]) * np.array([1, 0.3])
        r = max(1, int(round(0.35 * np.linalg.norm(e[3] - e[0]))))
        r = min(r, max(1, int(round(0.6 * np.linalg.norm(e[1] - e[5]) + 1))))
        cv2.circle(img, tuple(int(v) for v in np.round(c)), r, iris_col, -1, aa)
        cv2.circle(img, tuple(int(v) for v in np.round(c)), max(1, r // 2), (10, 10, 10), -1, aa)
        cv2.polylines(img, [_poly(e)], True, (25, 25, 30), max(1, t - 1), aa)
        cv2.polylines(img, [_poly(e[0:4])], False, (20, 20, 20), t, aa)  # upper lid heavier
    # nose: bridge shadow, nostril curve, nostrils
    cv2.polylines(img, [_poly(kp[27:31])], False, dark, max(1, t - 1), aa)
    cv2.polylines(img, [_poly(np.concatenate([kp[[31]] - (kp[[33]] - kp[[30]]) * 0.4, kp[31:36],
                                              kp[[35]] - (kp[[33]] - kp[[30]]) * 0.4]))],
                  False, dark, t, aa)
    for i in (32, 34):
        cv2.circle(img, tuple(int(v) for v in kp[i]), max(1, int(s * 0.03)), (20, 20, 30), -1, aa)
    # mouth: outer lip polygon, inner opening
    lip = tuple(float(c) for c in np.array(skin) * np.array([0.6, 0.55, 1.0]) * rng.uniform(0.7, 1.0))
    cv2.fillPoly(img, [_poly(kp[48:60])], lip, aa)
    inner = kp[60:68]
    if opening > 0.03:
        cv2.fillPoly(img, [_poly(inner)], (25, 20, 40), aa)
        if rng.random() < 0.6:  # teeth: the upper 40 % of the opening
            lower = kp[60:65] * 0.6 + kp[[60, 67, 66, 65, 64]] * 0.4
            cv2.fillPoly(img, [_poly(np.concatenate([kp[60:65], lower[::-1]]))], (220, 220, 225), aa)
    cv2.polylines(img, [_poly(inner)], True, (30, 20, 50), max(1, t - 1), aa)
    cv2.polylines(img, [_poly(kp[48:60])], True, tuple(c * 0.7 for c in lip), 1, aa)


def _occlude(img: np.ndarray, rng: np.random.Generator, kp: np.ndarray, s: float) -> None:
    col = tuple(int(c) for c in rng.integers(0, 256, 3))
    kind = rng.integers(0, 3)
    if kind == 0:  # sunglasses bar
        a, b = kp[36], kp[45]
        d = (b - a) / (np.linalg.norm(b - a) + 1e-6)
        n = np.array([-d[1], d[0]]) * s * 0.12
        bar = np.array([a - d * s * 0.1 + n, b + d * s * 0.1 + n, b + d * s * 0.1 - n, a - d * s * 0.1 - n])
        cv2.fillPoly(img, [_poly(bar)], (int(col[0]) // 4, int(col[1]) // 4, int(col[2]) // 4), cv2.LINE_AA)
    else:  # a hand / object blob over some keypoint
        c = kp[int(rng.integers(0, 68))] + rng.normal(0, s * 0.2, 2)
        ax = (max(3, int(s * rng.uniform(0.15, 0.4))), max(3, int(s * rng.uniform(0.15, 0.4))))
        if kind == 1:
            cv2.ellipse(img, tuple(int(v) for v in c), ax, float(rng.uniform(0, 180)), 0, 360, col, -1, cv2.LINE_AA)
        else:
            cv2.rectangle(img, tuple(int(v) for v in c - ax), tuple(int(v) for v in c + ax), col, -1)


def _detector_box(rng: np.random.Generator, kp: np.ndarray) -> tuple[int, int, int, int]:
    """Keypoint extent, top stretched above the brows (as 300-W's detector boxes), each edge
    jittered by a few % of the size: (left, top, width, height) integers."""
    x0, x1 = kp[:, 0].min(), kp[:, 0].max()
    y1 = kp[:, 1].max()
    y0 = kp[17:27, 1].min()
    w, h = x1 - x0, y1 - y0
    y0 -= 0.12 * h
    h = y1 - y0
    j = np.clip(rng.normal(0, 0.04, 4), -0.1, 0.1)
    left, right = x0 + j[0] * w, x1 + j[1] * w
    top, bottom = y0 + j[2] * h, y1 + j[3] * h
    left, top = int(round(left)), int(round(top))
    return left, top, max(8, int(round(right - left))), max(8, int(round(bottom - top)))


_NOISE: list[np.ndarray] = []


def _noise_bank() -> np.ndarray:
    """(400, 400, 3) float32 standard normal noise, the same in every process."""
    if not _NOISE:
        _NOISE.append(np.random.default_rng(20240601).standard_normal((400, 400, 3), dtype=np.float32))
    return _NOISE[0]


def _finish(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Lighting gradient, blur, noise, colour or grayscale (grayscale stays 1-channel)."""
    h, w = img.shape[:2]
    ang = rng.uniform(0, 2 * math.pi)
    amp, gain = rng.uniform(-0.9, 0.9), rng.uniform(0.7, 1.25)
    gx = (np.arange(w, dtype=np.float32) - w / 2) * (math.cos(ang) / max(h, w))
    gy = (np.arange(h, dtype=np.float32) - h / 2) * (math.sin(ang) / max(h, w))
    light = (1.0 + amp * (gy[:, None] + gx[None, :])) * gain
    f: np.ndarray = img.astype(np.float32)
    f *= light[..., None]
    f += rng.uniform(-25, 25, 3).astype(np.float32)  # colour cast
    if rng.random() < 0.5:
        f = cv2.GaussianBlur(f, (0, 0), float(rng.uniform(0.4, 1.6)))
    sigma = np.float32(rng.uniform(0, 9))
    bank = _noise_bank()  # a fixed noise field at a random offset: far cheaper than fresh noise
    oy, ox = int(rng.integers(0, bank.shape[0] - h + 1)), int(rng.integers(0, bank.shape[1] - w + 1))
    noise = bank[oy:oy + h, ox:ox + w]
    if f.ndim == 2:
        noise = noise[..., 0]
    f += noise * sigma
    np.clip(f, 0, 255, out=f)
    out: np.ndarray = f.astype(np.uint8)
    if rng.random() < 0.2:
        out = cv2.cvtColor(out, cv2.COLOR_BGR2GRAY)
    return out


def render_photo(seed: int, split: int, photo: int, n_faces: int, multi_box: bool) -> dict[str, Any]:
    """One photo: its JPEG files and faces [(file name, box, (68,2) keypoints)]."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, split, photo]))
    h, w = int(rng.integers(200, 321)), int(rng.integers(200, 321))
    if n_faces == 2:
        w = max(w, 280)
    img = _background(rng, h, w)
    faces = []
    for j in range(n_faces):
        if rng.random() < 0.7:
            roll = math.radians(float(np.clip(rng.normal(0, 12), -45, 45)))
        else:
            roll = math.radians(float(rng.uniform(-45, 45)))
        if n_faces == 1:
            width = rng.uniform(0.32, 0.55) * min(h, w)
            edge = rng.random() < 0.08  # sometimes partly outside the picture
            m = -0.15 * width if edge else 0.55 * width
            cx = rng.uniform(m, w - m) if w - 2 * m > 0 else w / 2
            cy = rng.uniform(m, h - m) if h - 2 * m > 0 else h / 2
        else:
            width = rng.uniform(0.26, 0.36) * w
            cx = w * (0.27 + 0.46 * j) + rng.uniform(-0.03, 0.03) * w
            cy = rng.uniform(0.45, 0.55) * h
        kp, forehead, s, yaw, opening = _face_geometry(rng, (cx, cy), width, roll)
        _draw_face(img, rng, kp, forehead, s, yaw, opening)
        if rng.random() < 0.3:
            _occlude(img, rng, kp, s)
        faces.append((kp, _detector_box(rng, kp)))
    img = _finish(img, rng)
    quality = int(rng.integers(70, 96))
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    data = buf.tobytes()
    name = f"{photo:06d}"
    if n_faces == 1 or multi_box:
        files = {f"{name}_1.jpg": data}
        entries = [(f"{name}_1.jpg", [(box, kp) for kp, box in faces])]
    else:  # 300-W style: one file per face of the photo
        files = {f"{name}_{j + 1}.jpg": data for j in range(n_faces)}
        entries = [(f"{name}_{j + 1}.jpg", [(box, kp)]) for j, (kp, box) in enumerate(faces)]
    return {"files": files, "entries": entries}
