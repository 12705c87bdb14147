"""Helpers the tests share (fixtures stay in conftest.py): import with `from helpers import ...`."""

from pipeline.core.config import SECTIONS, is_speed_only, section_fields


def speed_only_keys() -> set[str]:
    """The params marked speed_only (pipeline/core/config.py), as 'section.key'."""
    return {f"{s}.{k}" for s in SECTIONS for k, f in section_fields(s).items() if is_speed_only(f)}
