"""The leaderboard: `dvc exp show` rows, history lines, the tables."""

import json

from pipeline.tools.leaderboard import experiment_table, format_table, parse_dvc_exp_show, read_history

from helpers import run_cli

DVC_SHOW = [
    {"rev": "workspace", "name": None, "error": None, "experiments": None,
     "data": {"params": {"params.yaml": {"data": {"train": {"lr": 0.05}}}},
              "metrics": {"metrics/summary.json": {"data": {"mae": 0.5}}}}},
    {"rev": "b09c993207f5040a6af4b3d86ad99bbd332fe5b9", "name": "master", "error": None,
     "data": {"params": {"params.yaml": {"data": {"train": {"lr": 0.1}, "model": {"preset": "a"}}}},
              "metrics": {"metrics/summary.json": {"data": {"mae": 1.0}}}},
     "experiments": [
         {"name": "myexp", "executor": None, "revs": [
             {"rev": "0666581", "name": "myexp", "error": None, "experiments": None,
              "data": {"params": {"params.yaml": {"data": {"train": {"lr": 0.05}, "model": {"preset": "a"}}}},
                       "metrics": {"metrics/summary.json": {"data": {"mae": 0.5, "test_mae": 0.7}}}}}]},
         {"name": "shoal-knap", "executor": None, "revs": [
             {"rev": "ac89a7b", "name": "shoal-knap", "error": None, "experiments": None,
              "data": {"params": {"params.yaml": {"data": {"train": {"lr": 0.2}, "model": {"preset": "a"}}}},
                       "metrics": {"metrics/summary.json": {"data": {"mae": 2.0}}}}}]},
     ]},
]


def test_parse_dvc_exp_show_and_table():
    rows = parse_dvc_exp_show(DVC_SHOW)
    assert [r["name"] for r in rows] == ["master", "myexp", "shoal-knap"]
    assert rows[1]["params"] == {"train.lr": 0.05, "model.preset": "a"}
    table = experiment_table(rows).splitlines()
    assert table[0].split() == ["source", "name", "oof_mae", "oof_mae_cal", "oof_nme", "test_mae", "test_mae_uncal",
                                "train.lr"]
    assert [line.split()[1] for line in table[2:]] == ["myexp", "master", "shoal-knap"]
    assert table[2].split()[-1] == "0.05" and "0.7000" in table[2]
    assert "2.0000" in table[4]
    assert parse_dvc_exp_show({"not": "a list"}) == []


def test_leaderboard_dvc_missing_is_skipped(tmp_path, monkeypatch, capsys):
    import pipeline.tools.leaderboard as ev

    monkeypatch.chdir(tmp_path)

    def boom(*a, **k):
        raise FileNotFoundError("dvc")

    monkeypatch.setattr(ev.subprocess, "run", boom)
    assert ev.dvc_experiments() == []
    code, out, err = run_cli(["leaderboard"], capsys)
    assert code == 0 and "no past runs" in out and "run `pipeline evaluate` first" in out


def test_read_history_skips_broken_lines(tmp_path):
    p = tmp_path / "history.jsonl"
    p.write_text(json.dumps({"timestamp": "t1", "params": {"a": 1}, "summary": {"mae": 1.0}})
                 + "\n{broken\n\n")
    rows = read_history(p)
    assert len(rows) == 1 and rows[0]["name"] == "t1"
    assert rows[0]["summary"] == {"mae": 1.0}


def test_format_table_alignment():
    t = format_table(["name", "mae"], [["a", "1.5"], ["long", "10.25"]]).splitlines()
    assert t[0] == "name    mae"
    assert t[2] == "a       1.5"
    assert t[3] == "long  10.25"
