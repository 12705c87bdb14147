"""One error type for every bad input: the CLI prints it as one line and exits 2."""

from __future__ import annotations

import os


class PipelineError(Exception):
    """Bad input. `path` is the file at fault; `where` narrows it (an image, a part)."""

    exit_code = 2

    def __init__(self, path: str | os.PathLike | None, problem: str, where: str | None = None):
        self.path = None if path is None else str(path)
        self.problem = problem
        self.where = where
        super().__init__(self.format())

    def __reduce__(self):
        # picklable, so an error raised in a joblib / DataLoader worker reaches the parent intact
        return (type(self), (self.path, self.problem, self.where))

    def format(self) -> str:
        parts = [p for p in (self.path, self.where) if p]
        prefix = ": ".join(parts)
        return f"{prefix}: {self.problem}" if prefix else self.problem
