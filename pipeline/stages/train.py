"""The train stage: `fit` trains one fold = `load_fold` + `build_training` (a `TrainSetup`,
pipeline/training/setup.py) + per epoch `make_epoch_loader`, `train_steps` and `evaluate`
(pipeline/training/loop.py), then checkpoints, metrics and DVCLive curves.

Checkpoints go to models/fold{K}/last.pt every epoch and best.pt at the lowest validation
MAE (in original-image pixels) among the validated epochs (every `train.val_every`-th and the
last), scored as `pipeline predict` scores out of fold without TTA (so metrics.json's val NME
is the fold's OOF NME without TTA). `--resume` continues from last.pt when it was made from
the same inputs (`training_identity`: params, cache, folds.csv, code, precision); otherwise
the fold trains afresh and the log says which inputs differ."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import click
import torch

from pipeline.core.config import config_options, write_resolved
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, remove_stale_temps, write_json
from pipeline.core.params_schema import Config
from pipeline.core.paths import CACHE_DIR, EXTRA_DIR, FOLDS_FILE, MODELS_DIR
from pipeline.formats.checkpoint import save_checkpoint
from pipeline.training.distributed import init_distributed
from pipeline.training.identity import TRAIN_IGNORES, TRAIN_SECTIONS, training_identity
from pipeline.training.loop import evaluate, train_steps
from pipeline.training.setup import build_training, checkpoint_meta, load_fold, make_epoch_loader, resume_training

log = logging.getLogger(__name__)

# measurements of the machine, not of the model: in the log and in `fit`'s return value, kept
# out of the checkpoints, metrics.json and the DVCLive curves, so that a re-run writes the
# same bytes and DVC skips the stages after it
TIMING = ("images_per_s", "data_wait_frac")


def _without_timing(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING}


def fit(cfg: Config, fold: int, cache_dir: str | Path = CACHE_DIR, folds_path: str | Path = FOLDS_FILE,
        out_root: str | Path = MODELS_DIR, resume: bool = True, live_dir: str | Path | None = None,
        max_epochs: int | None = None, extra_root: str | Path = EXTRA_DIR) -> dict[str, float]:
    """Train fold `fold` (on its training faces and those of data.extra_train, cached under
    `extra_root`); returns the final metrics. `max_epochs` stops early (for tests of
    interruption): the schedule still follows train.epochs."""
    tcfg = cfg.train
    out = check_output(Path(out_root) / f"fold{fold}", folder=True)
    if live_dir is not None:
        check_output(live_dir, folder=True)
    cache, train_idx, val_idx = load_fold(cache_dir, folds_path, fold, cfg, extra_root)
    rank, world, device_name = init_distributed(tcfg.device)
    is_main = rank == 0  # only rank 0 writes checkpoints, metrics and DVCLive logs
    if not is_main:  # and only rank 0 logs progress: the other ranks report warnings only
        logging.getLogger("pipeline").setLevel(logging.WARNING)
    setup = build_training(cfg, cache, train_idx, resolve_device(device_name), rank, world)
    identity = training_identity(cfg, cache_dir, folds_path, setup.runtime, extra_root)
    meta = checkpoint_meta(setup, cache, fold, identity)
    start_epoch, best_mae, history = (resume_training(setup, out, cache.schema, fold, identity) if resume
                                      else (0, float("inf"), []))

    last_path = out / "last.pt"
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        # temp files of a run killed mid-write (kill -9) are never renamed onto an output
        for p in remove_stale_temps(out, (last_path.name, "best.pt", "metrics.json", "params.resolved.yaml")):
            log.info("fold %d: removed %s left by an interrupted run", fold, p)
        write_resolved(cfg, out, TRAIN_SECTIONS, exclude=TRAIN_IGNORES)  # the train stage's params
    live = _open_live(live_dir, history) if is_main else None
    log.info("fold %d: %d train / %d val faces, %s on %s, amp=%s, %d epochs", fold, len(train_idx),
             len(val_idx), cfg.model.preset, setup.device, setup.amp, tcfg.epochs)
    end_epoch = tcfg.epochs if max_epochs is None else min(tcfg.epochs, max_epochs)
    for epoch in range(start_epoch, end_epoch):
        tr = train_steps(setup, make_epoch_loader(setup, epoch), desc=f"fold {fold} epoch {epoch + 1}/{tcfg.epochs}",
                         progress=is_main)
        tr["images_per_s"] *= world  # every rank trains on its own share at the same pace
        row = {"epoch": epoch + 1, "train_loss": tr["loss"], "data_wait_frac": tr["data_wait_frac"],
               "images_per_s": tr["images_per_s"], "lr": tr["lr"]}
        # validation is a measurable share of a CPU epoch; it reads the weights and draws
        # no random numbers, so skipping it leaves the training unchanged
        if (epoch + 1) % tcfg.val_every and epoch + 1 != end_epoch:
            history.append(row)
            log.info("fold %d epoch %d: loss %.4f  (not validated: train.val_every %d)  %.1f img/s  data wait %.1f%%",
                     fold, epoch + 1, tr["loss"], tcfg.val_every, tr["images_per_s"], 100 * tr["data_wait_frac"])
            _save_epoch(setup, meta, out, epoch, best_mae, history, is_main, world, live)
            continue
        ev = evaluate(setup.model, cache, val_idx, meta, 64, setup.device)
        row.update(val_mae=ev["mae"], val_nme=ev["nme"])
        weights = {"raw": setup.model}
        ema_note = ""
        if setup.ema is not None:
            ev_ema = evaluate(setup.ema.module, cache, val_idx, meta, 64, setup.device)
            row.update(val_mae_ema=ev_ema["mae"], val_nme_ema=ev_ema["nme"])
            weights["ema"] = setup.ema.module
            ema_note = f"  EMA MAE {ev_ema['mae']:.3f} px  NME {100 * ev_ema['nme']:.2f}%"
        # the epoch's better weights (the raw ones on a tie) compete for best.pt
        pick = "ema" if "ema" in weights and _better(row["val_mae_ema"], row["val_mae"]) else "raw"
        score = row["val_mae_ema"] if pick == "ema" else row["val_mae"]
        history.append({**row, "weights": pick, "score_mae": score})
        log.info("fold %d epoch %d: loss %.4f  val MAE %.3f px  NME %.2f%%%s  %.1f img/s  data wait %.1f%%",
                 fold, epoch + 1, tr["loss"], ev["mae"], 100 * ev["nme"], ema_note, tr["images_per_s"],
                 100 * tr["data_wait_frac"])
        improved = _better(score, best_mae) or not math.isfinite(best_mae)
        best_mae = min(best_mae, score) if math.isfinite(score) else best_mae
        _save_epoch(setup, meta, out, epoch, best_mae, history, is_main, world, live,
                    best_weights=weights[pick] if improved else None, pick=pick)
    if not history:
        raise PipelineError(last_path, "no epochs trained (train.epochs is 0?)")
    validated = [r for r in history if "val_mae" in r]
    if not validated:
        raise PipelineError(last_path, "no validated epoch (train.val_every above the epochs trained?)")
    best = min(validated, key=lambda r: r["score_mae"] if math.isfinite(r["score_mae"]) else float("inf"))
    sfx = "_ema" if best["weights"] == "ema" else ""
    metrics = {"fold": fold, "epochs": history[-1]["epoch"], "train_faces": len(train_idx),
               "val_mae": best["val_mae" + sfx],
               "val_nme": best["val_nme" + sfx], "best_epoch": best["epoch"], "best_weights": best["weights"],
               "last_val_mae": validated[-1]["val_mae"]}
    if is_main:
        write_json(out / "metrics.json", metrics)
    metrics.update({k: history[-1][k] for k in TIMING if k in history[-1]})  # the last epoch trained here
    if live is not None:
        live.end()
    if world > 1:
        torch.distributed.destroy_process_group()
    return metrics


def _save_epoch(setup, meta: dict, out: Path, epoch: int, best_mae: float, history: list[dict], is_main: bool,
                world: int, live, best_weights=None, pick: str = "raw") -> None:
    """last.pt after every epoch (and best.pt from `best_weights` when given), then the
    epoch's DVCLive row."""
    ckpt = {**meta, "model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
            "scaler": setup.scaler.state_dict() if setup.scaler is not None else {},
            "scheduler_step": setup.state.step, "epoch": epoch + 1, "best_mae": best_mae,
            "history": [_without_timing(r) for r in history]}
    if setup.ema is not None:
        ckpt["ema"] = setup.ema.state_dict()
    if is_main:
        if best_weights is not None:  # the chosen weights as the checkpoint's model: predict needs nothing else
            save_checkpoint(out / "best.pt", {**ckpt, "model": best_weights.state_dict(), "weights": pick})
        save_checkpoint(out / "last.pt", ckpt)
    if world > 1:
        torch.distributed.barrier()
    if live is not None:
        _log_live(live, history[-1])


def _better(mae: float, than: float) -> bool:
    """`mae` is finite and below `than`."""
    return math.isfinite(mae) and mae < than


def _open_live(live_dir, history: list[dict]):
    """A fresh DVCLive log holding the epochs of `history` (those a resumed run already
    trained): DVC deletes a stage's plots before running it, and a run that resumes with
    nothing left to train must still leave them whole, and the same as before."""
    if live_dir is None:
        return None
    try:
        from dvclive import Live
    except ImportError:  # an image without DVC's packages (a GPU node's stock torch): train all the same
        log.warning("dvclive is not installed: no per-epoch log in %s (pip install dvclive)", live_dir)
        return None

    live = Live(dir=str(live_dir), resume=False, save_dvc_exp=False, dvcyaml=None, report=None)
    for row in history:
        _log_live(live, row)
    return live


def _log_live(live, row: dict) -> None:
    for name, value in _without_timing(row).items():
        if name != "epoch" and not isinstance(value, str):  # not which weights won the epoch
            live.log_metric(name, value)  # no timestamp column: the same run logs the same bytes
    live.next_step()


@click.command("train")
@click.option("--fold", type=int, required=True, help="fold to hold out for validation")
@click.option("--cache", default=CACHE_DIR, show_default=True)
@click.option("--folds", "folds_path", default=FOLDS_FILE, show_default=True)
@click.option("--out", "out_root", default=MODELS_DIR, show_default=True, help="writes <out>/fold{K}/")
@click.option("--extra", "extra_root", default=EXTRA_DIR, show_default=True,
              help="the caches of data.extra_train: <extra>/<name>/ (`pipeline crop-extra`)")
@click.option("--live", "live_dir", default=None, help="DVCLive folder (default dvclive/fold{K})")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="continue from <out>/fold{K}/last.pt when it was made from the same inputs (params, cache, "
                   "folds file, code, precision)")
@config_options
def train_cmd(fold, cache, folds_path, out_root, extra_root, live_dir, resume, cfg):
    """Train one fold from the crop cache and the folds file (plus data.extra_train's faces)."""
    metrics = fit(cfg, fold, cache, folds_path, out_root, resume, live_dir or f"dvclive/fold{fold}",
                  extra_root=extra_root)
    log.info("fold %d done: best val MAE %.3f px (epoch %d)", fold, metrics["val_mae"], metrics["best_epoch"])
