"""Shared fixtures: a small demo data set, its crop cache and folds, and the real
ibug300w-mini set when ../shared is present (tests that need it skip otherwise)."""

import ast
from pathlib import Path

import pytest

from pipeline.core.config import load_config

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
    from pipeline.stages.demo import generate_demo

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


def _xml_text(entries) -> str:
    """imglab XML for entries [(file, [(box (l, t, w, h), parts or None), ...])]; parts is an
    (K, 2) array (named 00..) or a list of (name, x, y) with raw attribute strings."""
    lines = ["<?xml version='1.0' encoding='ISO-8859-1'?>", "<dataset>", "<images>"]
    for file, boxes in entries:
        lines.append(f"  <image file='{file}'>")
        for box, parts in boxes:
            attrs = "top='{1}' left='{0}' width='{2}' height='{3}'".format(*box)
            if parts is None:
                lines.append(f"    <box {attrs}/>")
                continue
            lines.append(f"    <box {attrs}>")
            if not isinstance(parts, list):
                parts = [(f"{i:02d}", x, y) for i, (x, y) in enumerate(parts.tolist())]
            lines += [f"      <part name='{n}' x='{x}' y='{y}'/>" for n, x, y in parts]
            lines.append("    </box>")
        lines.append("  </image>")
    lines += ["</images>", "</dataset>", ""]
    return "\n".join(lines)


@pytest.fixture
def make_dataset(tmp_path):
    """Factory for small on-disk data sets in the competition layout:
    make_dataset(images={rel: RGB uint8 array | bytes}, train=entries, test=entries) -> folder.
    Arrays are written with cv2.imwrite (by extension); entries as for `_xml_text`; a str
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
                (root / fname).write_text(entries if isinstance(entries, str) else _xml_text(entries))
        return root

    return make


@pytest.fixture
def face_points():
    """A plausible (68, 2) face inside box (40, 40, 80, 90): the demo template, placed."""
    from pipeline.stages.demo import TEMPLATE

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


# ------------------------------------------------------------------ import graph (test_dvc, test_layers)

def module_file(mod: str) -> Path | None:
    p = REPO.joinpath(*mod.split("."))
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


def module_imports(path: Path, mod: str) -> set[str]:
    """pipeline.* modules named by any import statement in the file (anywhere in it,
    function-level imports included)."""
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from pipeline import x` may be a module
    return {m for m in out if m.split(".")[0] == "pipeline"}
