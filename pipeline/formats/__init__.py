"""Every file that passes between stages: one module per format, its one writer and its one reader."""
