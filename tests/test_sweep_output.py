"""Sweep output: paths checked before any work, Parquet beside CSV, atomic part files (a killed run resumes
to a byte-identical file) and the multi-host path (two local processes give the one-process CSV)."""

import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mocap_jax import sweep
from mocap_jax.cli import main
from mocap_jax.sweep.layout import layout
from sweep_texts import SMALL

ROOT = Path(__file__).resolve().parents[1]

def _write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """SMALL on one device: the sweep file and its results (CSV bytes)."""
    d = tmp_path_factory.mktemp("small")
    p = _write(d, SMALL)
    s = sweep.run_sweep(p, d / "ref", quiet=True, devices=1)
    return p, Path(s.results).read_bytes()


def _env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                                                               "JAX_PROCESS_ID")}
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1",
               **extra)
    return env


def _sweep_cmd(*args) -> list:
    return [sys.executable, "-m", "mocap_jax", "sweep", *map(str, args), "--quiet"]


# --------------------------------------------------------------------------- paths


def test_out_paths_refused_before_any_work(tmp_path, capsys, monkeypatch):
    p = _write(tmp_path, SMALL)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    unrelated = tmp_path / "mine"
    unrelated.mkdir()
    (unrelated / "notes.md").write_text("keep me")
    other = tmp_path / "other"
    sweep.run_sweep({"fixed": {"model": "llama3.1-8b", "hardware": "mocap-2x2", "chunks": 4},
                     "grid": {"seq_len": [4096]}, "sweep": {"name": "other"}}, other, quiet=True, devices=1)
    from mocap_jax.sweep import evaluate

    monkeypatch.setattr(evaluate.Evaluator, "start", lambda *a, **k: pytest.fail("evaluated before the checks"))
    cases = [
        (a_file, "is a file"),
        (a_file / "sub", "is a file, not a directory"),
        (unrelated, "not a sweep's output"),
        (other, "holds the sweep 'other', not 'small'"),
    ]
    for out, fragment in cases:
        assert main(["sweep", str(p), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert (unrelated / "notes.md").read_text() == "keep me" and sorted(os.listdir(unrelated)) == ["notes.md"]
    # --overwrite replaces another sweep's output, never an unrelated directory
    assert main(["sweep", str(p), "--out", str(unrelated), "--quiet", "--overwrite"]) == 2
    capsys.readouterr()
    (tmp_path / "x.parquet").write_text("not ours")
    assert main(["sweep", str(p), "--out", str(tmp_path / "x.parquet"), "--quiet"]) == 2
    assert "not from a run of this sweep" in capsys.readouterr().err
    assert main(["sweep", str(p), "--out", str(tmp_path / "x.csv"), "--format", "parquet", "--quiet"]) == 2
    assert "ends in .csv but the format is parquet" in capsys.readouterr().err
    # another format's extension names a results file we do not write, not a new directory; an existing
    # directory of that name is still a directory
    for name in ("results.json", "results.TSV", "results.pq"):
        assert main(["sweep", str(p), "--out", str(tmp_path / name), "--quiet"]) == 2
        err = capsys.readouterr().err
        stem = name.split(".")[0]
        assert f"name a results file {stem}.csv or {stem}.parquet" in err and err.count("\n") == 1, err
        assert not (tmp_path / name).exists()
    kept = tmp_path / "kept.json"
    kept.mkdir()
    assert layout(kept, "small").results == kept / "results.csv"


def test_unwritable_out_refused(tmp_path, capsys):
    p = _write(tmp_path, SMALL)
    if os.geteuid() == 0:
        target = Path("/sys/mocap-jax-sweep-test")   # not writable even by root
        if os.path.exists("/sys") and os.access("/sys", os.W_OK):
            try:
                target.mkdir()
                target.rmdir()
                pytest.skip("no location that root cannot write")
            except OSError:
                pass
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        target = locked / "out"
    assert main(["sweep", str(p), "--out", str(target), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot write there" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- formats


def test_parquet_matches_csv_and_reads_back(small, tmp_path):
    pa = pytest.importorskip("pyarrow")
    p, ref = small
    s = sweep.run_sweep(p, tmp_path / "pq", quiet=True, devices=1, format="parquet")
    assert s.complete and s.results.endswith("results.parquet") and s.compiles == 0
    rows = sweep.read_results(s.results)
    text = [dict(zip(ref.decode().splitlines()[0].split(","), line.split(",")))
            for line in ref.decode().splitlines()[1:]]
    assert len(rows) == len(text) == 200
    import pyarrow.parquet as pq

    schema = pq.read_schema(s.results)
    assert schema.field("prefill_latency_s").type == pa.float32() and schema.field("seq_len").type == pa.int64()
    assert schema.field("feasible").type == pa.bool_()
    for a, b in zip(rows, text):
        assert a["point_id"] == int(b["point_id"]) and a["feasible"] == (b["feasible"] == "true")
        assert a["seq_len"] == int(b["seq_len"]) and a["hbm_bandwidth"] == float(b["hbm_bandwidth"])
        assert np.float32(a["prefill_latency_s"]) == np.float32(b["prefill_latency_s"])
        assert a["reason"] == (b["reason"] or None) and a["load"] is None and b["load"] == ""
    # a results file named by its extension; its parts live beside it
    s2 = sweep.run_sweep(p, tmp_path / "named.parquet", quiet=True, devices=1, limit=16)
    assert not s2.complete and (tmp_path / "named.parquet.sweep" / "manifest.json").exists()
    s2 = sweep.run_sweep(p, tmp_path / "named.parquet", quiet=True, devices=1, resume=True)
    assert Path(s2.results).read_bytes() == Path(s.results).read_bytes()
    for reader in ("pandas", "polars"):
        lib = pytest.importorskip(reader)
        frame = lib.read_parquet(s.results)
        assert list(frame["point_id"]) == list(range(200)) and list(frame.columns) == list(sweep.COLUMNS)


def test_parquet_without_pyarrow_one_line(small, tmp_path, capsys, monkeypatch):
    p, _ = small
    monkeypatch.setitem(sys.modules, "pyarrow", None)   # import pyarrow -> ImportError
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--format", "parquet", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "mocap_jax[parquet]"' in err and err.count("\n") == 1


# --------------------------------------------------------------------------- atomic parts, kill and resume


def test_killed_run_resumes_to_identical_file(small, tmp_path):
    p, ref = small
    out = tmp_path / "k"
    proc = subprocess.Popen(_sweep_cmd(p, "--out", out, "--devices", "1"), env=_env(1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    parts = out / "parts"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if parts.is_dir() and len([e for e in os.listdir(parts) if e.endswith(".csv")]) >= 3:
            break
        time.sleep(0.005)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(e for e in os.listdir(parts) if e.endswith(".csv"))
    assert 3 <= len(done) < 25 and not (out / "results.csv").exists()
    # what a kill inside a write leaves: a torn temporary file (never a torn part file)
    torn = parts / f"{done[-1]}.tmp999"
    torn.write_text((parts / done[-1]).read_text()[:100])
    (out / "results.csv.tmp999").write_text("point_id,scheme\n0,ter")
    s = sweep.run_sweep(p, out, quiet=True, devices=1, resume=True)
    assert s.complete and s.skipped >= 3 * 8
    assert Path(s.results).read_bytes() == ref
    assert not [e for e in os.listdir(parts) if ".tmp" in e] and not (out / "results.csv.tmp999").exists()


# --------------------------------------------------------------------------- multi-host


def _two_processes(p, outs, *args):
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen(_sweep_cmd(p, "--out", out, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=_env(1, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                                       JAX_PROCESS_ID=str(i)))
             for i, out in enumerate(outs)]
    return procs, [proc.communicate(timeout=300) for proc in procs]


def test_a_refusal_on_one_process_stops_both(small, tmp_path):
    p, _ = small
    blocked = tmp_path / "file.txt"
    blocked.write_text("x")
    procs, results = _two_processes(p, [tmp_path / "fine", blocked / "sub"])
    assert [proc.returncode for proc in procs] == [2, 2]
    assert "another process of this multi-host run stopped" in results[0][1].decode()
    assert "is a file, not a directory" in results[1][1].decode()
    assert not (tmp_path / "fine" / "manifest.json").exists()


def test_two_processes_give_the_one_process_csv(small, tmp_path):
    p, ref = small   # one process, one device
    out = tmp_path / "two"
    procs, results = _two_processes(p, [out, out], "--json")
    for proc, (o, e) in zip(procs, results):
        assert proc.returncode == 0, e.decode()[-3000:]
    summaries = [json.loads(o.decode().strip().splitlines()[-1]) for o, _ in results]
    assert all(s["evaluated"] > 0 for s in summaries)
    assert sum(s["evaluated"] for s in summaries) == 200 and summaries[1]["feasible"] is None
    assert (out / "results.csv").read_bytes() == ref


def test_csv_cells_are_numpys_shortest_text_of_each_value():
    from mocap_jax.sweep.output import _csv_cells

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        a = np.concatenate([rng.lognormal(0, 15, 500), rng.choice([0.0, -0.0, np.inf, 1e-45, 0.1], 500)]).astype(dtype)
        assert list(_csv_cells(a, len(a))) == [str(x) for x in a.astype(str)]
    assert list(_csv_cells(np.array([True, False]), 2)) == ["true", "false"]
    assert list(_csv_cells(np.array([None, 2.0, "x"], dtype=object), 3)) == ["", "2", "x"]


def test_csv_lines_equal_the_csv_modules_rows():
    """A column whose cells are all the same is one text, written into the line pattern once; the lines
    equal the csv module's rows of the full columns, whichever columns vary and in any order."""
    from mocap_jax.sweep.output import _csv_cells, _lines, fmt

    def cells_of(v):                    # each value's own text, formatted alone
        if v is None:
            return [""] * P
        if v.dtype == bool:
            return ["true" if x else "false" for x in v]
        return list(v.astype(str)) if v.dtype.kind in "iuf" else [fmt(x) for x in v]

    rng = np.random.default_rng(1)
    P = 40
    values = [rng.lognormal(0, 5, P).astype(np.float32), np.full(P, 2.5), rng.integers(0, 3, P), np.full(P, 7),
              np.full(P, True), rng.random(P) < 0.5, np.array(["", "memory"] * (P // 2), dtype=object),
              np.full(P, "", dtype=object), None, np.array([None] * P, dtype=object), np.full(P, -0.0)]
    ids = _csv_cells(np.arange(P), P)
    for _ in range(30):
        picked = rng.permutation(len(values))[: rng.integers(1, len(values) + 1)]
        cols = [ids] + [_csv_cells(values[i], P) for i in picked]
        buf = io.StringIO()
        expected = [cells_of(np.arange(P))] + [cells_of(values[i]) for i in picked]
        csv.writer(buf, lineterminator="\n").writerows(zip(*expected))
        assert _lines(cols, P) == buf.getvalue()
    shared = [_csv_cells(v, P) for v in (np.full(P, 0.1, np.float32), np.full(P, True), np.full(P, -0.0), None)]
    assert shared == ["0.1", "true", "-0.0", ""]


def test_feasible_rows_are_counted_from_the_text_with_or_without_quotes():
    """The merged results count their feasible rows from the text: by comma positions when no cell is
    quoted, by the csv module when one is (a comma inside a quoted cell shifts the positions)."""
    from mocap_jax.sweep.merge import _count_feasible
    from mocap_jax.sweep.output import COLUMNS

    rng = np.random.default_rng(2)
    fi = COLUMNS.index("feasible")
    for quoted in (False, True):
        rows = []
        for j in range(200):
            row = [str(x) for x in rng.integers(0, 10 ** rng.integers(1, 6, len(COLUMNS)))]
            row[fi] = "true" if rng.random() < 0.6 else "false"
            if quoted and j % 7 == 0:
                row[fi - 2] = "a, b"                        # written as "a, b": one more comma before the cell
            rows.append(row)
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        lines = buf.getvalue().splitlines(keepends=True)
        assert ('"' in buf.getvalue()) == quoted
        assert _count_feasible(buf.getvalue().encode(), lines) == sum(r[fi] == "true" for r in rows)
