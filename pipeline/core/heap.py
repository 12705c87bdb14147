"""Keep freed memory in the process heap (glibc) so big tensors do not page-fault every step.

glibc serves a block above its mmap threshold (at most 32 MiB on 64-bit) with a fresh
mmap and returns it to the kernel on free; below it, it trims the heap top back to the
kernel once more than the trim threshold is free there. A training step allocates and
frees tensors of tens of MiB (activations and heatmaps: batch 32 x 68 maps x 64 x 64 fp32
is 36 MiB) dozens of times, so on the CPU each step touches, page-faults and zeroes them
anew: on 2 cores that was a third of a ResUNet-72 step with the heatmap regulariser, most
of it kernel (sys) time (docs/benchmarks.md, "Keeping freed memory"). Keeping the memory
(no mmap for big blocks, no trimming) reuses the same pages every step; the process's
resident size stays at its peak instead of shrinking between steps.

mallopt is process-wide and can be changed at any time, which lets `pipeline bench` time
both settings in one run. Other C libraries (macOS, musl) have no such knobs: there it
is a no-op."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import platform
import sys

from pipeline.core.config import switch_on

log = logging.getLogger(__name__)

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# glibc's defaults: 65536 mmapped blocks at most; trim when 128 KiB are free at the top
_DEFAULT_MMAP_MAX = 65536
_DEFAULT_TRIM_THRESHOLD = 128 * 1024
# "never trim": the largest value mallopt takes (an int)
_NO_TRIM = 2 ** 31 - 1


@functools.lru_cache(maxsize=1)
def _glibc():
    """glibc's mallopt, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def use_keep_freed_memory(setting: str) -> bool:
    """`auto` = on where the C library is glibc (Linux); on/off as given."""
    return switch_on(setting, True, "train.keep_freed_memory") and _glibc() is not None


def keep_freed_memory(on: bool) -> bool:
    """Set the heap policy for the whole process; True when it now keeps freed memory.
    `on=False` restores glibc's default limits, though not its dynamic threshold (glibc
    stops adjusting the trim threshold once it is set): the off figures in `pipeline bench`
    run with the fixed 128 KiB default."""
    mallopt = _glibc()
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_MAX, 0 if on else _DEFAULT_MMAP_MAX)
    ok &= mallopt(_M_TRIM_THRESHOLD, _NO_TRIM if on else _DEFAULT_TRIM_THRESHOLD)
    if not ok:  # mallopt returns 1 on success
        log.warning("glibc mallopt refused the heap settings; freed memory goes back to the kernel")
        return False
    return on
