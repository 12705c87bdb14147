"""pipeline.core.digest: content hashes of files, folders and of the code a command imports
(what a training's resume key names, issue 48 finding 1)."""

import shutil

import pytest

from helpers import REPO


@pytest.fixture
def package_copy(tmp_path):
    shutil.copytree(REPO / "pipeline", tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_code_digest_follows_the_code_training_imports_and_not_its_comments(package_copy):
    from pipeline.core.digest import source_sha256

    root = package_copy
    base = source_sha256("pipeline.stages.train", root)
    assert base == source_sha256("pipeline.stages.train", REPO)  # the copy is this checkout's code
    loop = root / "pipeline" / "training" / "loop.py"
    text = loop.read_text()
    loop.write_text(text.replace("\n\n\n", "\n\n\n# a comment on its own line\n", 1) + "\n# one more\n\n")
    assert source_sha256("pipeline.stages.train", root) == base  # comments and blank lines change no weights
    loop.write_text(text + "\nSOMETHING = 1\n")
    assert source_sha256("pipeline.stages.train", root) != base
    loop.write_text(text)
    # a module training imports two levels down, and any file of pipeline/models (one DVC dep)
    for rel in ("pipeline/keypoints/metrics.py", "pipeline/models/baselines.py"):
        f = root / rel
        before = f.read_text()
        f.write_text(before + "\nSOMETHING = 1\n")
        assert source_sha256("pipeline.stages.train", root) != base, rel
        f.write_text(before)
    # a module training never imports
    blend = root / "pipeline" / "tools" / "blend.py"
    blend.write_text(blend.read_text() + "\nSOMETHING = 1\n")
    assert source_sha256("pipeline.stages.train", root) == base


def test_the_train_stage_code_is_what_dvc_yaml_lists():
    """The files hashed are the train stage's code deps of dvc.yaml (tests/test_dvc.py
    checks those against the imports with the same functions)."""
    import yaml

    from pipeline.core.digest import code_deps, imported_modules

    train = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]["do"]
    listed = {d for d in train["deps"] if d.startswith("pipeline/")}
    assert code_deps(imported_modules("pipeline.stages.train")) == listed


def test_file_and_folder_digests_change_with_content_and_names(tmp_path):
    from pipeline.core.digest import file_sha256, folder_sha256

    d = tmp_path / "d"
    d.mkdir()
    (d / "a.npy").write_bytes(b"one")
    (d / "b.csv").write_bytes(b"two")
    h = folder_sha256(d)
    assert file_sha256(d / "a.npy") != file_sha256(d / "b.csv")
    (d / "a.npy").write_bytes(b"onf")
    assert folder_sha256(d) != h
    (d / "a.npy").write_bytes(b"one")
    assert folder_sha256(d) == h
    (d / "b.csv").rename(d / "c.csv")  # same bytes under another name
    assert folder_sha256(d) != h


def test_file_digest_reads_in_chunks_and_names_a_missing_or_unreadable_file(tmp_path):
    """The one file hash (crop's photos, export's ONNX and checkpoint, training's folds.csv):
    a file longer than one read chunk hashes as its whole bytes; a missing file and a folder
    are one-line errors with the caller's words."""
    import hashlib

    from pipeline.core.digest import _CHUNK, file_sha256
    from pipeline.core.errors import PipelineError

    big = tmp_path / "big.bin"
    data = bytes(range(256)) * (_CHUNK // 256 + 3)
    big.write_bytes(data)
    assert file_sha256(big) == hashlib.sha256(data).hexdigest()
    with pytest.raises(PipelineError, match="image not found") as e:
        file_sha256(tmp_path / "none.jpg", "image not found", "image")
    assert e.value.path == str(tmp_path / "none.jpg")
    with pytest.raises(PipelineError, match="file not found"):
        file_sha256(tmp_path / "none.csv")
    with pytest.raises(PipelineError, match=r"unreadable image \(Is a directory\)"):
        file_sha256(tmp_path, "image not found", "image")
