"""The `train-folds` command: train the folds of `folds.train` several at a time on a CPU
machine, each in its own `pipeline train` process pinned to its share of the cores, before
`dvc repro` (which runs one stage at a time and holds the repo lock while it does).

Why: two one-thread processes train whole folds faster than one two-thread process on a
2-core CPU: each epoch's serial parts (loader start, validation, checkpoints) leave a core
idle in one process, and a second process fills it (docs/experiments.md, "The folds side by
side in `make repro`"). Each child is the train stage's own command
(`pipeline train --fold F --resume --live dvclive/foldF`) with the same params, so it
leaves a finished models/foldF/last.pt, and the train stage that `dvc repro` runs next
resumes from it with nothing left to train and writes its outputs in seconds. The children
log to <log-dir>/train-fold{F}.log, never into a stage's outputs."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
from tqdm import tqdm

from pipeline.core.config import load_config, params_options
from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import Config
from pipeline.core.paths import CACHE_DIR, EXTRA_DIR, FOLDS_FILE, MODELS_DIR

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often the parent reads the children's logs and exit codes


@dataclass(frozen=True)
class FoldJob:
    """One fold's training process: its intra-op threads and the CPUs it is pinned to."""

    fold: int
    cpus: tuple[int, ...]  # pinned to these (os.sched_setaffinity); empty = not pinned

    @property
    def threads(self) -> int:
        return max(1, len(self.cpus))


def plan_waves(folds: list[int], cpus: list[int], jobs: int) -> list[list[FoldJob]]:
    """The folds in waves of at most `jobs` processes each, every wave splitting `cpus` into
    equal contiguous shares (the first shares one CPU larger when they do not divide): 3
    folds on CPUs [0, 1] with 2 jobs -> [[0 on (0,), 1 on (1,)], [2 on (0, 1)]]. A wave
    starts when the one before it has finished, so its folds get every core. More processes
    than CPUs run at one thread each, unpinned, and the OS shares the cores between them."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    waves, todo = [], list(folds)
    while todo:
        n = min(jobs, len(todo))
        if n > len(cpus):
            waves.append([FoldJob(fold, ()) for fold in todo[:n]])
            todo = todo[n:]
            continue
        base, extra = divmod(len(cpus), n)
        wave, start = [], 0
        for i, fold in enumerate(todo[:n]):
            size = base + (i < extra)
            wave.append(FoldJob(fold, tuple(cpus[start:start + size])))
            start += size
        waves.append(wave)
        todo = todo[n:]
    return waves


def pending_folds(cfg: Config, out_root: str | Path = MODELS_DIR, cache_dir: str | Path = CACHE_DIR,
                  folds_path: str | Path = FOLDS_FILE, extra_root: str | Path = EXTRA_DIR) -> dict[int, int]:
    """{fold: epochs already done} for the folds of `folds.train` whose last.pt is missing,
    made from other inputs (params, the cache, the folds file, the extra caches, the code,
    the precision) or not at train.epochs yet: those `pipeline train --resume` would still train."""
    from pipeline.training.identity import current_identity, trained_epochs

    outs = {f: Path(out_root) / f"fold{f}" for f in cfg.folds.train}
    # the inputs are hashed once for all folds (none depends on the fold), and only when a
    # fold has a last.pt to compare them with
    identity = None
    if any((o / "last.pt").exists() for o in outs.values()):
        identity = current_identity(cfg, cache_dir, folds_path, extra_root)
    # without one there is nothing to resume (no last.pt, or inputs the training will refuse)
    done = {f: 0 if identity is None else trained_epochs(o, cfg, cache_dir, folds_path, extra_root, identity)
            for f, o in outs.items()}
    return {f: d for f, d in done.items() if d < cfg.train.epochs}


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def train_folds(params_path: str = "params.yaml", overrides: tuple[str, ...] = (), jobs: int | None = None,
                cache_dir: str | Path = CACHE_DIR, folds_path: str | Path = FOLDS_FILE,
                out_root: str | Path = MODELS_DIR, log_dir: str | Path = "logs",
                extra_root: str | Path = EXTRA_DIR) -> list[int]:
    """Train the pending folds of `folds.train` under the params of `params_path` and
    `overrides` (every child gets the same two), `jobs` processes at a time (None: one per
    CPU; more than the CPUs: one thread each, unpinned); returns the folds trained. With one
    job, or a training device other than the CPU, it trains nothing: the train stages then
    train the folds one at a time, which is no slower there."""
    from pipeline.core.device import resolve_device

    cfg = load_config(params_path, overrides)
    device = resolve_device(cfg.train.device)
    if device.type != "cpu":
        log.info("train.device is %s: nothing to run side by side; `dvc repro` trains the folds one at a time",
                 device)
        return []
    pending = pending_folds(cfg, out_root, cache_dir, folds_path, extra_root)
    if not pending:
        log.info("every fold of folds.train %s is trained to %d epochs from these inputs",
                 list(cfg.folds.train), cfg.train.epochs)
        return []
    cpus = available_cpus()
    jobs = len(cpus) if jobs is None else jobs
    if min(jobs, len(pending)) < 2:
        log.info("%d job(s) on %d CPU(s) for %d pending fold(s): `dvc repro` trains them one at a time",
                 jobs, len(cpus), len(pending))
        return []
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    child_args = ["--cache", str(cache_dir), "--folds", str(folds_path), "--out", str(out_root),
                  "--extra", str(extra_root), "--params", str(params_path)] + [a for o in overrides for a in ("--set", o)]
    waves = plan_waves(sorted(pending), cpus, jobs)
    total = sum(cfg.train.epochs - pending[f] for f in pending)
    with tqdm(total=total, desc="train-folds epochs", unit="epoch", disable=None) as bar:  # None: on a terminal
        for i, wave in enumerate(waves, 1):
            log.info("wave %d/%d: %s", i, len(waves), ", ".join(
                f"fold {j.fold} {'on CPU ' + ','.join(map(str, j.cpus)) if j.cpus else 'unpinned'} "
                f"({j.threads} thread{'s' * (j.threads > 1)}, from epoch {pending[j.fold]})" for j in wave))
            _run_wave(wave, child_args, log_dir, bar)
    return sorted(pending)


def _run_wave(wave: list[FoldJob], child_args: list[str], log_dir: Path, bar: tqdm) -> None:
    """Start the wave's processes and wait for all of them; a failed one stops the others
    (their last.pt lets a rerun continue) and raises with its log's last line."""
    procs: dict[int, tuple[subprocess.Popen, Path, float]] = {}
    progress: dict[int, int] = {}
    try:
        for job in wave:
            log_path = log_dir / f"train-fold{job.fold}.log"
            env = {**os.environ, "OMP_NUM_THREADS": str(job.threads), "TQDM_DISABLE": "1"}
            cmd = [sys.executable, "-m", "pipeline", "train", "--fold", str(job.fold), "--resume",
                   "--live", f"dvclive/fold{job.fold}", *child_args]
            with open(log_path, "w") as fh:  # the child holds its own copy of the descriptor
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            if job.cpus and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(proc.pid, job.cpus)  # before it starts its OpenMP threads, which inherit it
            procs[job.fold] = (proc, log_path, time.monotonic())
            progress[job.fold] = 0
        running = set(procs)
        while running:
            time.sleep(POLL_S)
            for fold in sorted(running):
                proc, log_path, started = procs[fold]
                _advance(bar, progress, fold, log_path)
                rc = proc.poll()
                if rc is None:
                    continue
                running.discard(fold)
                if rc != 0:
                    raise PipelineError(log_path, f"fold {fold} failed ({_exit_text(rc)}): {_last_line(log_path)}")
                log.info("fold %d finished in %.1f min (log %s)", fold, (time.monotonic() - started) / 60, log_path)
    finally:
        _stop([p for p, _, _ in procs.values()])


def _advance(bar: tqdm, progress: dict[int, int], fold: int, log_path: Path) -> None:
    """Move the bar by the epochs `fold`'s log reports since the last look."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return
    epochs = re.findall(rf"fold {fold} epoch (\d+):", text)
    seen = len(epochs)
    if seen > progress[fold]:
        bar.update(seen - progress[fold])
        progress[fold] = seen


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM the processes still running and wait for them (SIGKILL after 30 s): a fold
    stopped mid-epoch resumes from its last.pt, which is only ever replaced whole."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    for p in alive:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


@click.command("train-folds")
@click.option("--jobs", default="auto", show_default=True,
              help="processes at a time: 'auto' = one per CPU (at most one per pending fold); more than the "
                   "CPUs: one thread each, unpinned; 1 = none (the train stages train the folds one at a time)")
@click.option("--cache", default=CACHE_DIR, show_default=True)
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@click.option("--out", "out_root", default=MODELS_DIR, show_default=True, help="writes <out>/fold{K}/")
@click.option("--extra", "extra_root", default=EXTRA_DIR, show_default=True,
              help="the caches of data.extra_train: <extra>/<name>/ (`pipeline crop-extra`)")
@click.option("--log-dir", default="logs", show_default=True, help="each fold's log: <log-dir>/train-fold{K}.log")
@params_options
def train_folds_cmd(jobs, cache, folds_path, out_root, extra_root, log_dir, params_path, overrides):
    """Train the folds of folds.train side by side on the CPU cores, before `dvc repro`
    (`make repro` runs it): the train stages then find them trained and finish in seconds."""
    if jobs != "auto" and not (jobs.isdigit() and int(jobs) >= 1):
        raise click.BadParameter(f"'{jobs}' is neither 'auto' nor a whole number >= 1", param_hint="--jobs")
    train_folds(params_path, tuple(overrides), None if jobs == "auto" else int(jobs), cache, folds_path, out_root,
                log_dir, extra_root)
