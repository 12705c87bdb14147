from pathlib import Path

import pytest
import yaml

from pipeline.config import DEFAULTS, load_config, parse_override, write_resolved
from pipeline.errors import PipelineError

REPO = Path(__file__).resolve().parents[1]


def test_params_yaml_matches_defaults_except_data_dir():
    # params.yaml is the documented default run: it must not drift from the code defaults
    cfg = load_config(REPO / "params.yaml")
    assert cfg["data"]["dir"] == "data/demo"
    cfg["data"]["dir"] = None
    assert cfg == DEFAULTS


def test_override_beats_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("train:\n  lr: 0.5\n  epochs: 3\n")
    cfg = load_config(p, ["train.lr=0.1", "model.options={width: 0.5}"])
    assert cfg["train"]["lr"] == 0.1 and cfg["train"]["epochs"] == 3
    assert cfg["model"]["options"] == {"width": 0.5}
    assert cfg["train"]["batch_size"] == DEFAULTS["train"]["batch_size"]


def test_int_accepted_for_float_and_stored_as_float(tmp_path):
    cfg = load_config(None, ["train.lr=1"])
    assert cfg["train"]["lr"] == 1.0 and isinstance(cfg["train"]["lr"], float)


@pytest.mark.parametrize("text, needle", [
    ("train:\n  lrr: 0.1\n", "unknown key 'train.lrr'"),
    ("nosuch:\n  a: 1\n", "unknown key 'nosuch'"),
    ("train:\n  epochs: ten\n", "'train.epochs' must be int"),
    ("train:\n  epochs: 2.5\n", "'train.epochs' must be int"),
    ("predict:\n  tta: [1]\n", "'predict.tta' must be string"),
    ("train: 3\n", "'train' must be a mapping"),
    ("train:\n  lr: [\n", "invalid YAML"),
])
def test_bad_params_file_names_file_and_key(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(PipelineError) as e:
        load_config(p)
    assert needle in str(e.value) and str(p) in str(e.value)


def test_missing_explicit_params_file_is_an_error(tmp_path):
    with pytest.raises(PipelineError, match="params file not found"):
        load_config(tmp_path / "nope.yaml")


def test_parse_override_nested_and_malformed():
    assert parse_override("a.b.c=3") == {"a": {"b": {"c": 3}}}
    with pytest.raises(PipelineError):
        parse_override("novalue")


def test_write_resolved_only_named_sections(tmp_path):
    cfg = load_config(None, ["train.epochs=7"])
    path = write_resolved(cfg, tmp_path, ["train"])
    data = yaml.safe_load(path.read_text())
    assert list(data) == ["train"] and data["train"]["epochs"] == 7
