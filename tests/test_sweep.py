"""Declared sweeps (mocap_jax.sweep): expansion, validation, infeasible rows, resume, determinism, sharding,
one compile per bucket.  Runs on the 8 fake CPU devices of conftest.py."""

import math
from pathlib import Path

import chex
import jax
import numpy as np
import pytest

from mocap_jax import api, sweep
from mocap_jax.sweep import evaluate
from sweep_texts import SERVING

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "sweeps" / "quick.toml"


def _write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _rows(path):
    return sweep.read_results(path)


@pytest.fixture
def limit_traces(monkeypatch):
    """``limit_traces(n)``: from now on, fail if the per-micro-batch function of the block programs is traced
    more than ``n`` times (programs already compiled in this process are reused, not traced)."""

    def limit(n: int):
        chex.clear_trace_counter()
        monkeypatch.setattr(evaluate, "_lean", chex.assert_max_traces(evaluate._lean, n=n))

    return limit


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """quick.toml once, sharded over all 8 devices (reused by several tests)."""
    out = tmp_path_factory.mktemp("quick") / "full"
    s = sweep.run_sweep(QUICK, out, quiet=True)
    return s, out


# --------------------------------------------------------------------------- expansion


def test_expand_grid_rows_fixed_and_defaults():
    pts = sweep.expand(QUICK)
    assert len(pts) == 2 * 3 * 2 * 2 + 2
    # the last grid key varies fastest; [fixed] and defaults apply everywhere
    assert [(p["scheme"], p["seq_len"], p["chunks"], p["batch"]) for p in pts[:3]] == [
        ("terapipe", 4096, 2, 1), ("terapipe", 4096, 2, 8), ("terapipe", 4096, 4, 1)]
    assert all(p["model"] == "llama3.1-8b" and p["hardware"] == "mocap-2x2" for p in pts)
    assert pts[0]["num_batches"] == 2 and pts[0]["pairing"] == "cross-half" and pts[0]["hbm_capacity"] is None
    assert pts[-1]["scheme"] == "gpipe" and pts[-1]["release"] == "request" and pts[-1]["batch"] == 4
    d = sweep.describe(QUICK)
    assert d["points"] == 26 and len(d["buckets"]) == 4   # release is static structure: its own bucket


def test_several_grids_and_max_points():
    cfg = {"grid": [{"seq_len": [4096, 8192], "chunks": [2, 4]}, {"seq_len": [16384], "batch": [1, 2, 3]}],
           "fixed": {"model": "llama3.1-8b", "hardware": "mocap-2x2"}}
    pts = sweep.expand(cfg)
    assert len(pts) == 4 + 3 and pts[4]["seq_len"] == 16384 and pts[4]["chunks"] == 16
    assert len(sweep.expand(cfg, max_points=5)) == 5


def test_a_row_that_only_restates_the_defaults_is_a_point(tmp_path):
    """An empty [[points]] row is the defaults (with [fixed]): planned, evaluated and written like any other."""
    text = '[fixed]\nmodel = "llama3.1-8b"\nhardware = "mocap-2x2"\nseq_len = 4096\nchunks = 4\n[[points]]\n'
    assert [p["batch"] for p in sweep.expand(_write(tmp_path, text))] == [1]
    s = sweep.run_sweep(_write(tmp_path, text), tmp_path / "out", quiet=True)
    rows = _rows(s.results)
    assert s.points == 1 and [int(r["batch"]) for r in rows] == [1]
    one = api.simulate("llama3.1-8b", "mocap-2x2", 4096, chunks=4, batch=1, timeline=False)
    assert float(rows[0]["raw_latency_s"]) == pytest.approx(one.raw_latency_s, rel=1e-6)


def test_shipped_sweeps_plan():
    m = sweep.describe(ROOT / "sweeps" / "million.toml")
    assert m["points"] == 1_000_000 and len(m["buckets"]) == 8
    meshes = sweep.describe(ROOT / "sweeps" / "meshes.toml")
    stage_buckets = {b["key"][3] for b in meshes["buckets"]}
    assert stage_buckets == {4, 8, 16, 32, 64} and len(meshes["buckets"]) == 15


def test_embedded_million_matches_file():
    from mocap_jax.cli.sweep import MILLION_TOML

    assert (ROOT / "sweeps" / "million.toml").read_text() == MILLION_TOML


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("text,fragments", [
    ("[grid]\nchunk = [4]\n", ["chunk", "Did you mean 'chunks'"]),
    ("[grid]\nseq_len = []\n", ["seq_len", "empty"]),
    ("[grid]\nseq_len = [\"long\"]\n", ["seq_len", "integer", "'long'"]),
    ("[grid]\nseq_len = 4096\n", ["seq_len", "list"]),
    ("[fixed]\nchunks = [4]\n[grid]\nseq_len = [4096]\n", ["chunks", "single value"]),
    ("[grid]\nscheme = [\"terapip\"]\n", ["scheme", "terapipe"]),
    ("[grid]\np2 = [1.5]\n", ["p2", "1.5", "largest accepted value, 1"]),
    ("[grid]\nhbm_capacity = [-1.0]\n", ["hbm_capacity", "> 0", "-1.0"]),
    ("[sweep]\nblok_size = 4\n[grid]\nseq_len = [4096]\n", ["blok_size", "block_size"]),
    ("[grids]\nseq_len = [4096]\n", ["grids", "[grid]"]),
    ("[sweep]\nname = \"x\"\n", ["no points"]),
    ("[grid]\nmodel = [\"llama3-7b\"]\n", ["model", "llama3"]),
    ("[grid]\nseq_len = [16, 4096]\nchunks = [32]\n", ["chunks", "seq_len", "point 0"]),
    ("[fixed]\nmodel = \"llama3.1-405b\"\nhardware = \"mocap-2x2\"\n[grid]\nseq_len = [4096]\n",
     ["llama3.1-405b", "does not fit", "mocap-2x2"]),
    ("[fixed]\nmodel = \"llama3.1-8b\"\n[grid]\nrows = [8]\ncols = [8]\n", ["32 layers", "stages", "rows"]),
    ("[grid]\nscheme = [\"lbcp\"]\nbatch = [2]\n", ["lbcp", "batch", "auto"]),
    ("[grid]\np1 = [0.9]\np2 = [0.5]\n", ["p1", "p2"]),
    ("[fixed]\nmodel = \"llama3-70b\"\ntp = 3\n[grid]\nseq_len = [4096]\n",
     ["tp = 3 does not divide the 64 attention heads", "llama3-70b"]),
    ("[fixed]\nmodel = \"llama3-70b\"\nhardware = \"mocap-2x3\"\ntp = 4\n[grid]\nseq_len = [4096]\n",
     ["no rectangle of tp = 4 dies tiles the 2x3 grid", "mocap-2x3"]),
    ("[grid]\ntp = [0]\n", ["tp", "positive"]),
    ("[grid]\nscheme = [\"lbcp\"]\nbatch = [\"auto\"]\nhardware = [\"h100-x8\"]\ntp = [3]\n", ["tp = 3", "does not divide"]),
])
def test_validation_errors_name_key_and_file(tmp_path, text, fragments, limit_traces):
    p = _write(tmp_path, text)
    limit_traces(0)   # nothing is traced
    with pytest.raises(ValueError) as e:
        sweep.run_sweep(p, tmp_path / "out", quiet=True)
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg
    for f in fragments:
        assert f in msg, (f, msg)
    assert not (tmp_path / "out").exists()   # refused before the output directory is touched


def test_cli_bad_file_exits_2_without_traceback(tmp_path, capsys):
    from mocap_jax.cli import main

    p = _write(tmp_path, "[grid]\nseq_len = [16]\nchunks = [64]\n")
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "chunks" in err and str(p) in err
    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read sweep file" in capsys.readouterr().err
    ok = _write(tmp_path, "[grid]\nseq_len = [8192]\n")
    for dry in ([], ["--dry-run"]):   # contradictory flags: refused, in a dry run too, before anything is written
        assert main(["sweep", str(ok), "--out", str(tmp_path / "r"), "--resume", "--overwrite", *dry]) == 2
        assert "give one of them" in capsys.readouterr().err and not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="resume continues an earlier run and overwrite discards it"):
        sweep.run_sweep(ok, tmp_path / "r", resume=True, overwrite=True, quiet=True)


def test_impossible_points_as_rows(tmp_path):
    text = ("[sweep]\nimpossible = \"infeasible\"\n[fixed]\nmodel = \"llama3.1-8b\"\nhardware = \"mocap-2x2\"\n"
            "[grid]\nseq_len = [2, 4096]\nchunks = [2, 4]\n")   # one bucket (K4) besides the impossible point
    s = sweep.run_sweep(_write(tmp_path, text), tmp_path / "o", quiet=True, devices=1)
    rows = _rows(s.results)
    assert [r["reason"] for r in rows] == ["", "chunks>seq_len", "", ""]
    bad = rows[1]
    assert bad["feasible"] == "false" and bad["prefill_latency_s"] == "inf" and bad["throughput_rps"] == "0.0"
    assert s.feasible == 3


# --------------------------------------------------------------------------- running


def test_quick_rows_infeasible_and_matches_simulate(quick_run):
    s, out = quick_run
    assert s.complete and s.points == 26 and s.evaluated == 26 and s.compiles <= s.buckets == 4
    assert s.devices == len(jax.devices()) == 8
    rows = _rows(out / "results.csv")
    assert [int(r["point_id"]) for r in rows] == list(range(26))
    assert list(rows[0]) == list(sweep.COLUMNS)
    text = (out / "results.csv").read_text()
    assert "nan" not in text.lower()
    infeasible = [r for r in rows if r["feasible"] == "false"]
    assert infeasible and all(r["prefill_latency_s"] == "inf" and r["reason"] == "memory" for r in infeasible)
    assert s.feasible == 26 - len(infeasible)
    assert all(r["mocap_jax_version"] and r["config_hash"] == s.config_hash and r["devices"] == "8" for r in rows)
    # the vectorised sweep agrees with simulate() point by point
    for r in rows[::9] + rows[-1:]:   # TeraPipe (feasible, infeasible), MBKR, GPipe
        kw = {} if r["scheme"] == "gpipe" else {"chunks": int(r["chunks"])}
        ref = api.simulate(r["model"], r["hardware"], int(r["seq_len"]), r["scheme"], batch=int(r["batch"]),
                           release=r["release"], timeline=False, **kw)
        assert (r["feasible"] == "true") == ref.feasible
        assert math.isclose(float(r["raw_latency_s"]), ref.raw_latency_s, rel_tol=1e-5)
        assert math.isclose(float(r["max_peak_mem_bytes"]), ref.peak_mem_bytes_per_stage.max(), rel_tol=1e-5)
        if r["scheme"] == "mbkr":
            assert math.isclose(float(r["spilled_bytes"]), ref.extra["spilled_bytes"], rel_tol=1e-5, abs_tol=1.0)


def test_sharded_equals_unsharded_any_block_layout(quick_run, tmp_path):
    s8, out8 = quick_run
    # one device, smaller blocks (so different blocks and a narrower vmap) -> the same numbers, bit for bit
    s1 = sweep.run_sweep(QUICK, tmp_path / "one", quiet=True, devices=1, block_size=4)
    assert s1.devices == 1 and s8.devices == 8 and s1.blocks > s8.blocks
    a, b = _rows(out8 / "results.csv"), _rows(s1.results)
    for ra, rb in zip(a, b, strict=True):
        ra.pop("devices"), rb.pop("devices")
        assert ra == rb


def test_deterministic(quick_run, tmp_path):
    _, out = quick_run
    again = sweep.run_sweep(QUICK, tmp_path / "again", quiet=True)
    assert again.compiles == 0   # same shapes and devices: the compiled programs are reused
    assert (out / "results.csv").read_bytes() == Path(again.results).read_bytes()


def test_resume_after_limit_and_lost_block(quick_run, tmp_path):
    _, full = quick_run
    out = tmp_path / "r"
    s = sweep.run_sweep(QUICK, out, quiet=True, limit=8)
    assert not s.complete and s.results is None and s.evaluated == 8
    assert not (out / "results.csv").exists()
    with pytest.raises(ValueError, match="--resume"):
        sweep.run_sweep(QUICK, out, quiet=True)
    s = sweep.run_sweep(QUICK, out, quiet=True, resume=True)
    assert s.complete and s.skipped == 8 and s.evaluated == 18
    assert (out / "results.csv").read_bytes() == (full / "results.csv").read_bytes()
    # lose one block: only that block is recomputed
    part = sorted((out / "parts").glob("b001-*.csv"))[0]
    part.unlink()
    s = sweep.run_sweep(QUICK, out, quiet=True, resume=True)
    assert s.evaluated == 8 and s.skipped == 18 and s.compiles == 0
    assert (out / "results.csv").read_bytes() == (full / "results.csv").read_bytes()
    # a changed configuration does not reuse the old blocks
    changed = QUICK.read_text().replace("seed = 0", "seed = 1")
    p = _write(tmp_path, changed, "quick2.toml")
    s = sweep.run_sweep(p, out, quiet=True, resume=True)
    assert s.skipped == 0 and s.evaluated == 26


def test_meshes_in_one_run_compile_once_per_bucket(tmp_path, limit_traces):
    text = """
[sweep]
name = "meshes-small"
[fixed]
model = "llama3-70b"
seq_len = 16384
chunks = 4
[[grid]]
rows = [2, 4]
cols = [2, 4, 8]
batch = [1, 2]
[[grid]]
hardware = ["mocap-4x4x2w", "mocap-2x4"]
wafers = [2]
batch = [1]
"""
    p = _write(tmp_path, text)
    limit_traces(4)                             # one trace per bucket
    s = sweep.run_sweep(p, tmp_path / "o", quiet=True, devices=2)
    rows = _rows(s.results)
    assert s.points == 12 + 2 and s.complete
    stages = {(r["hardware"], r["stages"]) for r in rows}
    assert ("mocap-2x2", "4") in stages and ("mocap-4x8", "32") in stages and ("mocap-4x4x2w", "32") in stages
    assert ("mocap-2x4x2w", "16") in stages and ("mocap-2x8", "16") in stages
    assert s.buckets == 4                       # stage buckets 4, 8, 16, 32
    assert s.compiles <= s.buckets
    assert all(r["feasible"] == "true" for r in rows)
    lat = {r["hardware"]: float(r["prefill_latency_s"]) for r in rows if r["batch"] == "1"}
    assert lat["mocap-4x8"] < lat["mocap-2x2"]


TP_SWEEP = """
[sweep]
impossible = "infeasible"
block_size = 8
[fixed]
model = "llama3-70b"
scheme = "mbkr"
seq_len = 32768
chunks = 8
stages = 4
num_batches = 1
[[grid]]
hardware = ["mocap-4x4"]
tp = [1, 2, 4]
batch = [98, 199]
[[grid]]
hardware = ["mocap-4x4", "mocap-2x3"]
tp = [3, 4, 8]
batch = [1]
"""


def test_tp_grid_matches_simulate_and_compiles_once(tmp_path, limit_traces):
    # tp = 1, 2, 4 at four stages share one bucket (K8 N4, static MBKR): the degree and the group
    # routes are traced numbers, so the bucket's program is traced once (an MBKR program traces the
    # per-micro-batch function twice: the pass without MBKR and the spill pass)
    limit_traces(2)
    s = sweep.run_sweep(_write(tmp_path, TP_SWEEP), tmp_path / "o", quiet=True, devices=2)
    rows = _rows(s.results)
    assert s.complete and s.points == 12 and s.compiles <= 1
    fast, bad = rows[:6], rows[6:]
    assert {r["tp"] for r in fast} == {"1", "2", "4"} and all(r["stages"] == "4" for r in fast)
    assert any(r["feasible"] == "true" and float(r["spilled_bytes"]) > 0 for r in fast)
    assert any(r["feasible"] == "false" for r in fast)
    for r in fast:
        ref = api.simulate("llama3-70b", "mocap-4x4", 32768, "mbkr", chunks=8, stages=4, num_batches=1,
                           batch=int(r["batch"]), tp=int(r["tp"]), timeline=False)
        assert (r["feasible"] == "true") == ref.feasible, r
        assert math.isclose(float(r["raw_latency_s"]), ref.raw_latency_s, rel_tol=1e-5)
        assert math.isclose(float(r["max_peak_mem_bytes"]), ref.peak_mem_bytes_per_stage.max(), rel_tol=1e-5)
        assert math.isclose(float(r["spilled_bytes"]), ref.extra["spilled_bytes"], rel_tol=1e-5, abs_tol=1.0)
        assert math.isclose(float(r["max_stage_weight_bytes"]), ref.weight_bytes_per_stage.max(), rel_tol=1e-6)
    assert [(r["hardware"], r["tp"], r["reason"]) for r in bad] == [
        ("mocap-4x4", "3", "tp-heads"), ("mocap-4x4", "4", ""), ("mocap-4x4", "8", "stages>dies"),
        ("mocap-2x3", "3", "tp-heads"), ("mocap-2x3", "4", "tp-tiling"), ("mocap-2x3", "8", "tp-tiling")]
    assert all(r["feasible"] == "false" and r["prefill_latency_s"] == "inf" for r in bad if r["reason"])


def test_serving_load_gives_e2e_columns(tmp_path):
    import jax.numpy as jnp

    from mocap_jax.api import resolve
    from mocap_jax.serving.arrivals import arrival_times
    from mocap_jax.serving.e2e import ServingShape, e2e_latency_jit

    text = SERVING.format(loads="2.0, 50.0")
    s = sweep.run_sweep(_write(tmp_path, text), tmp_path / "o", quiet=True, devices=1)
    rows = _rows(s.results)
    for r in rows:
        assert float(r["e2e_p99_s"]) >= float(r["e2e_p50_s"]) and float(r["load_throughput_rps"]) > 0
        assert r["load_rps"] in ("2", "50")
        if r["batch"] == "1":
            assert float(r["e2e_mean_s"]) >= float(r["prefill_latency_s"]) * 0.999
    by = {(r["batch"], r["load_rps"]): float(r["e2e_mean_s"]) for r in rows}
    assert by[("1", "50")] > by[("1", "2")]          # heavier load -> longer queues
    # the same EvaluateE2E call the scheme comparison makes, for one point
    cfg = resolve("llama3.1-8b", "mocap-2x2", 8192, "terapipe", chunks=4, batch=4, placement="snake")
    arr = jnp.asarray(arrival_times("poisson", 50.0, 16, 0), jnp.float32)
    e2e = e2e_latency_jit(cfg.point(4), cfg.partition.astype(np.int32), 8192, 1, 4, arr, jnp.zeros((4, 4), jnp.float32),
                          0, ServingShape(prefill=cfg.shape(4)._replace(batches=1), requests=16))
    assert math.isclose(by[("4", "50")], float(e2e["mean_s"]), rel_tol=1e-5)


@pytest.mark.slow
def test_slow_schemes_one_point_at_a_time(tmp_path):
    text = """
[fixed]
model = "llama3.1-8b"
hardware = "mocap-2x2"
seq_len = 8192
chunks = 4
granularity = 512
chains = 8
steps = 20
batch = "auto"
[grid]
scheme = ["lbcp", "terapipe"]
"""
    s = sweep.run_sweep(_write(tmp_path, text), tmp_path / "o", quiet=True, devices=1)
    rows = _rows(s.results)
    assert [r["scheme"] for r in rows] == ["lbcp", "terapipe"]
    assert all(r["feasible"] == "true" and int(r["batch_used"]) >= 1 and r["partition"] for r in rows)
    assert sum(int(x) for x in rows[0]["partition"].split("-")) == 8192


def test_e2e_clock_too_coarse_is_refused_not_written(tmp_path):
    # requests spread over ~16,000 s: float32 resolves ~1 ms there, too coarse for a ~10 ms latency
    text = SERVING.format(loads="2.0, 1e-3")   # the serving test's compiled program
    with pytest.raises(ValueError) as e:
        sweep.run_sweep(_write(tmp_path, text), tmp_path / "o", quiet=True, devices=1)
    msg = str(e.value)
    assert "point 1: load = 0.001" in msg and "float32 resolves time only to" in msg and "float64" in msg
    assert not (tmp_path / "o" / "results.csv").exists()
    assert not list((tmp_path / "o" / "parts").iterdir())


@pytest.mark.parametrize("devices,fragment", [
    (0, "use between 1 and 8"), (99, "use between 1 and 8"), ("cpu", "a count, or a list of JAX devices; got 'cpu'"),
    ([0, 1], "each a JAX device"), ([], "at least one device"),
])
def test_devices_are_refused_before_anything_runs(tmp_path, devices, fragment):
    with pytest.raises(ValueError, match=fragment):
        sweep.run_sweep({"grid": {"seq_len": [8192]}}, tmp_path / "o", quiet=True, devices=devices)
    assert not (tmp_path / "o").exists()


def test_only_the_evaluate_module_calls_the_simulator(imports_of):
    import importlib

    simulator = {"api", "schedule", "serving", "mbkr", "compare", "prefill", "partition", "study"}

    def modules(module) -> set:   # "from ..x.y import z" -> x; "from .. import y" -> y
        out = set()
        for i in imports_of(module):
            mod, _, names = i.partition(":")
            out |= set(names.split(",")) if not mod else {mod.split(".")[0]}
        return out

    for name in ("arrays", "config", "space", "resolver", "plan", "layout", "output", "runner"):
        used = modules(importlib.import_module(f"mocap_jax.sweep.{name}")) & simulator
        assert not used, (name, used)
    assert {"prefill", "schedule", "serving", "mbkr", "partition"} <= modules(evaluate)


E2E_OBJECTIVE = """
[sweep]
impossible = "infeasible"
[fixed]
model = "llama3.1-8b"
hardware = "mocap-2x2"
scheme = "lbcp"
seq_len = 8192
chunks = 4
batch = "auto"
granularity = 256
chains = 2
steps = 2
objective = "e2e"
requests = 16
[grid]
load = [50.0]
[[points]]
seed = 1
"""


def test_the_e2e_partition_objective_plans_at_the_point_load(tmp_path):
    from mocap_jax.partition.plan import PlanSettings, plan_partition

    s = sweep.run_sweep(_write(tmp_path, E2E_OBJECTIVE), tmp_path / "o", quiet=True, devices=1)
    planned, no_load = _rows(s.results)
    want = plan_partition("llama3.1-8b", "mocap-2x2", 8192, "lbcp", load=50.0, requests=16,
                          settings=PlanSettings(chunks=4, granularity=256, chains=2, steps=2, objective="e2e"))
    assert planned["feasible"] == "true" and planned["load_rps"] == "50"
    assert planned["partition"] == "-".join(str(c) for c in want["partition"])
    assert planned["batch_used"] == str(want["batch"])
    assert no_load["feasible"] == "false" and no_load["reason"] == "e2e-load"
