"""Deterministic fault injection for tests: `PIPELINE_KILL_AT_STEP=N` makes the trainer
SIGKILL itself right after optimizer step N (counted over the whole run, as
`scheduler_step` in the checkpoints), so a test kills a run mid-epoch without racing a
clock; `PIPELINE_KILL_AT=<point>` kills at a named point (e.g. `crop:train`, after the
train split is written). Unset (always, outside tests) they do nothing."""

from __future__ import annotations

import os
import signal

KILL_AT_STEP = "PIPELINE_KILL_AT_STEP"
KILL_AT = "PIPELINE_KILL_AT"


def maybe_kill(step: int) -> None:
    """SIGKILL this process when `step` is the one named by PIPELINE_KILL_AT_STEP."""
    value = os.environ.get(KILL_AT_STEP)
    if value and value.strip().isdigit() and int(value) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def kill_point(name: str) -> None:
    """SIGKILL this process when `name` is the point named by PIPELINE_KILL_AT."""
    if os.environ.get(KILL_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)
