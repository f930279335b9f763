"""The Python API boundary: every argument either raises one ValueError with a message or gives an honest
result (fuzzed), float32 against float64 at the extremes the validation admits, compile counts, and the
honesty invariant of batched results."""

import math

import chex
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mocap_jax as mj
from mocap_jax.api import max_feasible_batch, max_feasible_seq_len, resolve, simulate, simulate_batch
from mocap_jax.prefill import batch as prefill_batch
from mocap_jax.prefill.batch import DishonestResult, check_honest
from mocap_jax.specs import LIMITS

ANY = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                st.lists(st.integers(-5, 5), max_size=3), st.sampled_from([0, 1, 2, 4096, 4096.0, 4096.5, "4096"]))


def _honest(r) -> None:
    if r.feasible:
        assert math.isfinite(r.prefill_latency_s) and r.prefill_latency_s > 0
        assert math.isfinite(r.throughput_rps) and r.throughput_rps > 0
        assert np.all(np.isfinite(r.peak_mem_bytes_per_stage)) and np.all(r.peak_mem_bytes_per_stage >= 0)
    else:
        assert r.prefill_latency_s == math.inf and r.throughput_rps == 0.0
    assert not np.isnan(r.finish_times).any()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(["seq_len", "batch", "chunks", "num_batches", "microbatch", "stages", "p1", "p2",
                              "read_overlap", "dtype", "release", "admission", "scheme", "pairing", "partition",
                              "placement", "tp", "max_batch"]), value=ANY)
def test_fuzzed_arguments_give_a_message_or_an_honest_result(field, value):
    kw = dict(model="llama3.1-8b", hardware="mocap-2x2", seq_len=4096, scheme="mbkr", chunks=4, batch=2,
              num_batches=1, timeline=False)
    kw[field] = value
    if field == "partition":
        kw.pop("chunks")
    try:
        r = simulate(**kw)
    except ValueError as e:
        assert str(e) and "\n" not in str(e)
        return
    _honest(r)


@pytest.mark.parametrize("kw,fragment", [
    (dict(num_batches=0), "num_batches"),
    (dict(seq_len=math.inf), "integer"),
    (dict(seq_len="4096"), "integer"),
    (dict(seq_len=4096.5), "integer"),
    (dict(batch=2.5), "integer"),
    (dict(dtype="banana"), "dtype"),
    (dict(partition=[2048, 0, 2048], chunks=None), "partition"),
    (dict(seq_len=2 ** 31), "largest value"),
    (dict(batch=2 ** 31), "largest value"),
    (dict(scheme="gpipe", partition=[1024, 3072], chunks=None), "not gpipe"),
])
def test_api_bad_input_is_a_value_error(kw, fragment):
    args = dict(model="llama3.1-8b", hardware="mocap-2x2", seq_len=4096, chunks=4)
    args.update(kw)
    with pytest.raises(ValueError, match=fragment):
        simulate(**args)


def test_batched_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match="block_size"):
        simulate_batch("llama3.1-8b", "mocap-2x2", 4096, block_size=-4)
    with pytest.raises(ValueError, match="largest value"):
        simulate_batch("llama3.1-8b", "mocap-2x2", 4096, batch=2 ** 31)
    with pytest.raises(ValueError, match="different numbers"):
        simulate_batch("llama3.1-8b", "mocap-2x2", [4096, 8192], batch=[1, 2, 3])
    with pytest.raises(ValueError, match="largest value"):
        max_feasible_seq_len("llama3.1-8b", "mocap-2x2", max_seq_len=4611686018427387904)
    with pytest.raises(ValueError, match=r"chunks=3 but partition rows have \[2\] chunks"):
        simulate_batch("llama3.1-8b", "mocap-2x2", 8000, chunks=3, partition=[[4000, 4000]])
    for rows in ([[0, 8000]], [[4000, 0, 4000]], [[0, 0]]):                  # zeros only as right padding
        with pytest.raises(ValueError, match="zeros only as right padding"):
            simulate_batch("llama3.1-8b", "mocap-2x2", 8000, partition=rows)
    with pytest.raises(ValueError, match="partition row 1 sums to 7999 but seq_len is 8000"):
        simulate_batch("llama3.1-8b", "mocap-2x2", 8000, partition=[[4000, 4000], [3999, 4000]])
    with pytest.raises(ValueError, match="seq_len and batch need at least one value each"):
        simulate_batch("llama3.1-8b", "mocap-2x2", [])
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['nope'\]; choose from finish, start"):
        simulate_batch("llama3.1-8b", "mocap-2x2", 4096, fields=("feasible", "nope"))
    assert set(simulate_batch("llama3.1-8b", "mocap-2x2", 4096, chunks=4, fields="feasible")) == {"feasible"}
    with pytest.raises(ValueError, match="not gpipe"):
        simulate_batch("llama3.1-8b", "mocap-2x2", 8000, "gpipe", partition=[[4000, 4000]])
    for fractions, fragment in (([0.9, 0.9], "summing to 1"), ([-1.0, 2.0], "positive"), ([0.5, 0.25, 0.25], "per chunk"),
                                ([0.5, math.nan], "positive"), ("half", "numbers")):
        with pytest.raises(ValueError, match=fragment):
            max_feasible_seq_len("llama3.1-8b", "mocap-2x2", chunks=2, fractions=fractions)


def test_the_largest_admitted_values_stay_honest_in_float32_and_agree_with_float64():
    """At the validation's limits (the longest prompt, the largest batch) results are infeasible or
    finite, and float32 matches float64 where it matters (latency, memory, feasibility)."""
    for kw in (dict(seq_len=LIMITS["seq_len"], batch=1, chunks=64), dict(seq_len=4096, batch=LIMITS["batch"], chunks=4),
               dict(seq_len=2 ** 20, batch=64, chunks=16)):
        r32 = simulate("llama3.1-8b", "mocap-4x4", scheme="terapipe", num_batches=1, timeline=False, **kw)
        r64 = simulate("llama3.1-8b", "mocap-4x4", scheme="terapipe", num_batches=1, timeline=False, dtype="float64",
                       **kw)
        _honest(r32)
        assert r32.feasible == r64.feasible
        assert r32.raw_latency_s == pytest.approx(r64.raw_latency_s, rel=1e-5)
        np.testing.assert_allclose(r32.peak_mem_bytes_per_stage, r64.peak_mem_bytes_per_stage, rtol=1e-5)


def test_batch_float32_agrees_with_float64():
    rng = np.random.default_rng(0)
    parts = rng.multinomial(65536 - 16, np.ones(16) / 16, size=64) + 1
    kw = dict(batch=rng.integers(1, 64, 64), partition=parts, num_batches=2, placement="snake")
    for scheme in ("terapipe", "mbkr"):
        a = simulate_batch("llama3-70b", "mocap-4x4", 65536, scheme, **kw)
        b = simulate_batch("llama3-70b", "mocap-4x4", 65536, scheme, dtype="float64", **kw)
        np.testing.assert_array_equal(a["feasible"], b["feasible"])
        np.testing.assert_allclose(a["raw_latency_s"], b["raw_latency_s"], rtol=1e-5)
        np.testing.assert_allclose(a["peak_mem_bytes_per_stage"], b["peak_mem_bytes_per_stage"], rtol=1e-5)


def test_one_compiled_program_per_bucket(monkeypatch):
    """Every count, partition, batch and sequence length inside a bucket reuses one program."""
    prefill_batch._program.cache_clear()
    from mocap_jax.prefill import evaluate as ev

    traced = chex.assert_max_traces(ev.evaluate, n=1)
    monkeypatch.setattr(prefill_batch, "evaluate", traced)
    chex.clear_trace_counter()
    for P, S in ((3, 8192), (5, 16384), (8, 65536)):
        simulate_batch("llama3.1-8b", "mocap-2x2", S, chunks=8, batch=np.arange(1, P + 1), num_batches=1,
                       fields=("feasible",))


def test_searches_agree_with_simulate():
    B = max_feasible_batch("llama3-70b", "mocap-4x4", 131072, chunks=16)
    assert simulate("llama3-70b", "mocap-4x4", 131072, chunks=16, batch=B, timeline=False).feasible
    assert not simulate("llama3-70b", "mocap-4x4", 131072, chunks=16, batch=B + 1, timeline=False).feasible
    S = max_feasible_seq_len("llama3-70b", "mocap-4x4", chunks=16, num_batches=1, granularity=65536)
    assert simulate("llama3-70b", "mocap-4x4", S, chunks=16, num_batches=1, timeline=False).feasible
    assert not simulate("llama3-70b", "mocap-4x4", S + 65536, chunks=16, num_batches=1, timeline=False).feasible


def test_max_seq_is_zero_when_not_even_the_shortest_sequence_fits():
    """The search's lower end for M chunks is M tokens; one below it is no answer, it is 0."""
    big = 1 << 20
    assert not simulate("llama3.1-8b", "mocap-2x2", 4, chunks=4, batch=big, num_batches=1, timeline=False).feasible
    assert max_feasible_seq_len("llama3.1-8b", "mocap-2x2", chunks=4, batch=big) == 0
    assert max_feasible_seq_len("llama3.1-8b", "mocap-2x2", chunks=4, batch=big, granularity=3) == 0
    assert max_feasible_seq_len("llama3.1-8b", "mocap-2x2", "gpipe", batch=big, microbatch=big) == 0


def test_the_honesty_check_names_the_point():
    out = {"feasible": np.array([True, True]), "prefill_latency_s": np.array([1.0, -3.0], np.float32)}
    with pytest.raises(DishonestResult, match="point 1"):
        check_honest(out)
    with pytest.raises(DishonestResult, match="point 16385 "):        # a later block names the call's index
        check_honest(out, first=16384)
    check_honest({"feasible": np.array([False]), "prefill_latency_s": np.array([np.inf])})


def test_top_level_exports():
    assert mj.pipeline_latency(np.full((4, 3), 1.0)) == pytest.approx(6.0)
    # times given as numbers are checked: a NaN or a negative duration would spread into every later finish
    t = np.full((4, 3), 1.0)
    for name, kwargs, fragment in (("t", {}, r"t\[2, 1\] is nan"), ("t", {}, r"t\[2, 1\] is -1"),
                                   ("handoff", {"handoff": np.where(np.eye(4, 3) > 0, np.inf, 0.0)},
                                    r"handoff\[0, 0\] is inf"),
                                   ("ready", {"ready": np.array([0.0, np.nan, 0.0, 0.0])}, r"ready\[1\] is nan")):
        bad = t.copy()
        if not kwargs:
            bad[2, 1] = np.nan if "nan" in fragment else -1.0
        with pytest.raises(ValueError, match=fragment):
            mj.finish_times(bad, **kwargs)
    early = mj.finish_times(t, ready=np.array([-1.0, 0.0, 0.0, 0.0]), stage_free=np.full(3, -2.0))
    assert early[0, 0] == pytest.approx(0.0)     # times before 0 are fine: the origin is the caller's
    assert mj.uniform_partition(10, 4).tolist() == [3, 3, 2, 2]
    for args, fragment in (((100, 0), "chunks must be a positive integer"), ((3, 5), "seq_len must be an integer >= 5"),
                           ((10.5, 2), "seq_len must be an integer, got 10.5")):
        with pytest.raises(ValueError, match=fragment):   # never zero-token chunks or a silently dropped token
            mj.uniform_partition(*args)
    assert resolve("llama3.1-8b", "mocap-2x2", 4096).stages == 4


def test_the_recurrence_given_numbers_runs_as_one_program(programs_compiled):
    """``mj.finish_times`` called with numbers compiles the recurrence as one program (kept per shape),
    not each step of the wavefront on its own, and a second call compiles nothing."""
    t = np.random.default_rng(0).uniform(0.1, 1.0, (3, 11, 7))
    with programs_compiled() as compiled:
        first = mj.finish_times(t)
    assert len(compiled) == 1
    with programs_compiled() as compiled:
        again = mj.finish_times(2 * t)
    assert not compiled
    np.testing.assert_allclose(again, 2 * np.asarray(first), rtol=1e-6)


@pytest.mark.slow
def test_a_hundred_thousand_random_valid_points_are_honest():
    """>= 100,000 random valid points through simulate_batch: no NaN, no feasible point with a non-finite
    latency, float32 within 1e-5 of float64 (relative)."""
    rng = np.random.default_rng(2026)
    total = 0
    for model, hw in (("llama3.1-8b", "mocap-2x4"), ("llama3-70b", "mocap-4x4"), ("qwen3-30b-a3b", "mocap-2x2")):
        for scheme in ("terapipe", "mbkr", "gpipe"):
            P = 12_000
            seq = rng.integers(16, 2 ** 22, P)
            batch = rng.integers(1, 64, P)
            kw = dict(batch=batch, num_batches=2, chunks=16, block_size=4096,
                      fields=("feasible", "prefill_latency_s", "raw_latency_s", "peak_mem_bytes_per_stage"))
            a = simulate_batch(model, hw, seq, scheme, **kw)
            b = simulate_batch(model, hw, seq, scheme, dtype="float64", **kw)
            for out in (a, b):
                assert not np.isnan(out["raw_latency_s"]).any()
                assert np.all(np.isfinite(out["prefill_latency_s"][out["feasible"]]))
            both = a["feasible"] & b["feasible"]
            np.testing.assert_allclose(a["raw_latency_s"][both], b["raw_latency_s"][both], rtol=1e-5)
            total += P
    assert total >= 100_000


def test_every_name_a_module_exports_exists():
    """``__all__`` of every module of the package names only what the module defines or imports."""
    import importlib
    import pkgutil

    import mocap_jax

    missing = []
    for info in pkgutil.walk_packages(mocap_jax.__path__, "mocap_jax."):
        if info.name.endswith("__main__"):     # runs the command line
            continue
        module = importlib.import_module(info.name)
        missing += [f"{info.name}.{n}" for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert not missing, missing


def test_a_placements_routes_are_shared_read_only_and_keyed_by_its_dies():
    """The routes of a placement are cached: asking again returns the same arrays, which nobody can
    change in place, and a caller's later edit of its placement array does not reach the cache."""
    from mocap_jax.prefill.points import MBKRSettings, stage_layout, stage_routes
    from mocap_jax.specs import get_hardware

    hw = get_hardware("mocap-4x4")
    placement = np.arange(8)
    layout, mbkr = stage_routes(hw, placement, 8, MBKRSettings(), np.float32)
    again, _ = stage_routes(hw, placement.copy(), 8, MBKRSettings(), np.float32)
    assert again is layout
    with pytest.raises(ValueError, match="read-only"):
        mbkr.stage_hops[0, 0] = 5
    placement[:] = [0, 5, 10, 15, 14, 9, 4, 3]                          # diagonal steps: two hops each
    reversed_layout, _ = stage_routes(hw, placement, 8, MBKRSettings(), np.float32)
    assert reversed_layout is not layout
    fresh = stage_layout(hw, placement, 8, np.float32)                  # built anew, not cached
    for got, want in zip(jax.tree_util.tree_leaves(reversed_layout), jax.tree_util.tree_leaves(fresh)):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(reversed_layout.handoff_hops, layout.handoff_hops)
