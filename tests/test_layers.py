"""The package's map (docs/design.md, "Layers"): formats, geometry and metrics sit below
every stage, stages never import each other, nothing imports upwards, and there is no
import loop. Function-level imports count: they are imports all the same."""

from __future__ import annotations

from conftest import REPO, module_file, module_imports

# lowest first; a module may import its own layer and the layers below it
LAYERS = {
    "foundation": ["errors", "io", "faults", "flip", "config", "schema", "device"],
    "formats": ["dataset", "geometry", "preprocess", "metrics", "calibrate", "cache", "foldsfile", "predictions",
                "submission", "draw", "haar"],
    "library": ["models", "models.layers", "models.head", "models.registry", "models.resunet", "models.baselines",
                "losses", "augment", "data", "checkpoint", "onnx_model", "inference", "backend", "facedet",
                "photos"],
    "stages": ["demo", "crop", "folds", "train", "predict", "submit", "evaluate"],
    "tools": ["export", "viz", "detect", "morph", "bench"],
    "cli": ["cli", "__main__"],
}
LAYER_OF = {f"pipeline.{m}": i for i, mods in enumerate(LAYERS.values()) for m in mods}
STAGES = {f"pipeline.{m}" for m in LAYERS["stages"]}


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
    missing = sorted(set(_modules()) - set(LAYER_OF))
    assert not missing, f"add {missing} to LAYERS here and to docs/design.md"
    assert not set(LAYER_OF) - set(_modules()), "LAYERS names a module that does not exist"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, imports in sorted(graph.items()):
        for dep in sorted(imports):
            if LAYER_OF[dep] > LAYER_OF[mod]:
                bad.append(f"{mod} ({list(LAYERS)[LAYER_OF[mod]]}) imports {dep} ({list(LAYERS)[LAYER_OF[dep]]})")
            elif mod in STAGES and dep in STAGES:
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
    """Control: the same checks on graphs that break the rules, and the scan sees
    function-level imports (train imports inference inside `evaluate`)."""
    assert layer_violations({"pipeline.cache": {"pipeline.crop"}}) == [
        "pipeline.cache (formats) imports pipeline.crop (stages)"]
    assert layer_violations({"pipeline.submit": {"pipeline.predict"}}) == [
        "stage pipeline.submit imports stage pipeline.predict"]
    assert find_loop({"pipeline.viz": {"pipeline.detect"}, "pipeline.detect": {"pipeline.viz"}}) == [
        "pipeline.detect", "pipeline.viz", "pipeline.detect"]
    assert "pipeline.inference" in _graph()["pipeline.train"]
