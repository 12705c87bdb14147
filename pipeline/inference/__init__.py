"""Prediction on crops and photos: test-time augmentation, torch/onnxruntime predictors."""
