"""Frame times for the smoothers: `FrameClock` turns the times a video file or a live caller
gives (possibly missing, repeated or jumping back) into times that always increase, by one rule
for both (pipeline/formats/video.py `timed_frames_of`, pipeline/inference/live.py `Tracker.update`).

The rule: a frame's own time is kept when it comes after the previous frame's; a frame without
one, or whose time does not come after the previous frame's, comes one frame step after the
previous frame. The step is 1 / fps for a file; for a live source it is the monotonic clock's
seconds since the previous frame when the time is missing, and the last interval the caller's
times gave when a time repeats or jumps back (a restarted clock: the smoothers' dt stays a
real frame interval instead of collapsing to zero, which freezes a One Euro filter). A time that
is not a finite number is an error: no repair of it is sane."""

from __future__ import annotations

import math
import time
from typing import Callable

from pipeline.core.errors import PipelineError

# a live frame's step when neither the caller's times nor the monotonic clock give one (the
# first frames, or an injected clock that stands still): a common camera's frame interval
UNKNOWN_STEP_S = 1 / 30


class FrameClock:
    """`clock(t)` -> the frame's time in seconds, strictly after the previous one's.

    step: seconds between frames of a file (1 / fps), used for every missing or out-of-order
    time; None for a live source (see the module docstring). now: the monotonic clock (tests
    inject one)."""

    def __init__(self, step: float | None = None, now: Callable[[], float] = time.monotonic):
        if step is not None and not (math.isfinite(step) and step > 0):
            raise PipelineError(None, f"a frame step must be a positive number of seconds, got {step!r}")
        self.step, self.now = step, now
        self.prev: float | None = None  # the previous frame's time
        self.interval: float | None = None  # the last interval the caller's own times gave
        self._wall: float | None = None  # the monotonic clock at the previous frame

    def __call__(self, t: float | None = None) -> float:
        if t is not None:
            try:
                t = float(t)
            except (TypeError, ValueError):
                raise PipelineError(None, f"a frame time must be a number of seconds, got {t!r}") from None
            if not math.isfinite(t):
                raise PipelineError(None, f"a frame time must be a finite number of seconds, got {t!r}")
        wall, self._wall = self._wall, self.now()
        if self.prev is None:
            out = 0.0 if t is None else t
        elif t is not None and t > self.prev:
            out, self.interval = t, t - self.prev
        else:
            out = self.prev + self._step(t is None, None if wall is None else self._wall - wall)
        self.prev = out
        return out

    def _step(self, missing: bool, elapsed: float | None) -> float:
        """The step after the previous frame of a frame whose own time is missing or not after it."""
        if self.step is not None:
            return self.step
        if missing and elapsed:
            return elapsed
        return self.interval or elapsed or UNKNOWN_STEP_S
