"""Face detectors on a test XML: recall, unmatched detections per photo, photos/s."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.core.params_schema import Config
from pipeline.detection.detectors import DETECTORS, INSTALL, available
from pipeline.detection.matching import evaluate
from pipeline.tools.bench.timing import num_threads

log = logging.getLogger(__name__)


def bench_detectors(data_dir: Path, cfg: Config, limit: int | None = None) -> dict[str, Any]:
    """Recall at IoU >= 0.5 of the test XML boxes, unmatched detections per photo and
    photos/s (1 thread) of every installed face detector (pipeline.detection.detectors)."""
    xml = data_dir / cfg.data.test_xml
    out: dict[str, Any] = {"xml": str(xml)}
    for name in DETECTORS:
        if not available(name):
            out[name] = {"skipped": f"not installed ({INSTALL[name]})"}
            continue
        log.info("detector %s ...", name)
        with num_threads(1):
            out[name] = evaluate(xml, name, 0.5, limit)
    return out
