"""The package's map (docs/design.md, "Layers"): each folder of pipeline/ is a layer, stages
never import each other, nothing imports upwards, no module sits outside the folders, and
there is no import loop. Function-level imports count: they are imports all the same. And
every third-party module it imports is declared in pyproject.toml."""

from __future__ import annotations

import ast
import re
import sys

import pytest

from pipeline.core.digest import module_file, module_imports

from helpers import REPO

# The folders of the package, lowest first. A module's layer is its folder (cli.py and
# __main__.py, at the top, are the cli layer); it may import its own folder and the layers
# below. Folders that share a layer may import each other (the loop test keeps them honest).
LAYERS = {
    "core": ["core"],              # errors, atomic writes, params, devices, fault injection
    "keypoints": ["keypoints"],    # schema, flip, crop geometry, input contract, scores, drawing
    "models": ["models"],          # networks and their preset registry
    "formats": ["formats"],        # one module per file passed between stages
    "library": ["detection", "synth"],  # face detectors; the synthetic face set
    "inference": ["inference"],    # prediction on crops and photos (torch or onnxruntime)
    "training": ["training"],      # augmentation, loader, losses, the training loop
    "stages": ["stages"],          # one DVC stage each
    "tools": ["tools"],            # commands outside the DVC graph
    "cli": [""],                   # the `pipeline` command
}
FOLDER_RANK = {folder: i for i, folders in enumerate(LAYERS.values()) for folder in folders}


def layer_of(mod: str) -> int | None:
    """pipeline.<folder>.x -> the folder's rank; pipeline.cli -> the cli layer; None outside every folder."""
    parts = mod.split(".")
    folder = parts[1] if len(parts) > 2 or (REPO / "pipeline" / parts[1]).is_dir() else ""
    if folder == "" and parts[1] not in ("cli", "__main__"):
        return None
    return FOLDER_RANK.get(folder)


def is_stage(mod: str) -> bool:
    return mod.startswith("pipeline.stages.")


def _modules() -> list[str]:
    out = []
    for p in sorted((REPO / "pipeline").rglob("*.py")):
        parts = p.relative_to(REPO).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return [m for m in out if m != "pipeline"]


def _graph() -> dict[str, set[str]]:
    """Module -> the pipeline modules it imports (package __init__ re-exports resolved)."""
    mods = set(_modules())
    return {m: {i for i in module_imports(module_file(m), m) if i in mods and i != m} for m in mods}


def test_every_module_has_a_layer():
    missing = sorted(m for m in _modules() if layer_of(m) is None)
    assert not missing, f"{missing} sit outside every layer folder: move them, or add the folder to LAYERS"
    folders = {p.name for p in (REPO / "pipeline").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(FOLDER_RANK) - {""}, "LAYERS and the package's folders differ"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    names = list(LAYERS)
    bad = []
    for mod, imports in sorted(graph.items()):
        for dep in sorted(imports):
            if layer_of(dep) > layer_of(mod):
                bad.append(f"{mod} ({names[layer_of(mod)]}) imports {dep} ({names[layer_of(dep)]})")
            elif is_stage(mod) and is_stage(dep):
                bad.append(f"stage {mod} imports stage {dep}")
    return bad


def find_loop(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that returns to its start), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "open"
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return path[path.index(d):] + [d]
            if d not in state and (loop := visit(d)):
                return loop
        state[m] = "done"
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (loop := visit(m)):
            return loop
    return None


def test_nothing_imports_upwards_and_stages_do_not_import_each_other():
    bad = layer_violations(_graph())
    assert not bad, "\n".join(bad)


def test_no_import_loop():
    loop = find_loop(_graph())
    assert loop is None, "import loop: " + " -> ".join(loop or [])


def test_the_checks_see_a_violation():
    """Control: the same checks on graphs that break the rules, a module outside every
    folder has no layer, and the scan sees function-level imports (the cli imports the
    models package inside `models_cmd`, to keep `pipeline --help` free of torch)."""
    assert layer_violations({"pipeline.formats.cache": {"pipeline.stages.crop"}}) == [
        "pipeline.formats.cache (formats) imports pipeline.stages.crop (stages)"]
    assert layer_violations({"pipeline.stages.submit": {"pipeline.stages.predict"}}) == [
        "stage pipeline.stages.submit imports stage pipeline.stages.predict"]
    assert find_loop({"pipeline.tools.viz": {"pipeline.tools.detect"}, "pipeline.tools.detect": {"pipeline.tools.viz"}}) == [
        "pipeline.tools.detect", "pipeline.tools.viz", "pipeline.tools.detect"]
    assert layer_of("pipeline.stray") is None and layer_of("pipeline.stages.crop") == FOLDER_RANK["stages"]
    assert "pipeline.models" in _graph()["pipeline.cli"]


# import name -> distribution, where they differ; facenet_pytorch is installed with
# --no-deps (its wheel pins an old torch: docs/pictures.md), so no extra can name it
DISTRIBUTION = {"cv2": "opencv-python-headless", "yaml": "pyyaml", "PIL": "pillow", "dlib": "dlib-bin",
                "face_recognition_models": "face-recognition-models"}
NO_DEPS_INSTALL = {"facenet_pytorch"}


def _third_party_imports() -> dict[str, str]:
    """Top-level name of every non-stdlib, non-pipeline module the package imports -> a
    file that imports it (function-level imports included)."""
    out: dict[str, str] = {}
    for p in sorted((REPO / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "pipeline":
                    out.setdefault(top, str(p.relative_to(REPO)))
    return out


def test_every_third_party_import_is_declared_in_pyproject():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    declared = {re.split(r"[<>=!~;\[ ]", s, maxsplit=1)[0].lower().replace("_", "-") for s in specs}
    imports = _third_party_imports()
    assert {"torch", "pydantic", "PIL", "cv2"} <= set(imports)  # control: the scan sees them
    missing = {name: where for name, where in imports.items() if name not in NO_DEPS_INSTALL
               and DISTRIBUTION.get(name, name).lower().replace("_", "-") not in declared}
    assert not missing, f"imported but not in pyproject.toml: {missing}"
