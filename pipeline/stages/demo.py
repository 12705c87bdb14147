"""The demo-data stage: the synthetic face set of params `demo` (pipeline/synth/) into a folder."""

from __future__ import annotations

import os
from pathlib import Path

import click

from pipeline.core.config import config_options, write_resolved
from pipeline.core.params_schema import Config
from pipeline.core.paths import DEMO_DIR
from pipeline.synth.layout import LAYOUTS, generate_demo


def run_demo_data(cfg: Config, out: str | os.PathLike) -> Path:
    """The `demo-data` stage: the synthetic set of params `demo` into `out`."""
    d = cfg.demo
    generate_demo(out, d.n_train, d.n_test, d.seed, layout=d.layout)
    write_resolved(cfg, out, ["demo"])
    return Path(out)


@click.command("demo-data")
@click.argument("out", default=DEMO_DIR)  # checked by staging_dir (one error line, not click's usage text)
@click.option("--n-train", type=int, default=None, help="training faces [params demo.n_train]")
@click.option("--n-test", type=int, default=None, help="test faces [params demo.n_test]")
@click.option("--seed", type=int, default=None, help="random seed [params demo.seed]")
@click.option("--layout", type=click.Choice(LAYOUTS), default=None,
              help="flat (images/train, images/test) or 300w (the full set's folders, names and "
                   "_mirror copies) [params demo.layout]")
@config_options
def demo_data_cmd(out, n_train, n_test, seed, layout, cfg):
    """Write the synthetic demo data set (competition layout) to OUT."""
    given = {"n_train": n_train, "n_test": n_test, "seed": seed, "layout": layout}
    # options given on the command line win over the params
    d = cfg.demo.model_copy(update={k: v for k, v in given.items() if v is not None})
    cfg = cfg.model_copy(update={"demo": d})
    run_demo_data(cfg, out)
    click.echo(f"wrote {d.n_train} train + {d.n_test} test demo faces to {out}")
