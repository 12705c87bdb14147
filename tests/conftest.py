"""Shared fixtures: a small demo data set, its crop cache and folds, and the real
ibug300w-mini set when ../shared is present (tests that need it skip otherwise)."""

import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.core.digest import module_file, module_imports  # noqa: F401  # test_layers: the package's import scan
from pipeline.formats.annotations import xml_text

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "data" / "ibug300w-mini"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def real_dir() -> Path:
    if not (REAL / "labels_ibug_300W_train.xml").exists():
        pytest.skip("../shared/data/ibug300w-mini is absent")
    return REAL


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    from pipeline.synth.layout import generate_demo

    return generate_demo(tmp_path_factory.mktemp("demo") / "demo", n_train=48, n_test=8, seed=3)


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory, demo_dir) -> Path:
    """demo_dir cropped at 32 px into <ws>/cache and split into 2 folds at <ws>/folds.csv."""
    import pandas as pd

    from pipeline.stages.crop import run_crop
    from pipeline.stages.folds import make_folds

    ws = tmp_path_factory.mktemp("ws")
    cfg = load_config(None, [f"data.dir={demo_dir}", "crop.side=32", "crop.n_jobs=1"])
    run_crop(cfg, ws / "cache")
    meta = pd.read_csv(ws / "cache" / "train" / "meta.csv")
    pd.DataFrame({"index": meta["index"], "face_id": meta["face_id"], "group": meta["group"],
                  "fold": make_folds(meta["group"], 2, 0)}).to_csv(ws / "folds.csv", index=False)
    return ws


@pytest.fixture(scope="session")
def extra_ws(tmp_path_factory, demo_dir, tiny_workspace) -> dict:
    """A second demo set (another seed, 12 training faces) as data.extra_train's `more`,
    cropped like tiny_workspace's cache into <root>/more: {"folder", "root", "sets"}, sets
    = the overrides that name it (data.dir = demo_dir, the 32 px crop)."""
    from pipeline.stages.crop import run_crop_extra
    from pipeline.synth.layout import generate_demo

    base = tmp_path_factory.mktemp("extra")
    folder = generate_demo(base / "more", n_train=12, n_test=1, seed=11)
    sets = [f"data.dir={demo_dir}", "crop.side=32", "crop.n_jobs=1", f"data.extra_train.more={folder}"]
    run_crop_extra(load_config(None, sets), "more", base / "extra" / "more", tiny_workspace / "cache")
    return {"folder": folder, "root": base / "extra", "sets": sets}


@pytest.fixture
def make_dataset(tmp_path):
    """Factory for small on-disk data sets in the competition layout:
    make_dataset(images={rel: RGB uint8 array | bytes}, train=entries, test=entries) -> folder.
    Arrays are written with cv2.imwrite (by extension); entries as for `xml_text`; a str
    for train/test is written verbatim (for malformed files). Returns the folder."""
    import cv2
    import numpy as np

    counter = {"n": 0}

    def make(images=None, train=None, test=None, name=None):
        counter["n"] += 1
        root = tmp_path / (name or f"ds{counter['n']}")
        root.mkdir(parents=True)
        for rel, img in (images or {}).items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(img, (bytes, bytearray)):
                p.write_bytes(img)
            else:
                arr = np.asarray(img)
                if arr.ndim == 3 and arr.shape[2] in (3, 4):
                    arr = arr[..., [2, 1, 0, 3][:arr.shape[2]]]  # RGB(A) -> BGR(A)
                assert cv2.imwrite(str(p), arr), p
        for fname, entries in (("labels_ibug_300W_train.xml", train), ("labels_ibug_300W_test_parsed.xml", test)):
            if entries is not None:
                (root / fname).write_text(entries if isinstance(entries, str) else xml_text(entries))
        return root

    return make


@pytest.fixture
def face_points():
    """A plausible (68, 2) face inside box (40, 40, 80, 90): the demo template, placed."""
    from pipeline.synth.face import TEMPLATE

    pts = TEMPLATE[:, :2].copy()
    return (pts - pts.min(0)) / (pts.max(0) - pts.min(0)) * [80, 90] + [40, 40]


def run(argv) -> int:
    """`pipeline` main(argv) in-process -> its exit code (0 when it returns)."""
    from pipeline.cli import main

    try:
        main([str(a) for a in argv])
    except SystemExit as e:
        return e.code
    return 0


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """`run` plus what it printed: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = run(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------ pictures (tests/tools, tests/formats)

@pytest.fixture(scope="session")
def viz_ws(tiny_workspace, demo_dir, tmp_path_factory):
    """tiny_workspace + a 1-epoch resunet-tiny (32 px) for fold 0, its predictions
    (test.npz, oof.npz as `pipeline predict` lays them out) and a regression checkpoint."""
    import torch

    from pipeline.formats.cache import load_cache
    from pipeline.formats.checkpoint import load_model, save_checkpoint
    from pipeline.inference.tta import predict_original
    from pipeline.keypoints.schema import IBUG68
    from pipeline.models import create_model
    from pipeline.stages.train import fit

    ws = tiny_workspace
    out = tmp_path_factory.mktemp("vizws")
    cfg = load_config(None, [f"data.dir={demo_dir}", "crop.side=32", "model.input_size=32", "train.epochs=1",
                             "train.batch_size=16", "train.device=cpu", "folds.k=2", "folds.train=[0,1]"])
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
                                     "schema": IBUG68.to_dict(), "config": cfg.model_dump(), "best_mae": 0.0})
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


# ------------------------------------------------------------------ git + DVC projects (test_dvc, tools/test_blend)

GIT_IDENTITY = {f"GIT_{role}_{field}": value for role in ("AUTHOR", "COMMITTER")
                for field, value in (("NAME", "test"), ("EMAIL", "test@example.com"))}


def git_dvc_project(root: Path, env: dict, dvc, message: str = "tiny project", timeout: float = 600):
    """Make `root` a git repository with DVC initialised and everything in it committed;
    returns `run(*args) -> stdout`, which runs a command there under `env` (plus a git
    identity) and fails the test on a non-zero exit."""
    import subprocess

    env = {**env, **GIT_IDENTITY}

    def run(*args) -> str:
        r = subprocess.run([str(a) for a in args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
        return r.stdout

    run("git", "init", "-q")
    run(dvc, "init", "-q")
    run("git", "add", "-A")
    run("git", "commit", "-q", "-m", message)
    return run


class Fixed(torch.nn.Module):
    """A stand-in model: the same coordinates (K, 2), in input pixels, for any input."""

    def __init__(self, coords):
        super().__init__()
        self.coords = torch.as_tensor(coords, dtype=torch.float32)

    def forward(self, x):
        return self.coords.expand(x.shape[0], -1, -1)  # (B, K, 2)
