"""Reading an exported model: a missing or folder path is one line naming it."""

import pytest

from pipeline.core.errors import PipelineError
from pipeline.formats.onnx_export import read_export


def _problem(path) -> str:
    with pytest.raises(PipelineError) as e:
        read_export(path)
    return str(e.value)


def test_read_export_missing_or_folder_model_or_json(tmp_path):
    onnx = tmp_path / "m.onnx"
    assert _problem(onnx) == f"{onnx}: exported model not found"
    onnx.mkdir()
    assert _problem(onnx) == f"{onnx}: is a directory, expected an exported ONNX file"
    onnx.rmdir()
    onnx.write_bytes(b"onnx")
    js = tmp_path / "m.json"
    assert _problem(onnx) == f"{js}: missing: the JSON written beside m.onnx by `pipeline export`"
    js.mkdir()
    assert _problem(onnx) == f"{js}: is a directory, expected the export JSON file"
