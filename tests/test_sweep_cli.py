"""``mocap-jax sweep`` and ``mocap-jax bench sweep`` through mocap_jax.cli.main."""

import collections
import json
import tomllib
from pathlib import Path

import pytest

from mocap_jax import sweep
from mocap_jax.cli import main
from mocap_jax.cli.sweep import MILLION_TOML, bucket_shares

ROOT = Path(__file__).resolve().parents[1]


def test_sweep_command_summary_dry_run_and_resume(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the dry run checks the default --out, sweep-results/quick, as the run would
    out = tmp_path / "q"
    quick = str(ROOT / "sweeps" / "quick.toml")
    assert main(["sweep", quick, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "26 points, 4 buckets, 6 blocks of up to 8" in text and "26 representative points" in text
    assert main(["sweep", quick, "--out", str(out), "--quiet", "--limit", "8"]) == 0
    text = capsys.readouterr().out
    assert "INCOMPLETE" in text and "--resume" in text
    assert main(["sweep", quick, "--out", str(out), "--quiet"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["sweep", quick, "--out", str(out), "--quiet", "--resume", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["complete"] and d["points"] == 26 and d["skipped"] == 8 and d["compiles"] <= d["buckets"]
    assert 0 < d["feasible_share"] < 1 and Path(d["results"]).exists()
    assert len(sweep.read_results(d["results"])) == 26


def test_dry_run_refuses_what_the_run_would_refuse(tmp_path, capsys):
    quick = str(ROOT / "sweeps" / "quick.toml")
    (tmp_path / "a-file").write_text("keep me")
    refusals = {("--out", str(tmp_path / "a-file")): "is a file, not a directory",
                ("--out", str(tmp_path / "a-file" / "below")): "is a file, not a directory",
                ("--out", str(tmp_path / "r.csv"), "--format", "parquet"): "ends in .csv but the format is parquet",
                ("--out", str(tmp_path / "new"), "--devices", "99"): "use between 1 and"}
    for extra, message in refusals.items():
        assert main(["sweep", quick, "--dry-run", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (extra, err)
    assert (tmp_path / "a-file").read_text() == "keep me" and not (tmp_path / "new").exists()
    out = str(tmp_path / "q")
    assert main(["sweep", quick, "--out", out, "--quiet", "--limit", "8"]) == 0
    capsys.readouterr()
    assert main(["sweep", quick, "--dry-run", "--out", out]) == 2     # an earlier run there: resume or overwrite
    assert "--resume" in capsys.readouterr().err
    for choice in ("--resume", "--overwrite"):
        assert main(["sweep", quick, "--dry-run", "--out", out, choice]) == 0
    assert "26 points, 4 buckets" in capsys.readouterr().out
    assert len(list((tmp_path / "q" / "parts").iterdir())) == 1        # a dry run changes nothing


def test_bench_sweep_json(capsys):
    # smoke run at tiny size: the first point of the million-point sweep, 3,000 rows written per format
    assert main(["bench", "sweep", "--points", "1", "--json", "--quiet", "--devices", "2", "--write-rows",
                 "3000"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["points"] == 1 and d["buckets"] == 1 and d["devices"] == 2 and d["cpu"] and d["cpus"] >= 1
    assert [w["format"] for w in d["write"]] == ["csv", "parquet"]
    assert all(w["rows"] == 3000 for w in d["write"] if "skipped" not in w)


@pytest.mark.parametrize("points", [1, 50, 437, 1200])
def test_bench_by_bucket_runs_each_buckets_share_of_the_same_points(points):
    """Each bucket's run holds exactly the million-point sweep's first points of that chunk count and
    scheme, in order (oracle: the expanded prefix of the whole sweep)."""
    full = sweep.expand(MILLION_TOML, max_points=points)
    seen = collections.Counter((row["chunks"], row["scheme"]) for row in full)
    shares = bucket_shares(MILLION_TOML, points)
    assert shares == dict(seen)
    for (chunks, scheme), n in shares.items():
        cfg = tomllib.loads(MILLION_TOML)
        cfg["grid"].update(chunks=[chunks], scheme=[scheme])
        assert sweep.expand(cfg, max_points=n) == [r for r in full if r["chunks"] == chunks and r["scheme"] == scheme]


def test_bucket_shares_stop_at_the_whole_grid():
    assert bucket_shares(MILLION_TOML, 10 ** 7) == {
        (chunks, scheme): 125_000 for chunks in (4, 8, 16, 32) for scheme in ("terapipe", "mbkr")}


def test_bench_by_bucket_refuses_options_it_cannot_honour(capsys):
    assert main(["bench", "sweep", "--by-bucket", "--out", "x.csv"]) == 2
    err = capsys.readouterr().err
    assert "--by-bucket" in err and "Traceback" not in err
    assert main(["bench", "sweep", "--by-bucket", "--write-rows", "0"]) == 2
    capsys.readouterr()
    for extra in ([], ["--by-bucket"]):       # more points than the sweep holds: refused, not quietly fewer
        assert main(["bench", "sweep", "--points", "1000001", *extra]) == 2
        err = capsys.readouterr().err
        assert "exceeds the 1,000,000 points of sweeps/million.toml" in err and err.count("\n") == 1


def test_bench_sweep_by_bucket_json(capsys):
    # smoke run at tiny size: the first point of the million-point sweep is its only bucket's one point
    assert main(["bench", "sweep", "--by-bucket", "--points", "1", "--json", "--quiet", "--devices", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["points"] == 1 and d["devices"] == 2
    assert [(b["chunks"], b["scheme"], b["points"]) for b in d["buckets"]] == [(4, "terapipe", 1)]
