"""The training data path (augmentation, loader), losses, and the training loop."""
