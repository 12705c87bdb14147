# Two commands for a fresh machine: `make repro` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch/torchvision pinned to the builds this machine serves from disk (a plain
# `torch` would download GBs); override on a GPU node: make TORCH_PINS=
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1

.PHONY: venv repro lint test bench gpu-check gpu-pack gpu-wheels gpu-train clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PINS)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/.installed

# make repro RECIPE=recipes/cpu.yaml: the recipe merged over the defaults becomes params.yaml
# (complete: DVC reads every param a stage lists from it; git shows the change), so
# dvc.lock, `dvc metrics show` and `dvc exp show` record what was run
# The folds train side by side first (`pipeline train-folds`: one process per core on a CPU
# machine fills the cores that an epoch's serial parts leave idle, docs/tools.md; nothing on
# a GPU), so the train stages of `dvc repro` find them trained and finish in seconds.
# TRAIN_JOBS=1 skips it.
# The extra training faces (crop-extra@NAME, one per data.extra_train entry) are cropped
# before it; the glob matches nothing without extras (a plain target that names no stage
# would make `dvc repro` run the whole pipeline, trainings included).
TRAIN_JOBS ?= auto

repro: venv
	$(if $(RECIPE),$(BIN)/pipeline params --recipe $(RECIPE) --out params.yaml)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc repro --glob dvc.yaml:folds 'dvc.yaml:crop-extra@*'
	$(BIN)/pipeline train-folds --jobs $(TRAIN_JOBS)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc repro

# ruff (pyflakes, bugbear, import order, pycodestyle) and mypy, configured in pyproject.toml;
# cheap next to pytest, so `make test` (and CI) runs them first
lint: venv
	$(BIN)/ruff check pipeline tests
	$(BIN)/mypy pipeline

test: lint
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -q

bench: venv
	$(BIN)/pipeline bench

# the GPU path end to end on one GPU, in minutes (docs/scaling.md): exit 1 on a failed
# check, 2 without CUDA; GPU_CHECK_ARGS=--cpu is the dry run at toy sizes
gpu-check: venv
	$(BIN)/python -m pipeline.tools.gpu_check $(GPU_CHECK_ARGS)

# the GPU recipe on the real faces (docs/scaling.md): gpu-pack crops and packs them small
# enough to copy to a GPU machine (git-ignored gpu-pack/), gpu-wheels fetches the wheels a
# stock torch image lacks (.whl/, for Python 3.12 on x86-64 Linux), gpu-train trains fold 0
# of the recipe on the pack there and writes gpu-train/train-real.json
GPU_RECIPE ?= recipes/gpu.yaml
PACK ?= gpu-pack
GPU_WHEELS := pydantic pydantic_core annotated-types typing-inspection typing_extensions

gpu-pack: venv
	$(BIN)/pipeline pack --params $(GPU_RECIPE) --out $(PACK)

gpu-wheels: venv
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
	  $$($(BIN)/python -c "import importlib.metadata as m; print(*(n + '==' + m.version(n) for n in '$(GPU_WHEELS)'.split()))")

gpu-train: venv
	$(BIN)/python -m pipeline.tools.gpu_check --train-real $(PACK) --params $(GPU_RECIPE) --out gpu-train $(GPU_CHECK_ARGS)

clean:
	rm -rf data/cache data/demo data/extra/*/ models predictions metrics dvclive
