"""Frame times: one repair rule for video files and live callers."""

import math

import pytest

from pipeline.core.errors import PipelineError
from pipeline.keypoints.clock import FrameClock


class Wall:
    """An injected monotonic clock that advances `step` seconds per reading."""

    def __init__(self, step):
        self.t, self.step = 100.0, step

    def __call__(self):
        self.t += self.step
        return self.t


def test_a_files_missing_or_out_of_order_times_come_one_frame_after_the_previous():
    clock = FrameClock(0.04)
    got = [clock(t) for t in (0.0, 0.04, 0.04, None, 0.2, 0.1, 0.3)]
    assert got == pytest.approx([0.0, 0.04, 0.08, 0.12, 0.2, 0.24, 0.3])


def test_a_live_clock_that_jumps_back_keeps_the_last_interval():
    # the caller's clock restarts: the frames go on at the interval its times last gave,
    # never at dt 0 (which freezes a One Euro filter), and its own times count again once
    # they pass the repaired ones
    clock = FrameClock(now=Wall(0.001))
    got = [clock(t) for t in (10.0, 10.1, 0.0, 0.1, 0.2, 10.5)]
    assert got == pytest.approx([10.0, 10.1, 10.2, 10.3, 10.4, 10.5])


def test_a_missing_live_time_is_the_monotonic_clock_since_the_previous_frame():
    clock = FrameClock(now=Wall(0.03))
    assert [clock(t) for t in (None, None, 5.0, None)] == pytest.approx([0.0, 0.03, 5.0, 5.03])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "soon"])
def test_a_time_that_is_no_finite_number_is_a_one_line_error(bad):
    clock = FrameClock()
    clock(0.0)
    with pytest.raises(PipelineError, match="frame time must be a"):
        clock(bad)
    assert clock(0.1) == pytest.approx(0.1)  # the bad time left the clock as it was
