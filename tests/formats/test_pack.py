"""The face pack (pipeline/formats/pack.py, `pipeline pack`): a cache and its folds packed and
unpacked again give the same cache, crops within JPEG's error; every split travels, an
extra one too; a broken or foreign pack is one error line, and nothing is half-written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.formats.cache import load_cache
from pipeline.formats.folds import read_folds
from pipeline.formats.pack import OFFSETS, PACK_MARKER, unpack, write_pack

from helpers import run_cli


def _files(split):
    return {p.name: p.read_bytes() for p in split.iterdir() if p.is_file() and p.name != "faces.npy"}


def test_a_packed_cache_unpacks_to_the_same_cache_with_its_crops_within_jpeg_error(tiny_workspace, tmp_path):
    cache, folds = tiny_workspace / "cache", tiny_workspace / "folds.csv"
    info = write_pack(cache, folds, tmp_path / "pack", quality=95)
    assert json.loads((tmp_path / "pack" / PACK_MARKER).read_text()) == info
    assert info["bytes"] == sum(p.stat().st_size for p in (tmp_path / "pack").rglob("*")
                                if p.is_file() and p.name != PACK_MARKER)  # every file but pack.json
    got = unpack(tmp_path / "pack", tmp_path / "cache", tmp_path / "folds.csv")
    assert got == info
    assert (tmp_path / "folds.csv").read_bytes() == folds.read_bytes()
    assert (tmp_path / "cache" / "params.resolved.yaml").read_bytes() == (cache / "params.resolved.yaml").read_bytes()
    for split in ("train", "test"):
        a, b = load_cache(cache / split), load_cache(tmp_path / "cache" / split)
        assert _files(cache / split) == _files(tmp_path / "cache" / split)  # keypoints, transforms, meta, info
        assert b.faces.shape == a.faces.shape and b.faces.dtype == np.uint8
        diff = np.abs(b.faces.astype(np.int16) - a.faces.astype(np.int16))
        s = info["splits"][split]
        assert s["faces"] == len(a) and s["side"] == a.faces.shape[1] and s["raw_bytes"] == a.faces.nbytes
        assert s["mean_abs_diff"] == pytest.approx(diff.mean())  # the figure pack.json records is the real one
        assert 0 < diff.mean() < 10 and s["bytes"] < s["raw_bytes"]


def test_every_split_of_the_cache_travels_an_extra_one_too(tiny_workspace, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(tiny_workspace / "cache", cache)
    shutil.copytree(cache / "train", cache / "extra")  # a train-only split beside train/ and test/
    info = write_pack(cache, tiny_workspace / "folds.csv", tmp_path / "pack")
    assert list(info["splits"]) == ["train", "extra", "test"]
    unpack(tmp_path / "pack", tmp_path / "out", tmp_path / "folds.csv")
    extra = load_cache(tmp_path / "out" / "extra")
    assert len(extra) == len(load_cache(cache / "train"))


def test_the_pack_command_crops_folds_and_packs(demo_dir, tmp_path, capsys):
    code, _, err = run_cli(["pack", "--set", f"data.dir={demo_dir}", "--set", "crop.side=32", "--set",
                            "crop.n_jobs=1", "--set", "folds.k=3", "--set", "folds.train=[0,1,2]",
                            "--out", tmp_path / "pack", "--quality", "90"], capsys)
    assert code == 0, err
    info = json.loads((tmp_path / "pack" / PACK_MARKER).read_text())
    assert info["jpeg_quality"] == 90 and set(info["splits"]) == {"train", "test"}
    unpack(tmp_path / "pack", tmp_path / "cache", tmp_path / "folds.csv")
    folds = read_folds(tmp_path / "folds.csv")
    assert sorted(set(folds)) == [0, 1, 2] and len(folds) == len(load_cache(tmp_path / "cache" / "train"))


def test_broken_or_foreign_packs_are_one_line_and_nothing_is_half_written(tiny_workspace, tmp_path, capsys):
    cache, folds = tiny_workspace / "cache", tiny_workspace / "folds.csv"
    with pytest.raises(PipelineError, match="not a face pack"):
        unpack(tmp_path, tmp_path / "cache", tmp_path / "folds.csv")
    write_pack(cache, folds, tmp_path / "pack")
    np.save(tmp_path / "pack" / "train" / OFFSETS, np.array([0, 5], dtype=np.int64))
    with pytest.raises(PipelineError, match="offsets do not fit"):
        unpack(tmp_path / "pack", tmp_path / "cache", tmp_path / "folds.csv")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "folds.csv").exists()

    # a folder that is not a pack is never replaced; folds of other faces are refused
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    code, _, err = run_cli(["pack", "--cache", cache, "--folds", folds, "--out", other], capsys)
    assert code == 2 and "refusing to replace it" in err and (other / "keep.txt").read_text() == "mine"
    bad = tmp_path / "folds-other.csv"
    bad.write_text("".join(folds.read_text().splitlines(keepends=True)[:-1]))  # one face short
    with pytest.raises(PipelineError, match="rerun `pipeline folds`"):
        write_pack(cache, bad, tmp_path / "pack2")
    assert not (tmp_path / "pack2").exists()
    code, _, err = run_cli(["pack", "--cache", cache, "--out", tmp_path / "pack3"], capsys)
    assert code == 2 and "--cache and --folds go together" in err
