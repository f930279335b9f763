"""Differential tests: the vectorised simulator against the event-driven reference (DESIGN §9.1).

Random configurations (seeded: presets incl. MoE models; meshes of 4, 8, 16 and 32 dies;
sequence lengths from 256 to ~185k tokens; random chunk partitions; batches; TeraPipe and
GPipe; streaming and synchronous admission; both release policies; 1-3 batches) go
through ``mocap_jax.simulate`` / ``mocap_jax.simulate_batch`` and through
``reference_simulate``; every item's finish time and every stage's peak KV must agree to
1e-9 relative in float64 and 1e-4 in float32.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import mocap_jax
from mocap_jax.validation.agreement import (METRICS, AgreementConfig, compare, random_partition,
                                            run_reference_agreement, sample_configs, tolerance)
from mocap_jax.validation.reference import reference_simulate

SEED = 0
N64 = 40          # float64 configurations through simulate()
N32 = 24          # float32 configurations (the first N32 of the same list: shapes already seen)
CONFIGS = sample_configs(N64, SEED)


def _rel(got, want, floor):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != reference {want.shape}"
    return float((np.abs(got - want) / np.maximum(np.abs(want), floor)).max(initial=0.0))


def _check(vec, ref, cfg: AgreementConfig, dtype: str):
    tol = tolerance(dtype)
    where = f"[{dtype}] {cfg.describe()}"
    assert _rel(vec.finish_times, ref.finish_times, 1e-12) <= tol, f"finish times differ: {where}"
    assert _rel(vec.start_times, ref.start_times, ref.finish_times.max() * 1e-12) <= tol, f"start times: {where}"
    kv_scale = max(float(ref.kv_bytes.max()), 1.0)
    assert _rel(vec.kv_peak_bytes_per_stage, ref.kv_peak_bytes_per_stage, kv_scale) <= tol, \
        f"peak KV differs: {where}: {vec.kv_peak_bytes_per_stage} vs {ref.kv_peak_bytes_per_stage}"
    assert _rel(vec.peak_mem_bytes_per_stage, ref.peak_mem_bytes_per_stage, 1.0) <= tol, f"peak memory: {where}"
    margin = np.abs(ref.peak_mem_bytes_per_stage - ref.usable_hbm_bytes).min() / ref.usable_hbm_bytes
    if margin > tol:  # a feasibility flip is only excusable within rounding of the capacity
        assert bool(vec.feasible) == ref.feasible, f"feasibility differs: {where}"
        if ref.feasible:
            assert _rel(vec.prefill_latency_s, ref.prefill_latency_s, 1e-12) <= tol, f"latency: {where}"
        else:
            assert vec.prefill_latency_s == math.inf, where
    assert _rel(vec.bubble_fraction, ref.bubble_fraction, 1e-6) <= tol, f"bubble fraction: {where}"
    if dtype == "float64" and getattr(vec, "timeline_times", None) is not None:
        # the occupancy time series: the reference level after everything at each of the vectorised
        # times (an event within 1e-12 relative of a time counts as at that time: the two sides
        # may round an event time differently in the last bit)
        taus = np.asarray(vec.timeline_times) * (1 + 1e-12)
        n = len(ref.placement)
        for s in range(n):
            tl = ref.kv_timeline[s]
            level = tl[np.searchsorted(tl[:, 0], taus, side="right") - 1, 1]
            assert _rel(np.asarray(vec.timeline_kv_bytes)[:, s], level, kv_scale) <= tol, \
                f"KV occupancy of stage {s} differs: {where}"


def test_configurations_cover_the_space():
    cfgs = CONFIGS
    assert {c.hardware for c in cfgs} == {"mocap-2x2", "mocap-2x4", "mocap-4x4", "mocap-4x4x2w"}
    assert {c.scheme for c in cfgs} == {"terapipe", "gpipe"}
    assert {c.release for c in cfgs} == {"stage", "request"}
    assert {c.admission for c in cfgs} == {"streaming", "synchronous"}
    assert {c.num_batches for c in cfgs} == {1, 2, 3}
    assert {"qwen3-235b-a22b", "mixtral-8x22b"} & {c.model for c in cfgs}, "need an MoE model"
    assert any(c.partition is not None and len(set(c.partition)) > 2 for c in cfgs), "need non-uniform partitions"
    assert any(c.placement is not None for c in cfgs), "need random stage-to-die maps"
    assert sample_configs(5, SEED) == cfgs[:5], "the generator is deterministic"


@pytest.mark.parametrize("i", range(N64))
def test_simulate_agrees_with_reference_float64(i):
    cfg = CONFIGS[i]
    ref = reference_simulate(cfg.model, cfg.hardware, **cfg.kwargs())
    vec = mocap_jax.simulate(cfg.model, cfg.hardware, dtype="float64", **cfg.kwargs())
    _check(vec, ref, cfg, "float64")


@pytest.mark.parametrize("i", range(N32))
def test_simulate_agrees_with_reference_float32(i):
    cfg = CONFIGS[i]
    ref = reference_simulate(cfg.model, cfg.hardware, **cfg.kwargs())
    vec = mocap_jax.simulate(cfg.model, cfg.hardware, dtype="float32", **cfg.kwargs())
    _check(vec, ref, cfg, "float32")


@pytest.mark.parametrize("i", range(0, N64, 4))
def test_saturation_throughput_agrees_with_reference(i):
    # docs/semantics.md: throughput = B / period (B requests per batch, not per item).
    cfg = CONFIGS[i]
    ref = reference_simulate(cfg.model, cfg.hardware, **cfg.kwargs())
    vec = mocap_jax.simulate(cfg.model, cfg.hardware, dtype="float64", **cfg.kwargs())
    assert _rel(vec.throughput_rps, ref.throughput_rps, 1e-12) <= 1e-9, \
        f"throughput {vec.throughput_rps} vs reference {ref.throughput_rps}: {cfg.describe()}"


# --------------------------------------------------------------------------- simulate_batch


def _batch_rows(out, p, num_batches, k1, n):
    """Real items of point p from a padded simulate_batch result, ``[num_batches * k1, n]``."""
    f = np.asarray(out["finish_times"])[p]
    if f.ndim == 3:  # [nb, K_pad, N_pad]
        return f[:num_batches, :k1, :n].reshape(num_batches * k1, n)
    return f[: num_batches * k1, :n]  # [K_pad, N_pad], real items first


GROUPS = [
    # model, mesh, scheme, release, admission, num_batches, microbatch, points
    ("llama3-70b", "mocap-4x4", "terapipe", "stage", "streaming", 2, 1, 12),
    ("qwen3-235b-a22b", "mocap-2x4", "terapipe", "request", "synchronous", 3, 1, 12),
    ("mixtral-8x22b", "mocap-4x4x2w", "gpipe", "request", "streaming", 1, 2, 8),
    ("llama3.1-8b", "mocap-2x2", "gpipe", "stage", "synchronous", 2, 1, 8),
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("group", GROUPS, ids=[g[0] + "-" + g[2] for g in GROUPS])
def test_simulate_batch_agrees_with_reference(group, dtype):
    model, hw, scheme, release, admission, nb, mb, P = group
    rng = np.random.default_rng(hash(group) % 2**32)
    seq = np.round(2 ** rng.uniform(9, 17, size=P)).astype(np.int64)
    bat = rng.integers(1, 7, size=P)
    kw = dict(scheme=scheme, release=release, admission=admission, num_batches=nb, microbatch=mb)
    parts = None
    if scheme == "terapipe":
        # mixed chunk counts, zero-padded on the right
        counts = rng.integers(1, 13, size=P)
        parts = np.zeros((P, 12), np.int64)
        for p in range(P):
            parts[p, : counts[p]] = random_partition(rng, int(seq[p]), int(counts[p]))
    out = mocap_jax.simulate_batch(model, hw, seq, batch=bat, partition=parts, dtype=dtype, **kw)
    tol = tolerance(dtype)
    for p in range(P):
        part = None if parts is None else parts[p][parts[p] > 0].tolist()
        ref = reference_simulate(model, hw, int(seq[p]), batch=int(bat[p]), partition=part, **kw)
        K, n = ref.finish_times.shape
        where = f"[{dtype}] {model} {hw} {kw} S={seq[p]} B={bat[p]} partition={part}"
        got = _batch_rows(out, p, nb, ref.items_per_batch, n)
        assert _rel(got, ref.finish_times, 1e-12) <= tol, f"finish times differ: {where}"
        kv = np.asarray(out["kv_peak_bytes_per_stage"])[p]
        assert np.all(kv[n:] == 0), "padded stages hold nothing"
        assert _rel(kv[:n], ref.kv_peak_bytes_per_stage, max(ref.kv_bytes.max(), 1.0)) <= tol, \
            f"peak KV differs: {where}"
        assert bool(out["feasible"][p]) == ref.feasible, where
        lat = float(out["prefill_latency_s"][p])
        if ref.feasible:
            assert _rel(lat, ref.prefill_latency_s, 1e-12) <= tol, f"latency differs: {where}"
        else:
            assert lat == math.inf


# --------------------------------------------------------------------------- agreement report and CLI


def test_agreement_report_is_within_tolerance_and_counts_configs():
    res = run_reference_agreement(configs=12, seed=SEED, dtype="float64")  # first 12 of CONFIGS: compiled
    assert res["configs"] == 12 and res["dtype"] == "float64"
    for m in ("finish_times", "prefill_latency_s", "kv_peak_bytes_per_stage"):
        assert res["max_rel_err"][m] <= 1e-9, (m, res["worst"].get(m))
    assert res["feasible_mismatches"] == 0


def test_compare_detects_a_disagreement():
    cfg = CONFIGS[0]
    ref = reference_simulate(cfg.model, cfg.hardware, **cfg.kwargs())
    import dataclasses

    late = ref.finish_times.copy()
    late[-1, -1] *= 1.001
    kv = ref.kv_peak_bytes_per_stage.copy()
    kv[0] = kv[0] * 0.5 if kv[0] > 0 else 1e9
    bad = dataclasses.replace(ref, finish_times=late, kv_peak_bytes_per_stage=kv, feasible=not ref.feasible)
    errs = compare(bad, ref)
    assert errs["finish_times"] == pytest.approx(1e-3, rel=1e-6)
    assert errs["kv_peak_bytes_per_stage"] >= 0.5
    assert errs["feasible_match"] is False
    assert compare(ref, ref)["finish_times"] == 0.0


def test_validate_command_json(capsys):
    from mocap_jax.cli import main

    code = main(["validate", "--configs", "4", "--mbkr-configs", "0", "--seed", str(SEED), "--no-calibration", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (0 if out["reference_ok"] else 1)
    assert out["reference_configs"] == 4
    assert set(out["reference_max_rel_err"]) == {"float32", "float64"}
    assert out["reference_max_rel_err"]["float64"]["finish_times"] <= 1e-9
    assert out["reference_max_rel_err"]["float32"]["kv_peak_bytes_per_stage"] <= 1e-4
    assert "calibration_mape" in out and out["calibration"]["available"] is False


def test_calibration_reported_unavailable_without_its_module(monkeypatch):
    import sys

    from mocap_jax.cli.validate import calibration_check, format_validate

    monkeypatch.setitem(sys.modules, "mocap_jax.validation.calibrate", None)
    cal = calibration_check()
    assert cal["available"] is False and "calibrate" in cal["reason"]
    rep = {"dtype": "float32", "max_rel_err": {m: 0.0 for m in METRICS}, "worst": {}, "feasible_mismatches": 0,
           "infeasible_configs": 0, "mismatched": []}
    text = format_validate({"float32": rep, "float64": dict(rep, dtype="float64")}, cal, 3, True)
    assert "calibration: unavailable" in text and "PASS" in text


def test_validate_command_rejects_bad_counts(capsys):
    from mocap_jax.cli import main

    with pytest.raises(SystemExit) as e:
        main(["validate", "--configs", "0"])
    assert e.value.code == 2
    assert "positive integer" in capsys.readouterr().err


def test_bench_reference_command_json(capsys):
    from mocap_jax.cli import main

    code = main(["bench", "reference", "--configs", "24", "--model", "llama3.1-8b", "--hardware", "mocap-2x2",
                 "--chunks", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["configs"] == 24
    for k in ("speedup", "reference_wall_s", "vectorised_wall_s", "compile_s"):
        assert out[k] >= 0, k
    assert out["speedup"] == pytest.approx(out["reference_wall_s"] / out["vectorised_wall_s"], rel=1e-9)
    assert out["max_rel_err_latency"] <= 1e-4
