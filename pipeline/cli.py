"""The `pipeline` command. Subcommands live in their own modules and load lazily,
so `pipeline --help` does not import torch."""

from __future__ import annotations

import importlib.util
import logging
import sys

import click

from pipeline.core.errors import PipelineError

# name -> "module:attribute" of a click.Command
COMMANDS = {
    "demo-data": "pipeline.stages.demo:demo_data_cmd",
    "crop": "pipeline.stages.crop:crop_cmd",
    "crop-extra": "pipeline.stages.crop:crop_extra_cmd",
    "folds": "pipeline.stages.folds:folds_cmd",
    "models": "pipeline.cli:models_cmd",
    "train": "pipeline.stages.train:train_cmd",
    "train-folds": "pipeline.tools.train_folds:train_folds_cmd",
    "presence": "pipeline.stages.presence:presence_cmd",
    "predict": "pipeline.stages.predict:predict_cmd",
    "submit": "pipeline.stages.submit:submit_cmd",
    "score": "pipeline.stages.evaluate:score_cmd",
    "evaluate": "pipeline.stages.evaluate:evaluate_cmd",
    "leaderboard": "pipeline.tools.leaderboard:leaderboard_cmd",
    "bench": "pipeline.tools.bench.command:bench_cmd",
    "budget-plot": "pipeline.tools.budget_plot:budget_plot_cmd",
    "export": "pipeline.tools.export:export_cmd",
    "show": "pipeline.tools.viz:show_cmd",
    "heatmaps": "pipeline.tools.viz:heatmaps_cmd",
    "filters": "pipeline.tools.viz:filters_cmd",
    "predict-image": "pipeline.tools.detect:predict_image_cmd",
    "morph": "pipeline.tools.morph:morph_cmd",
    "predict-video": "pipeline.tools.video:predict_video_cmd",
    "calibrate-presence": "pipeline.tools.presence_calibration:calibrate_presence_cmd",
    "make-test-video": "pipeline.tools.video:make_test_video_cmd",
    "video-stats": "pipeline.tools.video:video_stats_cmd",
    "gpu-check": "pipeline.tools.gpu_check:gpu_check_cmd",
    "pack": "pipeline.tools.pack:pack_cmd",
    "blend": "pipeline.tools.blend:blend_cmd",
    "params": "pipeline.tools.params:params_cmd",
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


@click.command("models")
@click.option("--keypoints", default=68, show_default=True, type=click.IntRange(min=1),
              help="number of keypoints (68 = iBUG 68, 1 = nose tip)")
@click.option("--in-chans", default=3, show_default=True, type=click.Choice(["1", "3"]),
              help="input channels (3 colour, 1 grayscale)")
def models_cmd(keypoints: int, in_chans: str) -> None:
    """List the model presets: parameters, forward GFLOPs per image at the preset's
    default input size, output type."""
    from pipeline.models import preset_rows

    header = ("preset", "params (M)", "GFLOPs", "input", "output", "description")
    rows = [(r["preset"], f"{r['params'] / 1e6:.2f}", f"{r['flops'] / 1e9:.3f}", str(r["input_size"]), r["output"],
             r["doc"]) for r in preset_rows(keypoints, int(in_chans))]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        click.echo("  ".join(c.rjust(w) if i in (1, 2, 3) else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip())


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
    except OSError as e:  # what no check foresaw (a disk that fills, a folder that vanishes): still one line
        err = PipelineError(e.filename, e.strerror or type(e).__name__)
        click.echo(f"error: {err.format()}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
