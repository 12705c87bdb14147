"""Bad input corpus: every malformed input, run through the CLI, exits 2 with exactly one
stderr line `error: <file>: <problem>` that names the file at fault, and writes nothing.

Each case copies/edits the small demo set (or the tiny crop cache) in tmp_path. The cases
run in-process through `pipeline.cli.main` (torch is imported once); log records at
INFO and above are counted as stderr lines, as the CLI's logging handler would print
them. `test_real_process` reruns a few cases as real `python -m pipeline` processes to
check the actual stderr byte for byte."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO

TRAIN_XML = "labels_ibug_300W_train.xml"
TEST_XML = "labels_ibug_300W_test_parsed.xml"
CROP_SETS = ["--set", "crop.side=32", "--set", "crop.n_jobs=1"]


@dataclass
class Case:
    argv: list[str]  # CLI arguments after `pipeline`
    names: list[str]  # strings the error line must contain (the file at fault, first)
    problem: str  # regex the error line must match
    output: Path  # must be absent afterwards, or unchanged if it existed before


# --------------------------------------------------------------------------- builders


def _copy_demo(demo_dir: Path, tmp: Path) -> Path:
    ds = tmp / "ds"
    shutil.copytree(demo_dir, ds)
    return ds


def _first_image(xml: Path) -> str:
    return re.search(r"<image file='([^']+)'", xml.read_text()).group(1)


def _sub_first(path: Path, pattern: str, repl: str) -> None:
    text = path.read_text()
    new, n = re.subn(pattern, repl, text, count=1)
    assert n == 1, pattern
    path.write_text(new)


def _crop_case(ds: Path, tmp: Path, bad: Path | str, problem: str, *extra_names: str) -> Case:
    out = tmp / "cache_out"
    return Case(["crop", "--out", str(out), "--set", f"data.dir={ds}", *CROP_SETS],
                [str(bad), *extra_names], problem, out)


def xml_truncated(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    xml = ds / TRAIN_XML
    xml.write_bytes(xml.read_bytes()[: xml.stat().st_size // 2])
    return _crop_case(ds, tmp, xml, r"malformed XML")


def xml_test_truncated(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    xml = ds / TEST_XML
    xml.write_bytes(xml.read_bytes()[:300])
    return _crop_case(ds, tmp, xml, r"malformed XML")


def xml_not_xml(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    (ds / TRAIN_XML).write_bytes(np.random.default_rng(0).bytes(2000))
    return _crop_case(ds, tmp, ds / TRAIN_XML, r"malformed XML")


def xml_without_images(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    (ds / TRAIN_XML).write_text("<?xml version='1.0'?>\n<dataset><name>x</name></dataset>\n")
    return _crop_case(ds, tmp, ds / TRAIN_XML, r"no <images> element")


def xml_missing(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    (ds / TRAIN_XML).unlink()
    return _crop_case(ds, tmp, ds / TRAIN_XML, r"annotation file not found")


def image_missing(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TRAIN_XML)
    (ds / rel).unlink()
    return _crop_case(ds, tmp, ds / TRAIN_XML, r"image file not found", rel)


def image_zero_bytes(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TRAIN_XML)
    (ds / rel).write_bytes(b"")
    return _crop_case(ds, tmp, ds / TRAIN_XML, r"empty \(0 bytes\)", rel)


def image_corrupt_jpeg(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TRAIN_XML)
    (ds / rel).write_bytes(np.random.default_rng(1).bytes(5000))
    return _crop_case(ds, tmp, ds / rel, r"cannot decode image")


def image_corrupt_jpeg_parallel(demo_dir, tmp):
    """The same through joblib workers (crop.n_jobs=2): the worker's error comes back as one line."""
    case = image_corrupt_jpeg(demo_dir, tmp)
    case.argv[case.argv.index("crop.n_jobs=1")] = "crop.n_jobs=2"
    return case


def image_truncated_jpeg(demo_dir, tmp):
    """Only the first 20 bytes of a JPEG: the header parses, the data is gone."""
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TEST_XML)
    (ds / rel).write_bytes((ds / rel).read_bytes()[:20])
    return _crop_case(ds, tmp, ds / rel, r"cannot decode image")


def image_is_directory(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TRAIN_XML)
    (ds / rel).unlink()
    (ds / rel).mkdir()
    return _crop_case(ds, tmp, ds / TRAIN_XML, r"is a directory, expected an image file", rel)


# one edit of an annotation file: (xml, pattern, replacement, the one-line problem)
XML_EDITS = {
    "box_zero_width": (TRAIN_XML, r"width='\d+'", "width='0'", r"box has non-positive size 0x"),
    "box_non_numeric": (TEST_XML, r"top='\d+'", "top='12px'", r"top='12px' is not a number"),
    "part_non_numeric": (TRAIN_XML, r"(<part name='05' x=)'[^']*'", r"\1'abc'", r"part 05: x='abc' is not a number"),
    "part_nan": (TRAIN_XML, r"(<part name='07' x='[^']*' y=)'[^']*'", r"\1'nan'", r"y='nan' is not finite"),
    "part_count_wrong": (TRAIN_XML, r"\s*<part name='67'[^>]*/>", "", r"67 parts, schema 'ibug68' expects 68"),
    "part_duplicate": (TRAIN_XML, r"<part name='03'", "<part name='02'", r"duplicate part name '02'"),
}


def _xml_edit_case(name: str):
    xml_name, pattern, repl, problem = XML_EDITS[name]

    def case(demo_dir, tmp):
        ds = _copy_demo(demo_dir, tmp)
        _sub_first(ds / xml_name, pattern, repl)
        return _crop_case(ds, tmp, ds / xml_name, problem)

    case.__name__ = name
    return case


def path_escapes_dataset(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TRAIN_XML)
    shutil.copy(ds / rel, tmp / "outside.jpg")  # it exists: refused for where it is, not absence
    _sub_first(ds / TRAIN_XML, re.escape(f"file='{rel}'"), "file='images/../../outside.jpg'")
    return _crop_case(ds, tmp, ds / TRAIN_XML, r"leaves the dataset folder", "images/../../outside.jpg")


def path_absolute(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TEST_XML)
    target = (ds / rel).resolve()
    _sub_first(ds / TEST_XML, re.escape(f"file='{rel}'"), f"file='{target}'")
    return _crop_case(ds, tmp, ds / TEST_XML, r"leaves the dataset folder", str(target))


def crop_into_existing_cache(demo_dir, tmp, tiny_workspace):
    """A bad XML must leave an earlier good cache exactly as it was."""
    ds = _copy_demo(demo_dir, tmp)
    xml = ds / TRAIN_XML
    xml.write_bytes(xml.read_bytes()[:1000])
    out = tmp / "cache_out"
    shutil.copytree(tiny_workspace / "cache", out)
    return Case(["crop", "--out", str(out), "--set", f"data.dir={ds}", *CROP_SETS], [str(xml)],
                r"malformed XML", out)


def _params_case(demo_dir, tmp, text: str, problem: str) -> Case:
    ds = _copy_demo(demo_dir, tmp)
    params = tmp / "bad_params.yaml"
    params.write_text(text.format(ds=ds))
    out = tmp / "cache_out"
    return Case(["crop", "--params", str(params), "--out", str(out)], [str(params)], problem, out)


def params_unknown_key(demo_dir, tmp):
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\ncrop:\n  side: 32\n  n_job: 1\n",
                        r"unknown key 'crop.n_job'")


def params_wrong_type(demo_dir, tmp):
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\ncrop:\n  side: big\n",
                        r"'crop.side' must be int, got 'big'")


def params_invalid_yaml(demo_dir, tmp):
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\ncrop: [side: 32\n", r"invalid YAML")


def set_wrong_type(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    out = tmp / "cache_out"
    return Case(["crop", "--out", str(out), "--set", f"data.dir={ds}", "--set", "crop.n_jobs=two"],
                ["--set crop.n_jobs=two"], r"'crop.n_jobs' must be int", out)


def fold_out_of_range(tmp, tiny_workspace):
    ws = tiny_workspace
    out = tmp / "models"
    return Case(["train", "--fold", "9", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"),
                 "--out", str(out), "--live", str(tmp / "live"), "--set", "crop.side=32",
                 "--set", "model.input_size=32", "--set", "folds.k=2", "--set", "folds.train=[0,1]"],
                [str(ws / "folds.csv")], r"fold 9 out of range: folds are 0\.\.1", out)


def _score_case(demo_dir, tmp, edit) -> Case:
    lines = (demo_dir / "solution.csv").read_text().splitlines()
    sub = tmp / "sub.csv"
    problem = edit(lines)
    sub.write_text("\n".join(lines) + "\n")
    out = tmp / "scores"
    return Case(["score", str(sub), "--solution", str(demo_dir / "solution.csv"),
                 "--json", str(out / "score.json")], [str(sub)], problem, out)


def _drop_row(lines):
    del lines[10]
    return r"missing Id 9; Ids must be 0\.\.\d+"


def _wrong_header(lines):
    lines[0] = "id,prediction"
    return r"wrong header 'id,prediction', expected 'Id,Predicted'"


def _nan_value(lines):
    lines[5] = "4,nan"
    return r"line 6: non-finite value 'nan'"


def _short_rows(lines):
    del lines[-20:]
    return r"\d+ rows, expected \d+"


def submission_missing_id(demo_dir, tmp):
    return _score_case(demo_dir, tmp, _drop_row)


def submission_wrong_header(demo_dir, tmp):
    return _score_case(demo_dir, tmp, _wrong_header)


def submission_nan(demo_dir, tmp):
    return _score_case(demo_dir, tmp, _nan_value)


def submission_too_short(demo_dir, tmp):
    return _score_case(demo_dir, tmp, _short_rows)


def predictions_nan(tmp, tiny_workspace):
    """`pipeline submit` refuses NaN predictions and writes no CSV."""
    n = len((tiny_workspace / "cache" / "test" / "meta.csv").read_text().splitlines()) - 1
    pred = np.zeros((n, 68, 2))
    pred[1, 3, 1] = np.nan
    npz = tmp / "test.npz"
    np.savez(npz, ensemble=pred)
    out = tmp / "subs"
    return Case(["submit", "--predictions", str(npz), "--cache", str(tiny_workspace / "cache"),
                 "--out-dir", str(out)], [str(npz)], r"1 non-finite coordinate\(s\).*face 1 point 3 y", out)


# checkpoints ------------------------------------------------------------------------


def _predict_case(tmp, ws, ckpt_bytes_or_path) -> tuple[Case, Path]:
    models = tmp / "models"
    (models / "fold0").mkdir(parents=True)
    ckpt = models / "fold0" / "best.pt"
    if isinstance(ckpt_bytes_or_path, bytes):
        ckpt.write_bytes(ckpt_bytes_or_path)
    else:
        shutil.copy(ckpt_bytes_or_path, ckpt)
    out = tmp / "predictions"
    argv = ["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"),
            "--models", str(models), "--out", str(out), "--set", "predict.device=cpu"]
    return Case(argv, [str(ckpt)], "", out), ckpt


class _Evil:
    """Unpickling this runs exec(code): proof that a loader executed pickled code."""

    def __init__(self, marker: Path):
        self.code = f"open({str(marker)!r}, 'w').write('pwned')"

    def __reduce__(self):
        import builtins

        return (builtins.exec, (self.code,))


def checkpoint_other_schema(tmp, tiny_workspace, nose1_checkpoint):
    case, ckpt = _predict_case(tmp, tiny_workspace, nose1_checkpoint)
    case.problem = r"checkpoint is for schema 'nose1' \(1 points\), data uses 'ibug68' \(68 points\)"
    return case


def checkpoint_random_bytes(tmp, tiny_workspace):
    case, _ = _predict_case(tmp, tiny_workspace, np.random.default_rng(2).bytes(4096))
    case.problem = r"not a loadable checkpoint"
    return case


def checkpoint_text_file(tmp, tiny_workspace):
    case, _ = _predict_case(tmp, tiny_workspace, b"model: resunet\nweights: see README\n")
    case.problem = r"not a loadable checkpoint"
    return case


def checkpoint_empty(tmp, tiny_workspace):
    case, _ = _predict_case(tmp, tiny_workspace, b"")
    case.problem = r"not a loadable checkpoint"
    return case


def checkpoint_truncated(tmp, tiny_workspace, nose1_checkpoint):
    data = Path(nose1_checkpoint).read_bytes()
    case, _ = _predict_case(tmp, tiny_workspace, data[: len(data) // 2])
    case.problem = r"not a loadable checkpoint"
    return case


def checkpoint_not_ours(tmp, tiny_workspace):
    import torch

    p = tmp / "plain.pt"
    torch.save({"weights": torch.zeros(3)}, p)
    case, _ = _predict_case(tmp, tiny_workspace, p)
    case.problem = r"not a pipeline checkpoint \(needs keys"
    return case


def checkpoint_garbage_fields(tmp, tiny_workspace):
    """All required keys present, with values of the wrong kind."""
    import torch

    p = tmp / "garbage.pt"
    torch.save({"model_config": "resunet", "model": [1, 2], "schema": "ibug68", "epoch": 1}, p)
    case, _ = _predict_case(tmp, tiny_workspace, p)
    case.problem = r"not a pipeline checkpoint \('schema' is a str"
    return case


def checkpoint_wrong_weights(tmp, tiny_workspace, nose1_checkpoint):
    """A 68-point schema on a checkpoint whose weights are for another model."""
    import torch

    ck = torch.load(nose1_checkpoint, weights_only=True)
    from pipeline.keypoints.schema import IBUG68

    ck["schema"] = IBUG68.to_dict()
    ck["model_config"] = {**ck["model_config"], "num_keypoints": 68}
    p = tmp / "mismatch.pt"
    torch.save(ck, p)
    case, _ = _predict_case(tmp, tiny_workspace, p)
    case.problem = r"weights do not fit model 'resunet-tiny'"
    return case


def checkpoint_malicious_pickle(tmp, tiny_workspace):
    """A plain (non-zip) pickle whose __reduce__ would create tmp/marker."""
    case, _ = _predict_case(tmp, tiny_workspace, pickle.dumps({"model": _Evil(tmp / "marker")}))
    case.problem = r"not a loadable checkpoint"
    return case


def checkpoint_malicious_pickle_protocol2(tmp, tiny_workspace):
    """Protocol 2, the one torch.load's legacy path parses: the loader reaches the GLOBAL
    opcode and refuses it."""
    case, _ = _predict_case(tmp, tiny_workspace, pickle.dumps({"model": _Evil(tmp / "marker")}, protocol=2))
    case.problem = r"not a loadable checkpoint \(refused by the weights-only loader: Unsupported global: GLOBAL exec"
    return case


def checkpoint_malicious_torch_zip(tmp, tiny_workspace):
    """A real torch.save zip archive holding the same payload among checkpoint keys."""
    import torch

    p = tmp / "evil.pt"
    torch.save({"model_config": _Evil(tmp / "marker"), "model": {}, "schema": {}, "epoch": 1}, p)
    case, _ = _predict_case(tmp, tiny_workspace, p)
    case.problem = r"not a loadable checkpoint \(refused by the weights-only loader: Unsupported global: GLOBAL exec"
    return case


def submit_xml_malicious_checkpoint(demo_dir, tmp):
    """Standalone `pipeline submit --xml ... --checkpoints evil.pt` loads safely too."""
    ckpt = tmp / "evil.pt"
    ckpt.write_bytes(pickle.dumps(_Evil(tmp / "marker")))
    out = tmp / "subs" / "s.csv"
    return Case(["submit", "--xml", str(demo_dir / TEST_XML), "--checkpoints", str(ckpt), "--out", str(out),
                 "--set", "crop.side=32", "--set", "crop.n_jobs=1", "--set", "predict.device=cpu"],
                [str(ckpt)], r"not a loadable checkpoint", out.parent)


def _submit_xml_case(tmp, xml: Path, ckpt: Path, bad: Path, problem: str) -> Case:
    out = tmp / "subs" / "s.csv"
    return Case(["submit", "--xml", str(xml), "--checkpoints", str(ckpt), "--out", str(out)],
                [str(bad)], problem, out.parent)


def submit_xml_missing(tmp):
    ckpt = tmp / "c.pt"
    ckpt.write_bytes(b"x")
    return _submit_xml_case(tmp, tmp / "none.xml", ckpt, tmp / "none.xml", r"test XML not found$")


def submit_xml_is_a_directory(tmp):
    (tmp / "x.xml").mkdir()
    ckpt = tmp / "c.pt"
    ckpt.write_bytes(b"x")
    return _submit_xml_case(tmp, tmp / "x.xml", ckpt, tmp / "x.xml",
                            r"is a directory, expected a test XML file$")


def submit_checkpoint_missing(demo_dir, tmp):
    return _submit_xml_case(tmp, demo_dir / TEST_XML, tmp / "none.pt", tmp / "none.pt",
                            r"checkpoint not found$")


def submit_checkpoint_is_a_directory(demo_dir, tmp):
    (tmp / "c.pt").mkdir()
    return _submit_xml_case(tmp, demo_dir / TEST_XML, tmp / "c.pt", tmp / "c.pt",
                            r"is a directory, expected a checkpoint file$")


def score_solution_is_a_directory(demo_dir, tmp):
    (tmp / "sol.csv").mkdir()
    out = tmp / "scores"
    return Case(["score", str(demo_dir / "solution.csv"), "--solution", str(tmp / "sol.csv"),
                 "--json", str(out / "score.json")], [str(tmp / "sol.csv")],
                r"is a directory, expected a CSV file$", out)


def blend_solution_is_a_directory(tmp):
    """Checked before the inputs are read and blended."""
    (tmp / "sol.csv").mkdir()
    out = tmp / "blend"
    return Case(["blend", str(tmp / "a"), str(tmp / "b"), "--solution", str(tmp / "sol.csv"), "--out", str(out)],
                [str(tmp / "sol.csv")], r"is a directory, expected a CSV file$", out)


# hostile inputs, one builder per class (boxes, numeric params, duplicated keys,
# errors naming the file read, stage inputs that do not belong together, lying images) ---


def _edit_first_box(demo_dir, tmp, attr: str, value: str) -> tuple[Path, Path]:
    ds = _copy_demo(demo_dir, tmp)
    xml = ds / TRAIN_XML
    _sub_first(xml, rf"{attr}='-?\d+'", f"{attr}='{value}'")
    return ds, xml


def box_far_outside_image(demo_dir, tmp):
    """Would have cached an all-black face with exit 0."""
    ds, xml = _edit_first_box(demo_dir, tmp, "left", "100000")
    return _crop_case(ds, tmp, xml, r"box 0: box \(left 100000, .*\) lies outside the image", _first_image(xml))


def box_absurdly_large(demo_dir, tmp):
    """A box one million pixels wide stalled the crop."""
    ds, xml = _edit_first_box(demo_dir, tmp, "width", "1000000")
    return _crop_case(ds, tmp, xml, r"box 1000000x\d+ is more than 3x the image", _first_image(xml))


def _png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def image_declares_huge_size(demo_dir, tmp):
    """A few dozen bytes declaring 100000 x 100000 px."""
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TRAIN_XML)
    (ds / rel).write_bytes(_png_header(100000, 100000))
    return _crop_case(ds, tmp, ds / rel, r"declares an impossible size 100000x100000 px")


def image_declares_zero_width(demo_dir, tmp):
    ds = _copy_demo(demo_dir, tmp)
    rel = _first_image(ds / TRAIN_XML)
    (ds / rel).write_bytes(_png_header(0, 300))
    return _crop_case(ds, tmp, ds / rel, r"declares an impossible size 0x300 px")


def params_nan_expand(demo_dir, tmp):
    """Exited 0 with NaN keypoints."""
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\ncrop:\n  expand: .nan\n",
                        r"'crop.expand' must be a finite number, got nan")


def params_zero_expand(demo_dir, tmp):
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\ncrop:\n  expand: 0\n",
                        r"'crop.expand' must be a number in \(0, 10\], got 0")


def params_duplicated_key(demo_dir, tmp):
    """YAML keeps the last of two equal keys silently."""
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\ncrop:\n  side: 32\n  side: 48\n",
                        r"duplicated key 'side' \(also on line 4\)")


def params_problem_found_late_names_that_file(demo_dir, tmp):
    """A value found bad after loading (an unknown schema) names --params other.yaml."""
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\n  schema: nosuch\n", r"data.schema: unknown schema 'nosuch'")


def _train_case(tmp, ws, folds: Path, *sets: str) -> Case:
    out = tmp / "models"
    argv = ["train", "--fold", "0", "--cache", str(ws / "cache"), "--folds", str(folds), "--out", str(out),
            "--live", str(tmp / "live"), "--set", "model.input_size=32", "--set", "folds.k=2",
            "--set", "folds.train=[0,1]", "--set", "train.device=cpu"]
    for s in sets:
        argv += ["--set", s]
    return Case(argv, [], "", out)


def set_nonpositive_train_numbers(tmp, tiny_workspace):
    """batch size 0 gave a traceback."""
    case = _train_case(tmp, tiny_workspace, tiny_workspace / "folds.csv", "train.batch_size=0")
    case.names, case.problem = ["--set train.batch_size=0"], r"'train.batch_size' must be an integer >= 1, got 0"
    return case


def set_negative_epochs(tmp, tiny_workspace):
    case = _train_case(tmp, tiny_workspace, tiny_workspace / "folds.csv", "train.epochs=-2")
    case.names, case.problem = ["--set train.epochs=-2"], r"'train.epochs' must be an integer >= 1, got -2"
    return case


def set_infinite_lr(tmp, tiny_workspace):
    case = _train_case(tmp, tiny_workspace, tiny_workspace / "folds.csv", "train.lr=1e999")
    case.names, case.problem = ["--set train.lr=1e999"], r"'train.lr' must be a finite number, got inf"
    return case


def set_scale_range_reversed(tmp, tiny_workspace):
    """Issue 48, finding 5: a reversed scale range ended in a traceback at training start."""
    case = _train_case(tmp, tiny_workspace, tiny_workspace / "folds.csv", "train.scale_min=2")
    case.names = ["--set train.scale_min=2"]
    case.problem = r"'train\.scale_min' 2 must be <= 'train\.scale_max' 1\.3333333$"
    return case


def set_train_folds_beyond_k(tmp, tiny_workspace):
    case = _train_case(tmp, tiny_workspace, tiny_workspace / "folds.csv", "folds.train=[0,7]")
    case.names, case.problem = ["--set folds.train=[0,7]"], r"'folds\.train' \[0, 7\] must name folds of 'folds\.k' 2"
    return case


def params_model_option_wrong_type(demo_dir, tmp):
    """A preset's option of the wrong type is refused by every command, crop included,
    before any work (it failed only at model build, after the crop and the folds)."""
    return _params_case(demo_dir, tmp, "data:\n  dir: {ds}\nmodel:\n  options: {{decoder_levels: three}}\n",
                        r"'model\.options\.decoder_levels' of preset 'resunet-tiny' must be an integer, got 'three'")


def _edited_folds(tmp, ws, edit) -> Path:
    import pandas as pd

    df = edit(pd.read_csv(ws / "folds.csv", dtype={"face_id": str, "group": str}))
    path = tmp / "folds_edited.csv"
    df.to_csv(path, index=False)
    return path


def folds_rows_shuffled(tmp, tiny_workspace):
    """Train used a folds file whose rows are not the cache's faces in order."""
    folds = _edited_folds(tmp, tiny_workspace, lambda df: df.sample(frac=1.0, random_state=1))
    case = _train_case(tmp, tiny_workspace, folds, "train.epochs=1")
    case.names, case.problem = [str(folds)], r"rows do not match the faces of .*cache/train \(row \d+: "
    return case


def folds_rows_missing_predict(tmp, tiny_workspace):
    folds = _edited_folds(tmp, tiny_workspace, lambda df: df.iloc[:-3])
    out = tmp / "predictions"
    return Case(["predict", "--cache", str(tiny_workspace / "cache"), "--folds", str(folds), "--models",
                 str(tmp / "models"), "--out", str(out), "--set", "predict.device=cpu"],
                [str(folds)], r"has \d+ rows but .*cache/train has \d+ faces", out)


def _ibug68_checkpoint(path: Path, side: int, expand: float) -> Path:
    import torch

    from pipeline.keypoints.schema import IBUG68
    from pipeline.models import create_model

    model = create_model("resunet-tiny", 68, in_chans=3, input_size=32)
    torch.save({"model_config": model.config, "model": model.state_dict(), "schema": IBUG68.to_dict(),
                "epoch": 1, "crop": {"size": side, "expand": expand}}, path)
    return path


def checkpoint_other_crop_geometry(tmp, tiny_workspace):
    """A checkpoint trained on 64 px crops applied to the 32 px cache."""
    case, ckpt = _predict_case(tmp, tiny_workspace, _ibug68_checkpoint(tmp / "c.pt", 64, 1.25))
    case.problem = r"trained on 64 px crops with expand 1.25, but the cache .* holds 32 px crops"
    return case


def caches_of_two_crop_runs(tmp, tiny_workspace):
    """train/ and test/ from different crop runs (what a crash between splits used to leave)."""
    import json

    cache = tmp / "cache"
    shutil.copytree(tiny_workspace / "cache", cache)
    info = cache / "test" / "info.json"
    d = json.loads(info.read_text())
    d["run"] = "another-run"
    info.write_text(json.dumps(d))
    out = tmp / "predictions"
    return Case(["predict", "--cache", str(cache), "--folds", str(tiny_workspace / "folds.csv"), "--models",
                 str(tmp / "models"), "--out", str(out), "--set", "predict.device=cpu"],
                [str(cache)], r"train/ and test/ caches come from different `pipeline crop` runs", out)


def crop_into_foreign_folder(demo_dir, tmp):
    """The cache is replaced as a whole: a folder holding anything else is refused."""
    out = tmp / "somewhere"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    return Case(["crop", "--out", str(out), "--set", f"data.dir={demo_dir}", *CROP_SETS], [str(out)],
                r"exists and is not a face cache", out)


def solution_too_short(demo_dir, tmp):
    """A short solution.csv was reported under the submission's name."""
    sol = tmp / "solution.csv"
    lines = (demo_dir / "solution.csv").read_text().splitlines()
    sol.write_text("\n".join(lines[:-5]) + "\n")
    sub = tmp / "sub.csv"
    sub.write_text("\n".join(lines) + "\n")
    out = tmp / "scores"
    return Case(["score", str(sub), "--solution", str(sol), "--json", str(out / "score.json")], [str(sol)],
                r"rows, not whole faces of 68 keypoints", out)



# extra training folders (data.extra_train) -----------------------------------------------


def _crop_extra_case(demo_dir, tmp, ws, *sets: str) -> Case:
    """`pipeline crop-extra more` beside the tiny main cache (cropped from demo_dir)."""
    out = tmp / "extra_out"
    argv = ["crop-extra", "more", "--out", str(out), "--cache", str(ws / "cache"), *CROP_SETS,
            "--set", f"data.dir={demo_dir}"]
    for s in sets:
        argv += ["--set", s]
    return Case(argv, [], "", out)


def extra_folder_given_twice(demo_dir, tmp, tiny_workspace, extra_ws):
    folder = extra_ws["folder"]
    case = _crop_extra_case(demo_dir, tmp, tiny_workspace, f"data.extra_train={{more: {folder}, again: {folder}/.}}")
    case.names = ["--set data.extra_train="]
    case.problem = r"'data.extra_train.more' and 'data.extra_train.again' are the same folder"
    return case


def extra_folder_is_data_dir(demo_dir, tmp, tiny_workspace):
    case = _crop_extra_case(demo_dir, tmp, tiny_workspace, f"data.extra_train.more={demo_dir}")
    case.names, case.problem = [f"--set data.extra_train.more={demo_dir}"], r"'data.extra_train.more' is data.dir"
    return case


def extra_folder_missing(demo_dir, tmp, tiny_workspace):
    case = _crop_extra_case(demo_dir, tmp, tiny_workspace, f"data.extra_train.more={tmp / 'nowhere'}")
    case.names = [str(tmp / "nowhere")]
    case.problem = r"extra training folder not found \(data.extra_train.more\)"
    return case


def extra_xml_truncated(demo_dir, tmp, tiny_workspace, extra_ws):
    ds = tmp / "more"
    shutil.copytree(extra_ws["folder"], ds)
    xml = ds / TRAIN_XML
    xml.write_bytes(xml.read_bytes()[: xml.stat().st_size // 2])
    case = _crop_extra_case(demo_dir, tmp, tiny_workspace, f"data.extra_train.more={ds}")
    case.names, case.problem = [str(xml)], r"malformed XML"
    return case


def extra_photo_of_the_main_folder(demo_dir, tmp, tiny_workspace, extra_ws):
    """A photo of data.dir in an extra folder: its faces would be trained on and validated."""
    ds = tmp / "more"
    shutil.copytree(extra_ws["folder"], ds)
    main_rel, rel = _first_image(demo_dir / TEST_XML), _first_image(ds / TRAIN_XML)
    shutil.copy(demo_dir / main_rel, ds / rel)
    case = _crop_extra_case(demo_dir, tmp, tiny_workspace, f"data.extra_train.more={ds}")
    case.names, case.problem = [str(ds / rel), str(demo_dir / main_rel)], r"the same photo as .* of data.dir"
    return case


def _train_extra_case(tmp, ws, root: Path, *sets: str) -> Case:
    case = _train_case(tmp, ws, ws / "folds.csv", "crop.side=32", "train.epochs=1", "train.batch_size=8", *sets)
    case.argv += ["--extra", str(root)]
    return case


def extra_photo_in_two_extras(demo_dir, tmp, tiny_workspace, extra_ws):
    """Two extra folders holding one photo: its faces would be trained on twice."""
    from pipeline.core.config import load_config
    from pipeline.stages.crop import run_crop_extra

    twin, root = tmp / "twin", tmp / "extra"
    shutil.copytree(extra_ws["folder"], twin)
    shutil.copytree(extra_ws["root"] / "more", root / "more")
    sets = [*extra_ws["sets"], f"data.extra_train.twin={twin}"]
    run_crop_extra(load_config(None, sets), "twin", root / "twin", tiny_workspace / "cache")
    case = _train_extra_case(tmp, tiny_workspace, root, *sets)
    rel = _first_image(twin / TRAIN_XML)
    case.names = [str(twin / rel), str(extra_ws["folder"] / rel)]
    case.problem = r"the same photo as .* \(data.extra_train.more and .twin\)"
    return case


def extra_cache_missing(tmp, tiny_workspace, extra_ws):
    case = _train_extra_case(tmp, tiny_workspace, tmp / "extra", *extra_ws["sets"])
    case.names = [str(tmp / "extra" / "more")]
    case.problem = r"no face cache of data.extra_train.more \(run `dvc repro`, or `pipeline crop-extra more`\)"
    return case


def extra_cache_stale(tmp, tiny_workspace, extra_ws):
    """The extra cropped at expand 1.25, trained under crop.expand 1.3."""
    case = _train_extra_case(tmp, tiny_workspace, extra_ws["root"], *extra_ws["sets"], "crop.expand=1.3")
    case.names = [str(extra_ws["root"] / "more")]
    case.problem = r"stale face cache of data.extra_train.more: cropped with other data or crop params \(run `dvc"
    return case


# where output goes ----------------------------------------------------------------------


def _test_predictions(tmp, ws) -> Path:
    n = len((ws / "cache" / "test" / "meta.csv").read_text().splitlines()) - 1
    npz = tmp / "test.npz"
    np.savez(npz, ensemble=np.zeros((n, 68, 2)))
    return npz


def submit_out_dir_is_a_file(tmp, tiny_workspace):
    out = tmp / "subs"
    out.write_text("not a folder")
    return Case(["submit", "--predictions", str(_test_predictions(tmp, tiny_workspace)), "--cache",
                 str(tiny_workspace / "cache"), "--out-dir", str(out)], [str(out)], r"is a file, not a folder", out)


def score_json_parent_is_a_file(demo_dir, tmp):
    parent = tmp / "scores"
    parent.write_text("not a folder")
    return Case(["score", str(demo_dir / "solution.csv"), "--solution", str(demo_dir / "solution.csv"),
                 "--json", str(parent / "score.json")], [str(parent), str(parent / "score.json")],
                r"is a file, not a folder", parent)


def score_json_is_a_directory(demo_dir, tmp):
    out = tmp / "scores"
    out.mkdir()
    return Case(["score", str(demo_dir / "solution.csv"), "--solution", str(demo_dir / "solution.csv"),
                 "--json", str(out)], [str(out)], r"is a directory, expected a file", out)


def demo_out_is_a_file(tmp):
    out = tmp / "demo"
    out.write_text("not a folder")
    return Case(["demo-data", str(out)], [str(out)], r"exists and is not a folder", out)


def submission_name_nul_byte(tmp, tiny_workspace):
    params = tmp / "params.yaml"
    params.write_text('submit:\n  name: "sub\\0mission"\n')
    out = tmp / "subs"
    return Case(["submit", "--params", str(params), "--predictions", str(_test_predictions(tmp, tiny_workspace)),
                 "--cache", str(tiny_workspace / "cache"), "--out-dir", str(out)], [str(params)],
                r"submit.name must be a plain file name, got 'sub\\x00mission'", out)


def output_path_nul_byte(demo_dir, tmp):
    """A NUL byte in a path given in-process (argv cannot hold one)."""
    out = tmp / "cache_out"
    return Case(["crop", "--out", f"{out}\0x", "--set", f"data.dir={demo_dir}", *CROP_SETS], [f"{out}\\0x"],
                r"invalid name \(holds a NUL byte\)", out)


def submission_id_beyond_int64(demo_dir, tmp):
    def edit(lines):
        lines[3] = "99999999999999999999,1.0"
        return r"line 4: Id '99999999999999999999' out of range"

    return _score_case(demo_dir, tmp, edit)


def submission_id_huge_within_int64(demo_dir, tmp):
    """An Id that fits int64 made the missing-Id report allocate an array that long."""
    def edit(lines):
        lines[3] = "999999999999999999,1.0"
        return r"missing Id 2 \(and \d{18} more\)"

    return _score_case(demo_dir, tmp, edit)


def checkpoint_absurd_input_size(tmp, tiny_workspace):
    """A config declaring a 10^9 px input: refused before anything is allocated."""
    import torch

    p = _ibug68_checkpoint(tmp / "c.pt", 32, 1.25)
    ck = torch.load(p, weights_only=True)
    ck["model_config"]["input_size"] = 10 ** 9
    torch.save(ck, p)
    case, _ = _predict_case(tmp, tiny_workspace, p)
    case.problem = r"input_size must be an integer in \[1, 4096\], got 1000000000"
    return case


def checkpoint_bad_in_second_fold(tmp, tiny_workspace):
    """Every fold's checkpoint is checked before fold 0 predicts (and logs its line)."""
    case, _ = _predict_case(tmp, tiny_workspace, _ibug68_checkpoint(tmp / "c.pt", 32, 1.25))
    bad = tmp / "models" / "fold1" / "best.pt"
    bad.parent.mkdir()
    bad.write_bytes(b"not a checkpoint")
    case.names, case.problem = [str(bad)], r"not a loadable checkpoint"
    return case


def folds_fold_number_absurd(tmp, tiny_workspace):
    """Fold 10^12 would make predict look for 10^12 checkpoints."""
    def edit(df):
        df.loc[0, "fold"] = 10 ** 12
        return df

    folds = _edited_folds(tmp, tiny_workspace, edit)
    out = tmp / "predictions"
    return Case(["predict", "--cache", str(tiny_workspace / "cache"), "--folds", str(folds), "--models",
                 str(tmp / "models"), "--out", str(out), "--set", "predict.device=cpu"],
                [str(folds)], r"column 'fold' must hold integers in 0\.\.\d+", out)


CASES = {f.__name__: f for f in (
    xml_truncated, xml_test_truncated, xml_not_xml, xml_without_images, xml_missing,
    image_missing, image_zero_bytes, image_corrupt_jpeg, image_corrupt_jpeg_parallel, image_truncated_jpeg, image_is_directory,
    *(_xml_edit_case(name) for name in XML_EDITS),
    path_escapes_dataset, path_absolute, crop_into_existing_cache,
    params_unknown_key, params_wrong_type, params_invalid_yaml, set_wrong_type,
    fold_out_of_range,
    submission_missing_id, submission_wrong_header, submission_nan, submission_too_short, predictions_nan,
    checkpoint_other_schema, checkpoint_random_bytes, checkpoint_text_file, checkpoint_empty,
    checkpoint_truncated, checkpoint_not_ours, checkpoint_garbage_fields, checkpoint_wrong_weights, checkpoint_malicious_pickle, checkpoint_malicious_pickle_protocol2,
    checkpoint_malicious_torch_zip,
    submit_xml_malicious_checkpoint, submit_xml_missing, submit_xml_is_a_directory, submit_checkpoint_missing,
    submit_checkpoint_is_a_directory, score_solution_is_a_directory, blend_solution_is_a_directory,
    box_far_outside_image, box_absurdly_large, image_declares_huge_size, image_declares_zero_width,
    params_nan_expand, params_zero_expand, params_duplicated_key, params_problem_found_late_names_that_file,
    set_nonpositive_train_numbers, set_negative_epochs, set_infinite_lr,
    set_scale_range_reversed, set_train_folds_beyond_k, params_model_option_wrong_type,
    folds_rows_shuffled, folds_rows_missing_predict, checkpoint_other_crop_geometry, caches_of_two_crop_runs,
    solution_too_short, crop_into_foreign_folder,
    submit_out_dir_is_a_file, score_json_parent_is_a_file, submission_name_nul_byte, output_path_nul_byte,
    submission_id_beyond_int64, submission_id_huge_within_int64, checkpoint_absurd_input_size,
    folds_fold_number_absurd, checkpoint_bad_in_second_fold, score_json_is_a_directory, demo_out_is_a_file,
    extra_folder_given_twice, extra_folder_is_data_dir, extra_folder_missing, extra_xml_truncated,
    extra_photo_of_the_main_folder, extra_photo_in_two_extras, extra_cache_missing, extra_cache_stale,
)}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def nose1_checkpoint(tmp_path_factory, demo_dir, tiny_workspace) -> Path:
    """A real checkpoint trained 1 epoch with data.schema=nose1 on the demo faces."""
    from pipeline.core.config import load_config
    from pipeline.stages.crop import run_crop
    from pipeline.stages.train import fit

    ws = tmp_path_factory.mktemp("nose1")
    cfg = load_config(None, [f"data.dir={demo_dir}", "data.schema=nose1", "crop.side=32", "crop.n_jobs=1",
                             "model.input_size=32", "train.batch_size=8", "train.epochs=1", "folds.k=2", "folds.train=[0,1]",
                             "train.randaug_n=0"])
    run_crop(cfg, ws / "cache")
    fit(cfg, 0, ws / "cache", tiny_workspace / "folds.csv", ws / "models", resume=False)
    return ws / "models" / "fold0" / "best.pt"


def _snapshot(path: Path):
    if not path.exists():
        return None
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(path.rglob("*"))}


def _check(case: Case, code, err_lines: list[str], before) -> None:
    assert code == 2, (code, err_lines)
    assert len(err_lines) == 1, err_lines
    line = err_lines[0]
    assert line.startswith("error: "), line
    for name in case.names:
        assert name in line, (name, line)
    assert line.startswith(f"error: {case.names[0]}"), line  # the file at fault comes first
    assert re.search(case.problem, line), (case.problem, line)
    assert _snapshot(case.output) == before, f"{case.output} was written"


# --------------------------------------------------------------------------- tests


def _build(name, request, tmp_path) -> Case:
    """Call the case builder with the fixtures it names (tmp = the test's tmp_path)."""
    import inspect

    params = [p for p in inspect.signature(CASES[name]).parameters if p not in ("tmp", "_")]
    return CASES[name](tmp=tmp_path, **{p: request.getfixturevalue(p) for p in params})


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, request, tmp_path, monkeypatch, capsys, caplog):
    from pipeline.cli import main

    case = _build(name, request, tmp_path)
    before = _snapshot(case.output)
    monkeypatch.chdir(tmp_path)  # no params.yaml here: the defaults apply
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")  # a warning is printed to stderr: one more line
        with pytest.raises(SystemExit) as exc:
            main(case.argv)
    err = capsys.readouterr().err
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    _check(case, exc.value.code, err.splitlines() + logged + [str(w.message) for w in warned], before)
    assert not (tmp_path / "marker").exists(), "a checkpoint load executed pickled code"
    # no temp file of an atomic write is left anywhere in the case's folder
    assert not [p for p in tmp_path.rglob("*.tmp*")], list(tmp_path.rglob("*.tmp*"))


def test_malicious_payload_is_live(tmp_path):
    """Control for the checkpoint cases: unpickling the payload unsafely does create the
    marker, so its absence above proves the loader did not run it."""
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(_Evil(marker)))
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize("name", ["xml_truncated", "image_corrupt_jpeg_parallel", "params_unknown_key",
                                  "submission_nan", "checkpoint_malicious_pickle", "box_absurdly_large",
                                  "submit_out_dir_is_a_file", "submit_xml_is_a_directory",
                                  "extra_photo_of_the_main_folder"])
def test_real_process(name, request, tmp_path):
    """The same check on the real stderr of a `python -m pipeline` process."""
    case = _build(name, request, tmp_path)
    before = _snapshot(case.output)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pipeline", *case.argv], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    _check(case, r.returncode, r.stderr.splitlines(), before)
    assert r.stdout == ""


def test_no_unsafe_loaders_in_package():
    """Checkpoints load only through torch.load(weights_only=True); nothing else in the
    package unpickles external files (np.load never with allow_pickle=True)."""
    offenders = []
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\b(pickle|cPickle|dill|joblib|cloudpickle)\.loads?\(|pd\.read_pickle|"
                         r"\.read_pickle\(|torch\.jit\.load|marshal\.loads?\(", code):
                offenders.append(f"{path.name}:{i}: {line.strip()}")
            if "torch.load(" in code and "weights_only=True" not in code:
                offenders.append(f"{path.name}:{i}: {line.strip()}")
            if re.search(r"allow_pickle\s*=\s*True", code):
                offenders.append(f"{path.name}:{i}: {line.strip()}")
    assert not offenders, offenders


# --------------------------------------------------------------------------- unwritable output
# Faults of the output location, injected deterministically (the tests run as root, for
# whom chmod does not stop a write): the check before the work sees a folder it may not
# write to; a write fails on a full disk; the final rename fails on a read-only file system.


def _fault_argv(command: str, tmp: Path, demo_dir: Path, ws: Path) -> tuple[list[str], Path]:
    """(argv, its output) of a command that writes into tmp."""
    if command == "crop":
        out = tmp / "cache_out"
        return ["crop", "--out", str(out), "--set", f"data.dir={demo_dir}", *CROP_SETS], out
    if command == "folds":
        out = tmp / "folds" / "folds.csv"
        return ["folds", "--cache", str(ws / "cache"), "--out", str(out), "--set", "folds.k=2",
                "--set", "folds.train=[0]"], out.parent
    if command == "train":
        out = tmp / "models"
        return _train_case(tmp, ws, ws / "folds.csv").argv, out
    if command == "predict":
        out = tmp / "predictions"
        return ["predict", "--cache", str(ws / "cache"), "--folds", str(ws / "folds.csv"), "--models",
                str(tmp / "models"), "--out", str(out), "--set", "predict.device=cpu"], out
    if command == "submit":
        out = tmp / "subs"
        return ["submit", "--predictions", str(_test_predictions(tmp, ws)), "--cache", str(ws / "cache"),
                "--out-dir", str(out)], out
    out = tmp / "scores"
    return ["score", str(demo_dir / "solution.csv"), "--solution", str(demo_dir / "solution.csv"),
            "--json", str(out / "score.json")], out


FAULTS = {
    # fault: (problem, the commands it is tried on)
    "read_only": (r"not writable: read-only file system", ["crop", "folds", "train", "predict", "submit", "score"]),
    "disk_full": (r"(cannot write|writing failed) \(No space left on device\)", ["crop", "folds", "submit", "score"]),
    "read_only_at_rename": (r"(cannot write|writing failed) \(Read-only file system\)", ["crop", "folds", "submit",
                                                                                       "score"]),
}


def _inject(fault: str, tmp: Path, monkeypatch) -> None:
    def under_tmp(p) -> bool:
        return str(p).startswith(str(tmp))

    if fault == "read_only":  # as a read-only mount answers: access(W_OK) fails, statvfs says ST_RDONLY
        access, statvfs = os.access, os.statvfs
        monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if mode & os.W_OK and under_tmp(p)
                            else access(p, mode, *a, **k))

        class ReadOnly:
            f_flag = os.ST_RDONLY

        monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly() if under_tmp(p) else statvfs(p))
    elif fault == "disk_full":
        def fsync(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", fsync)
    else:
        replace = os.replace

        def read_only(a, b, *args, **kwargs):
            if under_tmp(b):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(b))
            return replace(a, b, *args, **kwargs)

        monkeypatch.setattr(os, "replace", read_only)


@pytest.mark.parametrize("fault,command", [(f, c) for f, (_, cmds) in FAULTS.items() for c in cmds])
def test_unwritable_output(fault, command, demo_dir, tiny_workspace, tmp_path, monkeypatch, capsys, caplog):
    """Exit 2 and one line naming the output (no traceback, no progress line before it);
    nothing written, no temp file left."""
    from pipeline.cli import main

    argv, out = _fault_argv(command, tmp_path, demo_dir, tiny_workspace)
    monkeypatch.chdir(tmp_path)
    _inject(fault, tmp_path, monkeypatch)
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as exc:
        main(argv)
    monkeypatch.undo()
    lines = capsys.readouterr().err.splitlines() + [r.getMessage() for r in caplog.records
                                                    if r.levelno >= logging.INFO]
    assert exc.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {tmp_path}") and str(out) in lines[0], lines[0]
    assert re.search(FAULTS[fault][0], lines[0]), lines[0]
    assert not out.exists() and not list(tmp_path.rglob("*.tmp*")), list(tmp_path.rglob("*"))


def test_full_disk_while_writing_a_checkpoint_is_a_write_error(tmp_path, monkeypatch):
    """A checkpoint is serialised in memory and written like every other output: a full disk
    is one line naming it, and nothing is left behind."""
    from pipeline.core.errors import PipelineError
    from pipeline.core.io import torch_save

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(PipelineError) as e:
        torch_save(tmp_path / "m" / "last.pt", {"x": 1})
    assert e.value.format().startswith(f"{tmp_path}/m/last.pt: ") and os.strerror(errno.ENOSPC) in e.value.format()
    assert "\n" not in e.value.format()
    assert list(tmp_path.iterdir()) == []


def test_unforeseen_os_error_is_one_line(tmp_path, monkeypatch, capsys):
    """An OS error no check foresaw still ends as one line naming its file, exit 2."""
    import pipeline.stages.submit
    from pipeline.cli import main

    def broken(path, keys):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(pipeline.stages.submit, "read_predictions", broken)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["submit", "--predictions", str(tmp_path / "test.npz"), "--out-dir", str(tmp_path / "subs")])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {tmp_path}/test.npz: {os.strerror(errno.EIO)}"]


def test_check_output_names_a_folder_it_may_not_write(tmp_path, monkeypatch):
    from pipeline.core.errors import PipelineError
    from pipeline.core.io import check_output

    (tmp_path / "out").mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if mode & os.W_OK and p == tmp_path / "out"
                        else access(p, mode, *a, **k))
    with pytest.raises(PipelineError) as e:
        check_output(tmp_path / "out" / "x.csv")
    assert e.value.format() == f"{tmp_path}/out: not writable: permission denied (cannot write {tmp_path}/out/x.csv)"
    with pytest.raises(PipelineError, match="out: not writable: permission denied$"):
        check_output(tmp_path / "out", folder=True)  # a folder output is written into
