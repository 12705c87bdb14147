"""Facial-keypoint competition pipeline."""

__version__ = "0.1.0"
