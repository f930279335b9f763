"""The vectorised evaluator against the event-driven reference where their semantics are identical.

Random configurations (dense and MoE models; 4 to 32 dies, two wafers, random stage subsets and
maps; GPipe, TeraPipe with random partitions, TeraPipe plans of several request groups, MBKR
without pairing; both admission modes and release policies; 1-3 batches; some too large to fit)
run through :mod:`mocap_jax.api` and the reference: times agree to 1e-12 relative in float64 and
1e-4 in float32, and so must memory and feasibility.  Also: ``simulate_batch`` against the
reference, the occupancy timeline, the harness's own comparison, and the ``validate`` and
``bench reference`` commands.
"""

from __future__ import annotations

import argparse
import functools
import json

import numpy as np
import pytest

from mocap_jax.api import simulate_batch
from mocap_jax.validation.agreement import (TOLERANCE, AgreementConfig, compare, reference, relative_error,
                                            run_reference_agreement, sample_configs, vectorised)
from mocap_jax.validation.reference import reference_simulate

SEED = 0
N64, N32 = 10, 4
CONFIGS = sample_configs(N64, SEED)
TIMING = ("finish_times", "start_times", "raw_latency_s", "period_s", "bubble_fraction")
MEMORY = ("peak_mem_bytes_per_stage", "kv_peak_bytes_per_stage", "throughput_rps")
EXACT = 1e-12

#: the array program computes a start as finish - t, which can land a rounding step before the
#: previous item's finish on the stage (or its arrival); a group released at that finish is then
#: still counted at the start that docs/semantics.md says sees the release applied


def test_configurations_cover_the_space():
    cfgs = sample_configs(60, SEED)
    assert cfgs[:N64] == CONFIGS, "the generator is deterministic"
    assert {c.hardware for c in cfgs} == {"mocap-2x2", "mocap-2x4", "mocap-4x4", "mocap-4x4x2w"}
    assert {c.scheme for c in cfgs} == {"terapipe", "gpipe", "mbkr"}
    assert any(c.groups is not None and len(c.groups) > 1 for c in cfgs), "need multi-group TeraPipe plans"
    assert {c.release for c in cfgs} == {"stage", "request"} and {c.admission for c in cfgs} == {"streaming",
                                                                                                    "synchronous"}
    assert {c.num_batches for c in cfgs} == {1, 2, 3}
    assert {"qwen3-235b-a22b", "mixtral-8x22b", "qwen3-30b-a3b"} & {c.model for c in cfgs}, "need an MoE model"
    assert any(c.placement is not None and len(c.placement) < 8 for c in cfgs), "need stage subsets"
    assert any(c.placement is not None and c.hardware == "mocap-4x4x2w" for c in cfgs), "need random maps"
    assert any(not reference(c).feasible for c in cfgs[:N64]), "need configurations that do not fit"


@functools.lru_cache(maxsize=None)
def _errors(i, dtype):
    cfg = CONFIGS[i]
    return cfg, compare(vectorised(cfg, dtype), reference(cfg))


@pytest.mark.parametrize("i", range(N64))
def test_times_agree_float64(i):
    cfg, err = _errors(i, "float64")
    for m in TIMING:
        assert err[m] <= EXACT, f"{m}: {err[m]:.2e}: {cfg.describe()}"


@pytest.mark.parametrize("i", range(N32))
def test_times_agree_float32(i):
    cfg, err = _errors(i, "float32")
    for m in TIMING:
        assert err[m] <= TOLERANCE["float32"], f"{m}: {err[m]:.2e}: {cfg.describe()}"


def test_memory_and_feasibility_agree():
    worst = {}
    for i in range(N64):
        cfg, err = _errors(i, "float64")
        worst.update({(m, i): err[m] for m in MEMORY if err[m] > EXACT})
        assert err["feasible_match"], cfg.describe()
    for i in range(N32):
        cfg, err = _errors(i, "float32")
        worst.update({(m, i, "float32"): err[m] for m in MEMORY if err[m] > TOLERANCE["float32"]})
        assert err["feasible_match"] or err["capacity_margin"] <= TOLERANCE["float32"], cfg.describe()
    assert not worst, worst


def test_smallest_case_of_a_release_at_a_start():
    # GPipe, 3 microbatches of one request, stage release: stage 0 starts microbatch 2 at the
    # instant it finishes microbatch 1 and releases it, so it holds one microbatch's KV at a time
    cfg = AgreementConfig(model="llama3.1-8b", hardware="mocap-2x2", seq_len=4096, scheme="gpipe", batch=3)
    vec, ref = vectorised(cfg, "float64"), reference(cfg)
    assert ref.kv_peak_bytes_per_stage[0] == ref.kv_bytes[0, 0]
    np.testing.assert_allclose(vec.kv_peak_bytes_per_stage, ref.kv_peak_bytes_per_stage, rtol=EXACT)


def test_simulate_batch_agrees_with_the_reference():
    seq = np.array([4096, 20000, 65536, 9000, 131072, 777, 30000, 50000])
    batch = np.array([1, 3, 8, 2, 12, 1, 5, 16])
    rng = np.random.default_rng(3)
    part = np.zeros((8, 8), np.int64)
    for p, s in enumerate(seq):
        m = int(rng.integers(1, 9))
        cuts = np.sort(rng.choice(np.arange(1, s), size=m - 1, replace=False))
        part[p, :m] = np.diff(np.concatenate([[0], cuts, [s]]))
    kw = dict(release="request", admission="synchronous", num_batches=2)
    out = simulate_batch("qwen3-235b-a22b", "mocap-2x4", seq, "terapipe", batch=batch, partition=part, dtype="float64",
                         **kw)
    for p in range(8):
        ref = reference_simulate("qwen3-235b-a22b", "mocap-2x4", int(seq[p]), partition=part[p][part[p] > 0],
                                 batch=int(batch[p]), **kw)
        assert relative_error(out["raw_latency_s"][p], ref.raw_latency_s, 1e-300) <= EXACT
        assert relative_error(out["period_s"][p], ref.period_s, 1e-300) <= EXACT
        assert bool(out["feasible"][p]) == ref.feasible
        assert relative_error(out["bubble_fraction"][p], ref.bubble_fraction, 1e-12) <= EXACT


def test_occupancy_timeline_agrees():
    # a TeraPipe plan of three groups, two batches, request release: KV on every stage over time
    cfg = AgreementConfig(model="llama3-70b", hardware="mocap-2x4", seq_len=8192, scheme="terapipe", batch=6,
                          groups=((3, (4000, 3000, 1192)), (2, (8192,)), (1, (1000, 7192))), release="request",
                          num_batches=2, placement=(0, 1, 2, 3, 7, 6, 5))
    vec, ref = vectorised(cfg, "float64", timeline=True), reference(cfg)
    times = np.asarray(vec.timeline_times)
    # the array reports just after each of its start and finish times, which it may round a step
    # apart from the reference's: compare at the last of each cluster of times 1e-12 apart
    last = np.append(np.diff(times) > 1e-12 * times[1:], True)
    at = np.searchsorted(ref.timeline_times, times[last] * (1 + 1e-12), side="right") - 1
    scale = ref.kv_bytes.max()
    np.testing.assert_allclose(np.asarray(vec.timeline_kv_bytes)[last], ref.timeline_kv_bytes[at], rtol=0,
                               atol=EXACT * scale)
    np.testing.assert_allclose(np.asarray(vec.timeline_mem_bytes)[last], ref.timeline_mem_bytes[at], rtol=EXACT)


def test_compare_reports_a_disagreement():
    cfg = CONFIGS[0]
    ref = reference(cfg)
    vec = vectorised(cfg, "float64")
    assert max(compare(vec, ref)[m] for m in TIMING) <= EXACT
    vec.finish_times = vec.finish_times * (1 + 1e-6)
    vec.peak_mem_bytes_per_stage = vec.peak_mem_bytes_per_stage * 1.01
    err = compare(vec, ref)
    assert err["finish_times"] == pytest.approx(1e-6, rel=1e-3)
    assert err["peak_mem_bytes_per_stage"] == pytest.approx(0.01, rel=1e-6)
    report = run_reference_agreement(config_list=CONFIGS[:2], dtype="float64")
    assert report["configs"] == 2 and set(report["max_rel_err"]) >= set(TIMING + MEMORY)


# --------------------------------------------------------------------------- commands


def _cli(argv):
    from mocap_jax.cli import validate

    parser = argparse.ArgumentParser(prog="mocap-jax")
    sub = parser.add_subparsers(dest="command", required=True)
    validate.register(sub, sub.add_parser("bench").add_subparsers(dest="bench_target", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_validate_command(capsys):
    code = _cli(["validate", "--configs", "2", "--mbkr-configs", "0", "--no-calibration", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["reference"]["float64"]["configs"] == 2 and out["mbkr"] is None
    assert code == (0 if out["reference_ok"] else 1)
    assert out["reference"]["float64"]["max_rel_err"]["finish_times"] <= EXACT
    _cli(["validate", "--configs", "2", "--mbkr-configs", "0", "--no-calibration"])
    text = capsys.readouterr().out
    assert "reference agreement: 2 random configurations" in text and "peak memory per stage" in text
    with pytest.raises(SystemExit):
        _cli(["validate", "--configs", "0"])


def test_bench_reference_command(capsys):
    assert _cli(["bench", "reference", "--configs", "8", "--repeats", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["configs"] == 8 and res["max_rel_err_latency"] <= 1e-4 and res["feasible_configs"] == 8
    # a call this small runs on one of the (eight fake) devices, and the benchmark says so
    assert res["devices"] == 1 and res["local_devices"] == 8
    assert res["cpu"] and res["cpus"] >= 1                    # the host it ran on, for same-CPU comparisons
