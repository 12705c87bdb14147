"""Facial-keypoint competition pipeline. The Python API: `from pipeline import Landmarker`
(pipeline/inference/landmarker.py), imported on first use so that `import pipeline` stays
cheap (no torch)."""

__version__ = "0.1.0"

__all__ = ["Landmarker"]


def __getattr__(name: str):
    if name == "Landmarker":
        from pipeline.inference.landmarker import Landmarker

        return Landmarker
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
