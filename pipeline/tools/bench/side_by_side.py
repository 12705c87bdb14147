"""Training side by side: the real feed's training steps in one process per CPU share,
each pinned to its share with as many threads, as `pipeline train-folds` trains the folds,
against the one-process row of the same run.

This module imports neither torch nor OpenCV at the top: a worker pins itself (and inherits
OMP_NUM_THREADS) before either library sizes its thread pools to the CPUs it sees, as a
`train-folds` child is pinned before its interpreter gets to those imports."""

from __future__ import annotations

import multiprocessing
import os
import queue
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import Config


def bench_train_side_by_side(cfg: Config, preset: str, cache_dir: Path, steps: int, batch_size: int,
                             input_size: int, cpu_shares: list[tuple[int, ...]], rounds: int = 2, warmup: int = 2,
                             options: dict | None = None) -> dict:
    """images/s of the real feed's training steps in one process per CPU share, side by
    side. Every round starts in all processes at once (a barrier); a round's figure is the
    sum of the processes' images/s, the best round kept."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no thread pool inherited from this one
    barrier, results = ctx.Barrier(len(cpu_shares)), ctx.Queue()
    procs = []
    saved = os.environ.get("OMP_NUM_THREADS")
    try:
        for i, cpus in enumerate(cpu_shares):
            os.environ["OMP_NUM_THREADS"] = str(max(1, len(cpus)))  # the child's environment, read as torch loads
            p = ctx.Process(target=_worker, daemon=True,
                            args=(i, cfg, preset, Path(cache_dir), steps, batch_size, input_size, cpus, rounds, warmup,
                                  options, barrier, results))
            p.start()
            procs.append(p)
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    try:
        per_process: dict[int, list[float]] = {}
        while len(per_process) < len(procs):
            try:
                i, rates = results.get(timeout=5)
            except queue.Empty:  # check that no worker died before reporting
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise PipelineError(cache_dir, f"a side-by-side training process failed (exit "
                                                   f"{dead[0].exitcode})") from None
                continue
            if isinstance(rates, str):
                raise PipelineError(cache_dir, f"side-by-side training process {i}: {rates}")
            per_process[i] = rates
    finally:
        barrier.abort()  # releases workers still waiting for a failed sibling
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    totals = [sum(per_process[i][r] for i in per_process) for r in range(rounds)]
    best = max(range(rounds), key=lambda r: totals[r])
    return {"processes": len(cpu_shares), "threads": [len(c) for c in cpu_shares], "images_per_s_real": totals[best],
            "images_per_s_per_process": [per_process[i][best] for i in sorted(per_process)], "steps": steps}


def _worker(index: int, cfg: Config, preset: str, cache_dir: Path, steps: int, batch_size: int, input_size: int,
            cpus: tuple[int, ...], rounds: int, warmup: int, options: dict | None, barrier, results) -> None:
    """One process of `bench_train_side_by_side`: pinned first, then torch and the data path."""
    try:
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
        import torch

        from pipeline.tools.bench.training import _bench_config, _labelled_cache, _Variant

        torch.set_num_threads(max(1, len(cpus)))
        cache = _labelled_cache(cache_dir)
        bs = min(batch_size, len(cache))
        v = _Variant(_bench_config(cfg, preset, input_size, bs, options, cfg.model.options), cache, bs, input_size,
                     torch.device("cpu"))
        v.run(v.real_feed, warmup)
        rates = []
        for _ in range(rounds):
            barrier.wait()
            rates.append(v.run(v.real_feed, steps)[0])
        results.put((index, rates))
    except Exception as e:  # the parent reports it as one line
        results.put((index, f"{type(e).__name__}: {e}"))
