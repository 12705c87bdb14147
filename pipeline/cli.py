"""The `pipeline` command. Subcommands live in their own modules and load lazily,
so `pipeline --help` does not import torch."""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys

import click

from pipeline.errors import PipelineError

# name -> "module:attribute" of a click.Command
COMMANDS = {
    "demo-data": "pipeline.demo:demo_data_cmd",
    "crop": "pipeline.crop:crop_cmd",
    "folds": "pipeline.folds:folds_cmd",
    "models": "pipeline.models:models_cmd",
    "train": "pipeline.train:train_cmd",
    "predict": "pipeline.predict:predict_cmd",
    "submit": "pipeline.submit:submit_cmd",
    "score": "pipeline.evaluate:score_cmd",
    "evaluate": "pipeline.evaluate:evaluate_cmd",
    "leaderboard": "pipeline.evaluate:leaderboard_cmd",
    "bench": "pipeline.bench:bench_cmd",
    "export": "pipeline.export:export_cmd",
    "show": "pipeline.viz:show_cmd",
    "heatmaps": "pipeline.viz:heatmaps_cmd",
    "filters": "pipeline.viz:filters_cmd",
    "predict-image": "pipeline.detect:predict_image_cmd",
    "morph": "pipeline.morph:morph_cmd",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(n for n in COMMANDS if self._available(n))

    @staticmethod
    def _available(name: str) -> bool:
        return importlib.util.find_spec(COMMANDS[name].split(":")[0]) is not None

    def get_command(self, ctx, name):
        if name not in COMMANDS or not self._available(name):
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)


def config_options(fn):
    """Add `--params PATH` and repeatable `--set key=value`, and pass the resolved `cfg`."""

    @click.option("--params", "params_path", default="params.yaml", show_default=True,
                  help="params YAML file (missing default file = built-in defaults)")
    @click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                  help="override a param, e.g. --set train.lr=0.1 (repeatable)")
    @functools.wraps(fn)
    def wrapper(*args, params_path, overrides, **kwargs):
        from pipeline.config import load_config

        return fn(*args, cfg=load_config(params_path, overrides), **kwargs)

    return wrapper


@click.group(cls=LazyGroup)
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
def cli(verbose: bool) -> None:
    """Facial-keypoint competition pipeline (see README)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")


def main(argv=None) -> None:
    try:
        cli.main(args=argv, standalone_mode=False)
    except PipelineError as e:
        click.echo(f"error: {e.format()}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
