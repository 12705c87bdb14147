"""`pipeline blend EXP...`: one submission from several experiments' predictions.

Each input is a folder of predictions (test.npz + oof.npz, or a folder holding
`predictions/`), or a DVC experiment name or git revision whose `predictions/` DVC
reads from its cache. The blend is a weighted mean of the inputs' predictions with
non-negative weights summing to 1, one set for the whole face or (`--per-group`) one per
keypoint group of the schema, fitted on the out-of-fold (OOF) predictions to minimise the
competition metric, the MAE over coordinates.

Honesty: the blend's OOF predictions of fold k's faces use weights fitted on the other
folds' faces only, so its OOF score is measured on faces the weights never saw, the same
promise the inputs' OOF scores make. The test weights are fitted on every OOF face. The
leaderboard also prints the in-sample score (weights fitted on the faces they score) to
show how much a blend flatters itself.

The fit: the exact non-negative least-squares fit on the simplex (every support of the
inputs tried, M <= MAX_INPUTS), then iteratively reweighted least squares towards the
L1 (MAE) optimum, keeping the best weights by MAE itself. Least squares alone would let a
few badly predicted faces (a missed detection is off by tens of pixels) set the weights."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import click
import dvc.api
import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.io import check_output, input_file, write_json
from pipeline.core.paths import CACHE_DIR
from pipeline.formats.cache import read_array, read_info, read_meta
from pipeline.formats.predictions import (
    ID_KEYS,
    OOF_KEYS,
    read_predictions,
    write_oof_predictions,
    write_test_predictions,
)
from pipeline.formats.submission import read_solution, validate_coords, write_submission
from pipeline.keypoints.calibrate import keypoint_bias, should_calibrate
from pipeline.keypoints.metrics import mae, nme
from pipeline.tools.leaderboard import format_table

log = logging.getLogger(__name__)

MAX_INPUTS = 10  # the exact simplex fit solves one small system per subset: 2^M - 1
IRLS_STEPS = 60
IRLS_FLOOR = 1e-4  # px: residuals below it weigh as if they were this large (IRLS weight 1/|r|)


# --------------------------------------------------------------------------- inputs

@dataclass
class Source:
    name: str
    where: str  # for error lines: the folder or `rev:predictions/...`
    oof: np.ndarray  # (N, K, 2) OOF of the kind the test ensemble was made with
    plain: np.ndarray  # (N, K, 2) OOF without TTA
    fold: np.ndarray  # (N,)
    test: np.ndarray  # (N_test, K, 2) fold ensemble before calibration
    test_final: np.ndarray  # (N_test, K, 2) what the input's own submission holds
    per_fold: np.ndarray  # (F, N_test, K, 2)
    folds: np.ndarray  # (F,)
    ids: dict[str, Any] = field(default_factory=dict)  # face_id / test_face_id / keypoint_names


def _load_folder(name: str, folder: Path, where: str) -> Source:
    test = read_predictions(folder / "test.npz", ("ensemble", "ensemble_raw", "per_fold", "folds", "oof_kind",
                                                  *ID_KEYS))
    oof = read_predictions(folder / "oof.npz", (*OOF_KEYS, *ID_KEYS))
    kind = str(test["oof_kind"])
    if kind not in ("tta", "plain"):
        raise PipelineError(f"{where}/test.npz", f"oof_kind must be tta or plain, got {kind!r}")
    ids = {"face_id": oof["face_id"], "test_face_id": test["face_id"], "keypoint_names": oof["keypoint_names"]}
    return Source(name, where, oof[kind].astype(np.float64), oof["plain"].astype(np.float64),
                  oof["fold"].reshape(-1).astype(np.int64), test["ensemble_raw"].astype(np.float64),
                  test["ensemble"].astype(np.float64), test["per_fold"].astype(np.float64),
                  test["folds"].reshape(-1), ids)


def _fetch_revision(rev: str, dest: Path, repo: str, subdir: str) -> None:
    """predictions/{test,oof}.npz of a DVC experiment or git revision -> dest/."""
    for name in ("test.npz", "oof.npz"):
        try:
            with dvc.api.open(f"{subdir}/{name}", repo=repo, rev=rev, mode="rb") as f:
                (dest / name).write_bytes(f.read())
        except Exception as e:  # dvc's RevError, PathMissingError, NotDvcRepoError, ...
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PipelineError(rev, f"neither a predictions folder nor a DVC experiment/revision with "
                                     f"{subdir}/{name} ({msg})") from None


def load_source(exp: str, tmp: Path, repo: str = ".", subdir: str = "predictions") -> Source:
    """One input: a folder of test.npz + oof.npz, a folder holding `subdir`/, or a DVC
    experiment / git revision of the repository `repo`."""
    p = Path(exp)
    if p.is_dir():
        folder = p if (p / "test.npz").exists() or (p / "oof.npz").exists() else p / subdir
        if not folder.is_dir():
            raise PipelineError(p, f"no predictions here (test.npz and oof.npz, or {subdir}/)")
        return _load_folder(exp, folder, str(folder))
    dest = tmp / f"input{len(list(tmp.iterdir()))}"
    dest.mkdir()
    _fetch_revision(exp, dest, repo, subdir)
    log.info("%s: read %s/ of DVC revision %s", exp, subdir, exp)
    return _load_folder(exp, dest, f"{exp}:{subdir}")


@dataclass
class Truth:
    keypoints: np.ndarray  # (N, K, 2) training faces, original px
    face_id: np.ndarray  # (N,) str
    test_face_id: np.ndarray  # (N_test,) str
    names: tuple[str, ...]
    groups: dict[str, tuple[int, ...]]
    eyes: tuple[int, int] | None


def load_truth(cache: str | os.PathLike) -> Truth:
    """Training truth, face ids and schema of a face cache (the narrow readers only)."""
    train, test = Path(cache) / "train", Path(cache) / "test"
    _, schema = read_info(train)
    truth = read_array(train, "keypoints_orig", shape_k=schema.k).astype(np.float64)
    ids = read_meta(train)["face_id"].astype(str).to_numpy()
    test_ids = read_meta(test)["face_id"].astype(str).to_numpy()
    if len(ids) != len(truth):
        raise PipelineError(train, f"meta.csv lists {len(ids)} faces, keypoints_orig.npy {len(truth)}")
    return Truth(truth, ids, test_ids, tuple(schema.names), dict(schema.groups), schema.eyes)


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    if len(got) != len(want):
        return f"{len(got)} vs {len(want)}"
    i = int(np.flatnonzero(got != want)[0])
    return f"row {i}: '{got[i]}' vs '{want[i]}'"


def check_sources(sources: Sequence[Source], truth: Truth, cache: str | os.PathLike) -> None:
    """Every input must predict the cache's faces, in its order, with its keypoints."""
    n, k = truth.keypoints.shape[:2]
    n_test = len(truth.test_face_id)
    for s in sources:
        for what, arr, want in (("OOF", s.oof, (n, k, 2)), ("OOF", s.plain, (n, k, 2)),
                                ("test", s.test, (n_test, k, 2)), ("test", s.test_final, (n_test, k, 2))):
            if arr.shape != want:
                raise PipelineError(s.where, f"{what} predictions have shape {arr.shape}, the cache {cache} "
                                             f"needs {want}: another data set, schema or crop")
        if len(s.fold) != n:
            raise PipelineError(s.where, f"oof.npz 'fold' has {len(s.fold)} entries for {n} faces")
        if s.per_fold.ndim != 4 or s.per_fold.shape[1:] != (n_test, k, 2) or len(s.per_fold) != len(s.folds):
            raise PipelineError(s.where, f"test.npz 'per_fold' has shape {s.per_fold.shape}, "
                                         f"'folds' {s.folds.shape}")
        for key, ids, split in (("face_id", truth.face_id, "train"), ("test_face_id", truth.test_face_id, "test"),
                                ("keypoint_names", np.asarray(truth.names), "schema")):
            got = s.ids[key]
            if len(got) != len(ids) or (np.asarray(got, str) != ids).any():
                raise PipelineError(s.where, f"{key.replace('test_', 'test ')} differ from the {split} of "
                                             f"{cache} ({_first_difference(np.asarray(got, str), ids)})")
        if not np.isfinite(s.test).all():
            raise PipelineError(s.where, "test predictions hold NaN/inf")


# --------------------------------------------------------------------------- the fit

def simplex_lstsq(x: np.ndarray, y: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """argmin_w sum c * (x @ w - y)^2 over w >= 0, sum w = 1; x (n, M), y (n,), c (n,) >= 0.

    Exact: the optimum is the equality-constrained optimum on its support, so every
    support is solved (one batched call) and the best feasible one is kept. The columns
    are first centred on their mean (x w - y = (x - m) w - (y - m) when sum w = 1), which
    keeps the systems well conditioned when the inputs nearly agree."""
    m = x.shape[1]
    if m == 1:
        return np.ones(1)
    ref = x.mean(1)
    z, r = x - ref[:, None], y - ref
    cz = z if c is None else z * c[:, None]
    g, b = z.T @ cz, cz.T @ r  # (M, M), (M,)
    g = g + np.eye(m) * (1e-12 * max(float(np.trace(g)), 1e-300))  # duplicate inputs: split, not singular
    masks = ((np.arange(1, 2 ** m)[:, None] >> np.arange(m)) & 1).astype(np.float64)  # (S, M)
    a = np.zeros((len(masks), m + 1, m + 1))
    a[:, :m, :m] = g * masks[:, :, None] * masks[:, None, :] + np.eye(m) * (1 - masks)[:, None, :]
    a[:, :m, m], a[:, m, :m] = masks, masks
    rhs = np.concatenate([b * masks, np.ones((len(masks), 1))], axis=1)
    w = np.linalg.solve(a, rhs[..., None])[..., :m, 0]  # (S, M)
    feasible = (w >= -1e-10).all(1)
    obj = 0.5 * np.einsum("si,ij,sj->s", w, g, w) - w @ b
    best = w[feasible][np.argmin(obj[feasible])]
    best = np.clip(best, 0, None)
    return best / best.sum()


def fit_weights(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Simplex weights (M,) minimising mean |x @ w - y|: the least-squares start, then
    IRLS (weights 1 / |residual|, each step an exact weighted simplex fit), keeping the best
    by the MAE itself; no worse than any single input."""
    m = x.shape[1]
    candidates = [np.eye(m)[i] for i in range(m)]
    w = simplex_lstsq(x, y)
    candidates.append(w)
    for _ in range(IRLS_STEPS):
        r = np.abs(x @ w - y)
        w_new = simplex_lstsq(x, y, 1.0 / np.maximum(r, IRLS_FLOOR))
        candidates.append(w_new)
        if np.abs(w_new - w).max() < 1e-9:
            break
        w = w_new
    scores = [float(np.abs(x @ c - y).mean()) for c in candidates]
    return candidates[int(np.argmin(scores))]


def group_index(groups: Mapping[str, Sequence[int]] | None, k: int) -> dict[str, np.ndarray]:
    """Keypoint groups to fit separately: the schema's groups (points in none of them form
    'other'), or one group 'all'."""
    if not groups:
        return {"all": np.arange(k)}
    out = {g: np.asarray(sorted(set(idx)), dtype=np.int64) for g, idx in groups.items()}
    rest = np.setdiff1d(np.arange(k), np.concatenate(list(out.values())))
    if len(rest):
        out["other"] = rest
    return out


def fit_keypoint_weights(preds: np.ndarray, truth: np.ndarray, groups: dict[str, np.ndarray]) -> np.ndarray:
    """(M, K) weights from preds (M, n, K, 2) and truth (n, K, 2): one simplex fit per group."""
    m, _, k, _ = preds.shape
    w = np.zeros((m, k))
    for idx in groups.values():
        x = preds[:, :, idx, :].reshape(m, -1).T  # (n * |g| * 2, M)
        w[:, idx] = fit_weights(x, truth[:, idx, :].reshape(-1))[:, None]
    return w


def apply_weights(preds: np.ndarray, w: np.ndarray) -> np.ndarray:
    """preds (M, ..., K, 2), w (M, K) -> the blend (..., K, 2)."""
    return np.einsum("m...kc,mk->...kc", preds, w)


def blend_in_folds(preds: np.ndarray, truth: np.ndarray, fold: np.ndarray, valid: np.ndarray,
                   groups: dict[str, np.ndarray], extra: Sequence[np.ndarray] = ()) -> tuple:
    """Honest OOF blend: fold f's faces blended with weights fitted on the other folds'
    valid faces. Returns (blend (N, K, 2), NaN off `valid`; {fold: (M, K) weights}; the
    same weights applied to each of `extra` (M, N, K, 2))."""
    out = np.full(preds.shape[1:], np.nan)
    extras = [np.full(e.shape[1:], np.nan) for e in extra]
    weights = {}
    for f in sorted(np.unique(fold[valid]).tolist()):
        fit, score = valid & (fold != f), valid & (fold == f)
        w = fit_keypoint_weights(preds[:, fit], truth[fit], groups)
        out[score] = apply_weights(preds[:, score], w)
        for e, o in zip(extra, extras):
            o[score] = apply_weights(e[:, score], w)
        weights[int(f)] = w
    return out, weights, extras


# --------------------------------------------------------------------------- the command

def _scores(pred: np.ndarray, truth: np.ndarray, eyes) -> dict[str, float | None]:
    ok = np.isfinite(pred).all(axis=(1, 2))
    return {"mae": mae(pred[ok], truth[ok]), "nme": nme(pred[ok], truth[ok], eyes), "n": int(ok.sum())}


def _group_table(weights: np.ndarray, groups: dict[str, np.ndarray], names: Sequence[str]) -> list[list]:
    return [[g] + [f"{weights[i, idx[0]]:.3f}" for i in range(len(names))] for g, idx in groups.items()]


def run_blend(exps: Sequence[str], cache: str | os.PathLike, out_dir: str | os.PathLike, *,
              per_group: bool = False, calibrate: str = "auto", repo: str = ".",
              solution: str | os.PathLike | None = None) -> dict[str, Any]:
    check_output(out_dir, folder=True)
    if len(exps) < 2:
        raise PipelineError(None, f"blend needs at least 2 inputs, got {len(exps)}")
    if len(exps) > MAX_INPUTS:
        raise PipelineError(None, f"blend takes at most {MAX_INPUTS} inputs, got {len(exps)}")
    if len(set(exps)) != len(exps):
        raise PipelineError(None, "an input is named twice")
    if solution:  # read only after the fitting: a wrong path fails before it
        input_file(solution, "file not found", "a CSV file")
    truth = load_truth(cache)
    with tempfile.TemporaryDirectory(prefix="blend-") as tmp:
        sources = [load_source(e, Path(tmp), repo) for e in exps]
    check_sources(sources, truth, cache)
    t = truth.keypoints
    oof = np.stack([s.oof for s in sources])  # (M, N, K, 2)
    plain = np.stack([s.plain for s in sources])
    valid = np.isfinite(oof).all(axis=(0, 2, 3)) & np.isfinite(plain).all(axis=(0, 2, 3))
    fold = sources[0].fold  # the blend's folds: the first input's (photo groups kept together)
    for s in sources[1:]:
        if not np.array_equal(s.fold, fold):
            log.info("%s splits the faces into other folds than %s: the blend's folds are %s's (still "
                     "honest: every OOF prediction is out of its own model's folds)", s.name, exps[0], exps[0])
    if len(np.unique(fold[valid])) < 2:
        raise PipelineError(sources[0].where, f"{int(valid.sum())} faces have OOF predictions from every input, "
                                              "in fewer than 2 folds: nothing to fit the weights out of fold on")
    groups = group_index(truth.groups if per_group else None, t.shape[1])

    honest, fold_weights, (honest_plain,) = blend_in_folds(oof, t, fold, valid, groups, extra=[plain])
    weights = fit_keypoint_weights(oof[:, valid], t[valid], groups)  # the test weights: every OOF face
    in_sample = apply_weights(oof, weights)
    in_sample[~valid] = np.nan
    raw = apply_weights(np.stack([s.test for s in sources]), weights)
    bias = keypoint_bias(honest, t)
    calibrated = should_calibrate(calibrate, honest, t)
    ensemble = validate_coords(raw - bias if calibrated else raw, "the blend", n_faces=len(truth.test_face_id),
                               k=t.shape[1])
    same_folds = all(np.array_equal(s.folds, sources[0].folds) for s in sources)
    per_fold, folds = ((apply_weights(np.stack([s.per_fold for s in sources]), weights), sources[0].folds)
                       if same_folds else (raw[None], np.array([-1])))

    # the leaderboard
    sol = read_solution(solution, n_rows=raw.size).reshape(raw.shape) if solution else None
    rows: list[list] = []
    report: dict[str, Any] = {"inputs": list(exps), "per_group": per_group,
                              "groups": {g: idx.tolist() for g, idx in groups.items()}}
    entries = [(s.name, s.oof, s.test_final) for s in sources] + [
        ("blend (OOF weights fitted out of fold)", honest, ensemble),
        ("blend, in-sample weights (optimistic)", in_sample, None)]
    for name, pred, test in entries:
        sc = _scores(pred[valid], t[valid], truth.eyes)
        if sol is not None and test is not None:
            sc.update(test_mae=mae(test, sol), test_nme=nme(test, sol, truth.eyes))
        report.setdefault("scores", {})[name] = sc
        rows.append([name, sc["n"], f"{sc['mae']:.4f}", "-" if sc["nme"] is None else f"{100 * sc['nme']:.3f}%"]
                    + ([] if sol is None else ["-" if test is None else f"{sc['test_mae']:.4f}"]))
    headers = ["input", "n", "OOF MAE", "OOF NME"] + ([] if sol is None else ["test MAE"])
    table = format_table(headers, rows)
    wtable = format_table(["weights"] + [s.name for s in sources], _group_table(weights, groups, exps))
    report.update(weights={g: [float(weights[i, idx[0]]) for i in range(len(sources))] for g, idx in groups.items()},
                  fold_weights={str(f): {g: [float(w[i, idx[0]]) for i in range(len(sources))]
                                         for g, idx in groups.items()} for f, w in fold_weights.items()},
                  calibrated=calibrated, calibrate=calibrate, n_valid=int(valid.sum()))

    out = Path(out_dir)
    pred_dir = out / "predictions"
    write_test_predictions(pred_dir / "test.npz", ensemble=ensemble, ensemble_raw=raw, per_fold=per_fold,
                           folds=folds, bias=bias, calibrated=calibrated, oof_kind="tta",
                           face_id=truth.test_face_id, keypoint_names=truth.names)
    write_oof_predictions(pred_dir / "oof.npz", tta=honest, plain=honest_plain, fold=fold,
                          face_id=truth.face_id, keypoint_names=truth.names)
    csv = write_submission(out / "submission.csv", ensemble, n_faces=len(truth.test_face_id), k=t.shape[1])
    write_json(out / "blend.json", report)
    report.update(table=table, weights_table=wtable, submission=str(csv))
    return report


@click.command("blend")
@click.argument("exps", nargs=-1, required=True)
@click.option("--cache", default=CACHE_DIR, show_default=True,
              help="face cache of the inputs' faces (train truth, face ids, schema)")
@click.option("--out", "out_dir", default="blend", show_default=True,
              help="writes predictions/{test,oof}.npz, submission.csv and blend.json here")
@click.option("--per-group", is_flag=True, help="one set of weights per keypoint group of the schema "
                                                "(jaw, brows, nose, eyes, mouth) instead of one for the face")
@click.option("--calibrate", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="OOF bias calibration of the blend, as predict.calibrate")
@click.option("--repo", default=".", show_default=True, help="DVC repository of experiment names")
@click.option("--solution", default=None,
              help="also score each input's and the blend's test predictions against this truth CSV")
def blend_cmd(exps, cache, out_dir, per_group, calibrate, repo, solution):
    """Blend experiments into one submission: EXP is a folder of predictions (or holding
    predictions/) or a DVC experiment name / git revision. Non-negative weights summing to
    1, fitted on the OOF predictions to minimise MAE, out of fold for the blend's own OOF
    score."""
    res = run_blend(exps, cache, out_dir, per_group=per_group, calibrate=calibrate, repo=repo, solution=solution)
    click.echo(res["table"])
    click.echo("")
    click.echo(res["weights_table"])
    click.echo(f"calibrated: {res['calibrated']}  wrote {res['submission']} and {Path(out_dir) / 'predictions'}")
