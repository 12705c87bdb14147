"""Configuration: defaults, then the params file, then `--set key=value` overrides.

Every stage reads only its own sections (as DVC's example-get-started does) and writes the
resolved values beside its outputs. Unknown keys and values of the wrong type are rejected
with the file or `--set` and the key named, never silently ignored. What each param is (its
type, range, doc, the rules between keys) is pipeline/core/params_schema.py; this module
reads params files and overrides, remembers where each value came from, and gives the
commands their `--params` / `--set` options."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any, Iterable

import click
import yaml
from pydantic import BaseModel, ValidationError

from pipeline.core.errors import PipelineError
from pipeline.core.io import input_file, write_text
from pipeline.core.params_schema import (
    DEFAULTS,
    SWITCH_DEFAULTS,
    Config,
    check_params,
    error_line,
    is_runtime,
    is_speed_only,
    section_fields,
)

# ---------------------------------------------------------------- loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (plain YAML keeps the last)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicated key '{key}' (also on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_params_file(path: str | os.PathLike) -> dict:
    """A params YAML file as a dict ({} when empty); one-line errors naming the file."""
    path = Path(path)
    input_file(path, "params file not found", "a params YAML file")
    try:
        loaded = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark else ""
        raise PipelineError(path, f"invalid YAML{line}: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError:
        raise PipelineError(path, "not a text file") from None
    return {} if loaded is None else loaded


def parse_override(text: str, cfg: Config | None = None) -> dict:
    """'train.lr=0.1' -> {'train': {'lr': 0.1}}; the value is parsed as YAML.

    A path below a mapping param sets one key of it: with `cfg`, 'model.options.width=0.5'
    -> {'model': {'options': {**cfg.model.options, 'width': 0.5}}}, so the options a recipe
    set stay (without the current value the mapping holds only the new key)."""
    if "=" not in text:
        raise PipelineError("--set", f"expected key=value, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:  # ReaderError (a control character) has no .problem, only a message
        problem = e.problem if isinstance(e, yaml.MarkedYAMLError) else str(e).splitlines()[0]
        raise PipelineError("--set", f"cannot parse value of '{key}': {problem}") from None
    if isinstance(value, str):
        try:  # YAML 1.1 reads '1e30' as a string; on the command line it means a number
            value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "+inf") else value
        except ValueError:
            pass
    parts = key.strip().split(".")
    if len(parts) > 2 and cfg is not None:
        section = getattr(cfg, parts[0], None)
        current = getattr(section, parts[1], None) if isinstance(section, BaseModel) else None
        if isinstance(current, dict):  # copy the mapping down the path, then set the leaf
            mapping = copy.deepcopy(current)
            cur = mapping
            for p in parts[2:-1]:
                if not isinstance(cur.get(p), dict):
                    cur[p] = {}
                cur = cur[p]
            cur[parts[-1]] = value
            return {parts[0]: {parts[1]: mapping}}
    node: dict = {}
    cur = node
    for p in parts[:-1]:
        cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value
    return node


def merge(cfg: Config, update: Any, source: str) -> Config:
    """`cfg` with the sections of `update` (a parsed params file or --set) merged in: a
    leaf replaces the value (a mapping such as model.options as a whole), and the result is
    checked. Errors name `source` and the key."""
    if not isinstance(update, dict):
        raise PipelineError(source, "'top level' must be a mapping")
    data = cfg.model_dump()
    for name, values in update.items():
        known = isinstance(values, dict) and isinstance(data.get(name), dict)
        data[name] = {**data[name], **values} if known else values  # the rest is pydantic's to refuse
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise PipelineError(source, error_line(e)) from None


_SOURCE: dict[str, Any] = {"file": "params.yaml", "set": {}}  # of the last load_config (one per CLI process)


def _set_texts(overrides: Iterable[str]) -> dict[str, str]:
    """{key: 'key=value'} of `--set` overrides."""
    return {t.split("=", 1)[0].strip(): t for t in overrides}


def _set_text(keys: Iterable[str], sets: dict[str, str]) -> str | None:
    """`--set key=value` of the override in `sets` (a `_set_texts`) that set the first of
    `keys` any of them set (the key itself or its section), else None."""
    for key in keys:
        for set_key, text in reversed(list(sets.items())):
            if key == set_key or key.startswith(set_key + "."):
                return f"--set {text}"
    return None


def params_source(*keys: str) -> str:
    """Where the current value of `keys` came from, for errors about a param found after
    loading: `--set key=value` when an override set it (or its section), else the params
    file read (so `--params other.yaml` is blamed, not params.yaml)."""
    return _set_text(keys, _SOURCE["set"]) or _SOURCE["file"]


def switch_on(value: str, auto: bool, key: str) -> bool:
    """A switch's setting as a bool: on, off, or `auto` (the field's documented choice, which
    the caller knows). The one place "auto"/"on"/"off" is read; a bad value (from code that
    did not load it through Config) is blamed on `key`."""
    if value not in SWITCH_DEFAULTS:
        raise PipelineError(params_source(key), f"{key.split('.')[-1]} must be auto|on|off, got '{value}'")
    return value == "on" or (value == "auto" and auto)


def with_overrides(cfg: Config, overrides: Iterable[str]) -> Config:
    """`cfg` with `key=value` overrides merged in, checked as --set's, then the rules
    between keys checked on the result (`check_params`)."""
    overrides = list(overrides)
    for text in overrides:
        cfg = merge(cfg, parse_override(text, cfg), f"--set {text}")
    sets = _set_texts(overrides)

    def blame(*keys: str) -> str:  # these overrides first: a caller's (bench variants) are not in _SOURCE
        return _set_text(keys, sets) or params_source(*keys)

    check_params(cfg, blame)
    return cfg


def load_config(params: str | os.PathLike | None = "params.yaml", overrides: Iterable[str] = ()) -> Config:
    """Defaults, then `params` (a missing default params.yaml means defaults), then overrides."""
    overrides = list(overrides)
    _SOURCE["file"] = "params.yaml" if params is None else str(params)
    _SOURCE["set"] = _set_texts(overrides)
    cfg = DEFAULTS
    if params is not None:
        path = Path(params)
        if path.exists() or str(params) != "params.yaml":  # only the default may be missing
            cfg = merge(cfg, read_params_file(path), str(path))
    return with_overrides(cfg, overrides)


# ---------------------------------------------------------------- what results depend on


def result_params(cfg: Config | dict, sections: Iterable[str], drop_runtime: bool = False,
                  exclude: Iterable[str] = ()) -> dict[str, dict]:
    """The sections' params less the speed-only ones (and the runtime ones with
    `drop_runtime`, and the keys `exclude`): what a stage's outputs depend on. `cfg` may be
    the dict a checkpoint stored (its unknown keys are kept: they make a resume key differ,
    as they should)."""
    data = cfg.model_dump() if isinstance(cfg, Config) else cfg
    exclude = set(exclude)

    def kept(s: str, k: str) -> bool:
        field = section_fields(s).get(k)
        if f"{s}.{k}" in exclude:
            return False
        return field is None or not (is_speed_only(field) or (drop_runtime and is_runtime(field)))

    return {s: {k: v for k, v in data.get(s, {}).items() if kept(s, k)} for s in sections}


def write_resolved(cfg: Config, out_dir: str | os.PathLike, sections: Iterable[str],
                   name: str = "params.resolved.yaml", exclude: Iterable[str] = ()) -> Path:
    """Write the sections a stage used beside its outputs, so a result names its config
    (less the keys `exclude`, which the stage does not read)."""
    out = Path(out_dir) / name
    write_text(out, yaml.safe_dump(result_params(cfg, sections, exclude=exclude), sort_keys=False))
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 0.1}} -> {'train.lr': 0.1}; mappings that are values (model.options)
    stay whole."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and not prefix and v:
            out.update(flatten(v, f"{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def params_options(fn):
    """Add `--params PATH` and repeatable `--set key=value`, passed as `params_path` and
    `overrides` (for a command that hands them on to others, e.g. child processes)."""
    fn = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                      help="override a param, e.g. --set train.lr=0.1 or one model option: "
                           "--set model.options.decoder_levels=4 (repeatable)")(fn)
    return click.option("--params", "params_path", default="params.yaml", show_default=True,
                        help="params YAML file (missing default file = built-in defaults)")(fn)


def config_options(fn):
    """`params_options`, resolved: pass the config as `cfg`."""

    @params_options
    @functools.wraps(fn)
    def wrapper(*args, params_path, overrides, **kwargs):
        return fn(*args, cfg=load_config(params_path, overrides), **kwargs)

    return wrapper
