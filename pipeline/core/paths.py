"""Where the stages read and write by default: the paths dvc.yaml passes them. One place, so
a command run by hand finds what the pipeline wrote (and a test can check dvc.yaml agrees)."""

DEMO_DIR = "data/demo"  # `pipeline demo-data`; crop reads it when data.dir is null
CACHE_DIR = "data/cache"  # `pipeline crop`: train/ and test/ face caches
EXTRA_DIR = "data/extra"  # `pipeline crop-extra NAME`: NAME/, the training faces of data.extra_train's NAME
FOLDS_FILE = "folds/folds.csv"  # `pipeline folds`
MODELS_DIR = "models"  # `pipeline train`: fold{K}/best.pt, last.pt
PREDICTIONS_DIR = "predictions"  # `pipeline predict`: test.npz, oof.npz
METRICS_DIR = "metrics"  # `pipeline evaluate`: summary.json and the detailed files
