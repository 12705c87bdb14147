"""The DVC graph never serves a stale result.

- Code deps: each stage lists every `pipeline` module its command imports (directly or
  through other modules, function-level imports included), so a code change re-runs it.
- Params: changing one param of a stage and running `dvc repro` re-runs that stage and
  changes its output (DVC's run cache ignores params named `size`/`nfiles`,
  treeverse/dvc#10296; hence `crop.side`). Runs a tiny pipeline (40 demo faces, 16 px,
  1 fold, 1 epoch); skipped when dvc is not installed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import module_file, module_imports
from pipeline.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
# argument parsing and error formatting: no output depends on them
NOT_CODE_DEPS = {"pipeline/__init__.py", "pipeline/__main__.py", "pipeline/cli.py", "pipeline/errors.py"}


def imported_modules(mod: str) -> set[str]:
    """The transitive closure of a module's pipeline imports."""
    seen: set[str] = set()
    todo = [mod]
    while todo:
        m = todo.pop()
        f = module_file(m)
        if f is None or m in seen:
            continue
        seen.add(m)
        todo += module_imports(f, m)
    return seen


def code_deps_of(mods: set[str]) -> set[str]:
    """Module names -> dvc.yaml code deps: pipeline/x.py, or the package folder pipeline/models."""
    deps = set()
    for m in mods:
        parts = m.split(".")
        deps.add(f"pipeline/{parts[1]}" if len(parts) > 2 or module_file(m).name == "__init__.py"
                 else str(module_file(m).relative_to(REPO)))
    return deps - NOT_CODE_DEPS


def _stages() -> dict[str, dict]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, st in stages.items():
        if "foreach" in st:
            st = st["do"]
        out[name] = st
    return out


def test_imports_are_found():
    """Control: the import scan sees function-level imports and relative ones."""
    mods = imported_modules("pipeline.predict")
    # checkpoint and flip are imported inside functions, two modules down (inference)
    assert {"pipeline.checkpoint", "pipeline.inference", "pipeline.geometry", "pipeline.flip",
            "pipeline.preprocess"} <= mods
    assert "pipeline/models" in code_deps_of(mods) and "pipeline/cli.py" not in code_deps_of(mods)


@pytest.mark.parametrize("stage", list(_stages()))
def test_code_deps_match_the_imports_of_the_stage_command(stage):
    st = _stages()[stage]
    argv = st["cmd"].split()
    assert argv[0] == "pipeline" and argv[1] in COMMANDS, st["cmd"]
    module = COMMANDS[argv[1]].split(":")[0]
    want = code_deps_of(imported_modules(module))
    have = {d for d in st.get("deps", []) if d.startswith("pipeline/")}
    assert not want - have, f"dvc.yaml stage {stage}: add deps {sorted(want - have)}"
    assert not have - want, f"dvc.yaml stage {stage}: {sorted(have - want)} not imported by `{st['cmd']}`"


# --------------------------------------------------------------------------- params

TINY = {"demo": {"n_train": 40, "n_test": 6}, "crop": {"side": 16, "n_jobs": 1}, "folds": {"k": 2, "train": [0]},
        "model": {"input_size": 32}, "train": {"epochs": 1, "batch_size": 8, "device": "cpu", "randaug_n": 0},
        "predict": {"device": "cpu"}}
# stage, param, new value, outputs that must change. Downstream stages first: each stage's
# upstream outputs are then still those of the first full run, so only its param changed.
CHANGES = [
    ("submit", "submit.name", "other", ["submissions"]),
    ("evaluate", "submit.name", "other", ["metrics/test.json"]),
    ("predict", "predict.tta", "none", ["predictions/test.npz"]),  # oof.npz holds both, whatever tta
    ("train@0", "train.lr", 0.01, ["models/fold0/best.pt", "models/fold0/params.resolved.yaml"]),
    ("folds", "folds.k", 3, ["folds/folds.csv"]),
    ("crop", "crop.side", 24, ["data/cache/train/faces.npy", "data/cache/test/faces.npy"]),
    ("demo-data", "demo.seed", 1, ["data/demo"]),
]


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted([path] if path.is_file() else path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path.parent)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory):
    dvc = Path(sys.executable).parent / "dvc"
    if not dvc.exists() and shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    root = tmp_path_factory.mktemp("dvcproj")
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copytree(REPO / "pipeline", root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in TINY.items():
        params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO), "DVC_NO_ANALYTICS": "1"}

    def run(*args: str) -> str:
        r = subprocess.run([str(dvc) if dvc.exists() else "dvc", *args], cwd=root, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
        return r.stdout + r.stderr

    run("init", "--no-scm", "-q")
    run("repro")  # fills the run cache with every stage's first run
    return root, run


def test_every_param_change_reruns_its_stage(dvc_project):
    root, run = dvc_project
    for stage, key, value, outs in CHANGES:
        before = {o: _digest(root / o) if (root / o).exists() else None for o in outs}
        params = yaml.safe_load((root / "params.yaml").read_text())
        section, name = key.split(".")
        assert name in params[section], key
        params[section][name] = value
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        log = run("repro", "--single-item", stage)
        assert f"Running stage '{stage}'" in log and "is cached" not in log, (key, log[-2000:])
        for o in outs:
            assert (root / o).exists() and _digest(root / o) != before[o], f"{key}={value}: {o} did not change"
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert lock["crop"]["params"]["params.yaml"]["crop"]["side"] == 24


def test_control_dvc_run_cache_ignores_a_param_named_size(tmp_path):
    """Why crop.size was renamed: with the installed DVC a stage whose param `size` changed
    is restored from the run cache with its old output. Skips once DVC is fixed."""
    dvc = Path(sys.executable).parent / "dvc"
    if not dvc.exists():
        pytest.skip("dvc is not installed")
    (tmp_path / "params.yaml").write_text("a:\n  size: 30\n  count: 30\n")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"gen": {
        "cmd": f"{sys.executable} -c \"import yaml; open('out.txt', 'w').write(str(yaml.safe_load("
               "open('params.yaml'))['a']))\"",
        "params": ["a"], "outs": ["out.txt"]}}}))
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}

    def run(*args):
        r = subprocess.run([str(dvc), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]

    run("init", "--no-scm", "-q")
    run("repro")
    (tmp_path / "params.yaml").write_text("a:\n  size: 40\n  count: 30\n")
    run("repro")
    out = (tmp_path / "out.txt").read_text()
    if "'size': 40" in out:
        pytest.skip("this DVC keeps params named size in the run cache key (treeverse/dvc#10296 fixed)")
    assert out == "{'size': 30, 'count': 30}"  # stale: the reason for crop.side
