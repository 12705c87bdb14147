"""Content identities: the sha256 of a file, of a folder's files, and of the package's own
code that a command imports (its import closure, function-level imports included, as
dvc.yaml's code deps list it). A training's resume key names its inputs by these
(pipeline/training/identity.py), predictions name the checkpoints they were made from, and
tests/test_dvc.py checks dvc.yaml's code deps with the same import scan."""

from __future__ import annotations

import ast
import hashlib
import io
import os
import tokenize
from pathlib import Path
from typing import Iterable

from pipeline.core.errors import PipelineError

# the folder holding the `pipeline` package (its modules are read as files, never imported)
ROOT = Path(__file__).resolve().parents[2]
# argument parsing, error formatting and the Python API's lazy import (pipeline/__init__.py):
# no output depends on them (dvc.yaml leaves them out)
NOT_CODE_DEPS = frozenset({"pipeline/__init__.py", "pipeline/__main__.py", "pipeline/cli.py",
                           "pipeline/core/errors.py"})
# pipeline/models/__init__.py imports every preset: importing one of its modules runs them all,
# so the folder is one dep
WHOLE_FOLDERS = ("pipeline/models",)
_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike, missing: str = "file not found", kind: str = "file") -> str:
    """The sha256 of a file's bytes, read in chunks. A missing file is a one-line error
    naming it (`missing`, e.g. "image not found"), and so is one that cannot be read, a
    folder included ("unreadable <kind> (<reason>)")."""
    path = Path(path)
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except FileNotFoundError:
        raise PipelineError(path, missing) from None
    except OSError as e:
        raise PipelineError(path, f"unreadable {kind} ({e.strerror or type(e).__name__})") from None
    return h.hexdigest()


def folder_sha256(folder: str | os.PathLike, skip: Iterable[str] = ()) -> str:
    """The sha256 of every file under `folder` but those named in `skip` (paths relative to
    it): names (relative) and bytes, in name order."""
    folder, skip = Path(folder), set(skip)
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        name = p.relative_to(folder).as_posix()
        if name not in skip:
            h.update(len(name).to_bytes(8, "little") + name.encode() + bytes.fromhex(file_sha256(p)))
    return h.hexdigest()


# ------------------------------------------------------------------ the package's own code


def module_file(mod: str, root: Path = ROOT) -> Path | None:
    """The file of module `mod` ('pipeline.training.loop') under `root`, or None."""
    p = root.joinpath(*mod.split("."))
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


def imported_modules(mod: str, root: Path = ROOT) -> set[str]:
    """The transitive closure of a module's pipeline imports (itself included), with the
    packages holding each module: importing `pipeline.training.loop` runs
    pipeline/training/__init__.py first (not `pipeline` itself: a NOT_CODE_DEPS file whose
    one import is the API's, on first use)."""
    seen: set[str] = set()
    todo = [mod]
    while todo:
        m = todo.pop()
        f = module_file(m, root)
        if f is None or m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))] + list(module_imports(f, m))
    return seen


def _runs_code(path: Path) -> bool:
    """Whether the file holds more than a docstring (a package's __init__.py often does not)."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return bool(body)


def code_deps(mods: Iterable[str], root: Path = ROOT) -> set[str]:
    """Module names -> dvc.yaml code deps (paths relative to `root`): the module's file, or
    the whole folder of WHOLE_FOLDERS; less NOT_CODE_DEPS and the files that run nothing (a
    package's __init__.py holding only its docstring)."""
    deps = set()
    for m in mods:
        f = module_file(m, root)
        if f is None or not _runs_code(f):
            continue
        rel = f.relative_to(root).as_posix()
        deps.add(next((d for d in WHOLE_FOLDERS if rel.startswith(d + "/")), rel))
    return deps - NOT_CODE_DEPS


def _code_tokens(path: Path) -> bytes:
    """The file's tokens less comments and blank lines: an edit that changes no code (a
    comment, spacing at line ends, an empty line) leaves them as they were."""
    skip = (tokenize.COMMENT, tokenize.NL)
    toks = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return "\0".join(f"{t.type}:{t.string}" for t in toks if t.type not in skip).encode()


def source_sha256(module: str, root: Path = ROOT) -> str:
    """The sha256 of the code `module` runs: the tokens of every file of its code deps
    (`code_deps` of its import closure, a whole folder's .py files), by path."""
    files = []
    for dep in sorted(code_deps(imported_modules(module, root), root)):
        p = root / dep
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    h = hashlib.sha256()
    for p in files:
        name = p.relative_to(root).as_posix().encode()
        data = _code_tokens(p)
        h.update(len(name).to_bytes(8, "little") + name + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()
