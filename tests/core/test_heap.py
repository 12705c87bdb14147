"""The heap policy: with freed memory kept, a big tensor freed and allocated again reuses
pages the process already has instead of page-faulting fresh ones from the kernel."""

import resource

import pytest
import torch

from pipeline.core import heap
from pipeline.core.errors import PipelineError

MIB = 1 << 20


def _faults_of_second_allocation(nbytes: int) -> int:
    """Minor page faults of allocating and touching `nbytes` a second time, after the
    same allocation was made, touched and freed."""
    torch.ones(nbytes // 4, dtype=torch.float32)  # allocated, touched, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.ones(nbytes // 4, dtype=torch.float32)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del t
    return after - before


@pytest.fixture
def restore_heap():
    yield
    heap.keep_freed_memory(False)


@pytest.mark.skipif(heap._glibc() is None, reason="glibc only")
def test_kept_memory_is_reused_without_page_faults(restore_heap):
    # 40 MiB: above glibc's 32 MiB cap on its mmap threshold, so by default the block is
    # mmapped and unmapped on free, and every page faults again
    size = 40 * MIB
    pages = size // resource.getpagesize()
    assert heap.keep_freed_memory(False) is False
    assert min(_faults_of_second_allocation(size) for _ in range(4)) > pages // 2
    assert heap.keep_freed_memory(True) is True
    # the heap grows until the two blocks fit in it (a few rounds where earlier frees left
    # holes), then reuses their pages
    assert min(_faults_of_second_allocation(size) for _ in range(8)) < pages // 20


def test_settings(monkeypatch, restore_heap):
    calls = []
    monkeypatch.setattr(heap, "_glibc", lambda: lambda param, value: calls.append((param, value)) or 1)
    assert heap.use_keep_freed_memory("auto") and heap.use_keep_freed_memory("on")
    assert not heap.use_keep_freed_memory("off")
    assert heap.keep_freed_memory(True) is True
    assert calls == [(heap._M_MMAP_MAX, 0), (heap._M_TRIM_THRESHOLD, heap._NO_TRIM)]
    calls.clear()
    assert heap.keep_freed_memory(False) is False
    assert calls == [(heap._M_MMAP_MAX, heap._DEFAULT_MMAP_MAX), (heap._M_TRIM_THRESHOLD, heap._DEFAULT_TRIM_THRESHOLD)]
    with pytest.raises(PipelineError, match="keep_freed_memory must be auto|on|off"):
        heap.use_keep_freed_memory("yes")


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(heap, "_glibc", lambda: None)
    assert not heap.use_keep_freed_memory("auto")
    assert heap.keep_freed_memory(True) is False
