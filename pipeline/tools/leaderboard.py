"""The `leaderboard` command: this run's folds by out-of-fold MAE, then every past run
(metrics/history.jsonl and DVC experiments from `dvc exp show --json`) by out-of-fold MAE, with
the params that differ between them. It reads what `pipeline evaluate` writes."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import click

from pipeline.core.config import flatten
from pipeline.core.errors import PipelineError
from pipeline.core.paths import METRICS_DIR
from pipeline.stages.evaluate import HISTORY_SECTIONS, format_num, format_pct

log = logging.getLogger(__name__)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Fixed-width text table; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_num(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(headers))]

    def line(r):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _is_num(s: str) -> bool:
    if s == "-":
        return True
    try:
        float(s.rstrip("%"))
        return True
    except ValueError:
        return False


def _sort_key(x):
    return (x is None or (isinstance(x, float) and math.isnan(x)), x if isinstance(x, (int, float)) else 0.0)


def fold_rows(oof: dict) -> list[list[Any]]:
    """Rows (fold, n, MAE, NME, MAE no-TTA) sorted by OOF MAE."""
    items = sorted(oof.get("per_fold", {}).items(), key=lambda kv: _sort_key(kv[1].get("mae")))
    return [[f, m.get("n"), format_num(m.get("mae")), format_pct(m.get("nme")), format_num(m.get("mae_notta"))] for f, m in items]


def read_history(path: Path) -> list[dict]:
    rows: list[dict] = []
    if not path.exists():
        return rows
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
            rows.append({"source": "history", "name": e["timestamp"], "params": dict(e.get("params") or {}),
                         "summary": dict(e.get("summary") or {})})
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("%s: line %d is not a history entry, skipped", path, i)
    return rows


def parse_dvc_exp_show(entries: Any, summary_path: str = "metrics/summary.json",
                       params_file: str = "params.yaml") -> list[dict]:
    """Rows from `dvc exp show --json` (DVC 3): baselines and their experiments, not the workspace."""
    rows: list[dict] = []

    def visit(entry: dict) -> None:
        if not isinstance(entry, dict):
            return
        data = entry.get("data") or {}
        if entry.get("rev") != "workspace" and not entry.get("error") and data:
            params = ((data.get("params") or {}).get(params_file) or {}).get("data") or {}
            summary = ((data.get("metrics") or {}).get(summary_path) or {}).get("data") or {}
            if summary:
                name = entry.get("name") or str(entry.get("rev", ""))[:7]
                rows.append({"source": "dvc", "name": name,
                             "params": flatten({s: params[s] for s in HISTORY_SECTIONS
                                                 if isinstance(params.get(s), dict)}),
                             "summary": summary})
        for exp in entry.get("experiments") or []:
            for rev in (exp or {}).get("revs") or []:
                visit(rev)

    for entry in entries if isinstance(entries, list) else []:
        visit(entry)
    return rows


def dvc_experiments(summary_path: str = "metrics/summary.json", timeout: float = 120) -> list[dict]:
    """Experiments via `dvc exp show --json`; [] when DVC is missing, this is no DVC repo,
    or there are none."""
    if importlib.util.find_spec("dvc") is not None:
        cmd = [sys.executable, "-m", "dvc"]
    elif dvc := shutil.which("dvc"):
        cmd = [dvc]
    else:
        log.info("dvc not installed: DVC experiments skipped")
        return []
    try:
        proc = subprocess.run(cmd + ["exp", "show", "--json"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.info("dvc exp show failed (%s): skipped", type(e).__name__)
        return []
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or [""])[-1]
        log.info("dvc exp show failed: %s", msg)
        return []
    text = proc.stdout
    start = min([i for i in (text.find("["), text.find("{")) if i >= 0], default=-1)
    try:
        entries = json.loads(text[start:]) if start >= 0 else []
    except json.JSONDecodeError:
        log.info("dvc exp show: output is not JSON, skipped")
        return []
    return parse_dvc_exp_show(entries, summary_path)


def differing_params(rows: Sequence[dict]) -> list[str]:
    keys = sorted({k for r in rows for k in r["params"]})
    out = []
    for k in keys:
        vals = {json.dumps(r["params"].get(k, "<unset>"), sort_keys=True, default=str) for r in rows}
        if len(vals) > 1:
            out.append(k)
    return out


def experiment_table(rows: Sequence[dict]) -> str:
    rows = sorted(rows, key=lambda r: _sort_key(r["summary"].get("mae")))
    diff = differing_params(rows)
    headers = ["source", "name", "oof_mae", "oof_mae_cal", "oof_nme", "test_mae", "test_mae_uncal"] + diff
    body = []
    for r in rows:
        s = r["summary"]
        vals = []
        for k in diff:
            v = r["params"].get(k, "-")
            vals.append(json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)
        body.append([r["source"], r["name"], format_num(s.get("mae")), format_num(s.get("mae_cal")),
                     format_pct(s.get("nme")), format_num(s.get("test_mae")), format_num(s.get("test_mae_uncal"))] + vals)
    return format_table(headers, body)


def fold_leaderboard(mdir: Path) -> list[str]:
    """Lines: this run's folds by OOF MAE and its overall figures (oof.json, bias.json)."""
    oof_path = mdir / "oof.json"
    if not oof_path.exists():
        return [f"no {oof_path} (run `pipeline evaluate` first)"]
    try:
        oof = json.loads(oof_path.read_text())
        rows = fold_rows(oof)
        ov = oof.get("overall", {})
    except (json.JSONDecodeError, AttributeError, TypeError) as e:
        raise PipelineError(oof_path, f"not a metrics file from `pipeline evaluate` ({type(e).__name__})") from None
    bias_path = mdir / "bias.json"
    cal = json.loads(bias_path.read_text()) if bias_path.exists() else {}
    return [f"Folds by out-of-fold MAE ({oof_path})",
            format_table(["fold", "n", "MAE", "NME", "MAE no-TTA"], rows),
            f"overall: n={ov.get('n')}  MAE {format_num(ov.get('mae'))}  NME {format_pct(ov.get('nme'))}  "
            f"MAE no-TTA {format_num(ov.get('mae_notta'))}  MAE calibrated {format_num(cal.get('oof_mae_cal'))}"
            + (f"  untrained folds {ov['untrained_folds']}" if ov.get("untrained_folds") else "")]


def leaderboard_text(mdir: Path, exps: bool = True) -> str:
    """The `leaderboard` report: folds of the current run, then every past run
    (history.jsonl, and DVC experiments when `exps`)."""
    lines = fold_leaderboard(mdir)
    runs = read_history(mdir / "history.jsonl")
    if exps:
        runs += dvc_experiments((mdir / "summary.json").as_posix())
    lines.append("")
    if runs:
        lines += [f"Runs by out-of-fold MAE ({len(runs)})", experiment_table(runs)]
    else:
        lines.append("no past runs (metrics/history.jsonl or DVC experiments)")
    return "\n".join(lines)


@click.command("leaderboard")
@click.option("--metrics", "metrics_dir", default=METRICS_DIR, show_default=True,
              help="folder of oof.json and history.jsonl (from `pipeline evaluate`)")
@click.option("--exps/--no-exps", default=True, show_default=True,
              help="also list DVC experiments (`dvc exp show`); history.jsonl is always listed")
def leaderboard_cmd(metrics_dir, exps):
    """Folds sorted by OOF MAE, then past runs sorted by OOF MAE with the params that differ."""
    click.echo(leaderboard_text(Path(metrics_dir), exps))
