"""Batched serving simulation: conservation, determinism, infeasible points, bad input, ``wsc-llm serve``."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.cli import main
from mocap_jax.specs import SpecError
from mocap_jax.wsc import memory as mem
from mocap_jax.wsc import reference as ref
from mocap_jax.wsc.metrics import agreement, check_clock
from mocap_jax.wsc import serving as sv
from mocap_jax.wsc import serving_inputs as si
from mocap_jax.wsc import setup as su
from mocap_jax.wsc.synthetic import synthetic_trace
from mocap_jax.wsc.workload import WORKLOAD_PRESETS

CONFIG = su.ServingConfig(max_batch=32)
WL = WORKLOAD_PRESETS["azure-conv"]


@pytest.fixture(scope="module")
def setup():
    s = su.build_setup("llama2-7b", "wsc-4x4", WL, "wsc", config=CONFIG)
    assert s.feasible and s.memory_policy == "greedy" and s.placement == "decode-centred"
    return s


def _run(setup, seed, n=60, load=1.0, dtype=jnp.float32):
    tr = synthetic_trace("azure-conv", n, load * setup.served_rps, seed=seed)
    return sv.simulate([(setup, tr)], dtype=dtype, keep_raw=True).results[0]


def test_conservation_every_request_once_and_tokens_add_up(setup):
    res = _run(setup, seed=1)
    tr, rm, raw, m = res.trace, res.requests, res.raw, res.metrics
    n = len(tr)
    assert m["complete"] and m["finished"] == n and m["dropped"] == 0
    assert np.all(np.isfinite(raw["finish_t"])) and np.all(np.isfinite(raw["ttft_t"]))
    # each request was dispatched to one prefill and one decode instance, in range
    assert raw["pinst"].min() >= 0 and raw["pinst"].max() < setup.n_prefill
    assert raw["dinst"].min() >= 0 and raw["dinst"].max() < setup.n_decode
    # causality: arrival <= first token <= KV ready (placement + transfer) <= last token
    assert np.all(raw["ttft_t"] >= tr.arrival_s)
    assert np.all(raw["ready_t"] >= raw["ttft_t"]) and np.all(raw["finish_t"] > raw["ready_t"])
    # every output token is produced: decode time >= (O - 1) iterations of at least the unloaded TPOT
    assert np.all(rm.tpot > 0) and np.all(rm.e2e >= rm.ttft)
    assert m["tokens_per_s"] * m["makespan_s"] == pytest.approx(tr.output_tokens.sum(), rel=1e-9)
    assert m["throughput_rps"] * m["makespan_s"] == pytest.approx(n, rel=1e-9)
    assert m["makespan_s"] == pytest.approx(raw["finish_t"].max() - tr.arrival_s[0], rel=1e-9)
    # KV is all freed at the end: mean utilisation lies between the resident share and the peak
    resident = setup.resident.sum() / setup.capacity.sum()
    assert resident <= m["dram_util_mean"] <= m["dram_util_peak"] <= 1.0
    assert 0.0 <= m["slo_attainment"] <= 1.0 and m["goodput_rps"] == pytest.approx(m["slo_attainment"] * tr.rate)
    # shortest-queue dispatch spreads the requests over the prefill instances
    assert len(set(raw["pinst"].tolist())) == setup.n_prefill


def test_float32_program_with_contention_agrees_with_the_float64_reference(setup):
    """The default program (float32, max-min contention) against the event-driven reference (float64)."""
    res = _run(setup, seed=2, n=30)
    ag = agreement(res, ref.reference_result(setup, res.trace)[0])
    assert ag["same_finished"]
    assert ag["e2e_mean_rel_err"] < 1e-4 and ag["ttft_mean_rel_err"] < 1e-3 and ag["aggregate_max_rel_err"] < 1e-3


def test_a_short_run_compiled_with_the_loop_emitters_gives_the_fusion_emitters_results(setup, monkeypatch):
    """A short run compiles with XLA:CPU's loop emitters (its compile time is most of the run); the same run
    compiled with the fusion emitters of long runs makes every decision the same at the same times."""
    assert sv.compile_options(60)["xla_cpu_use_fusion_emitters"] is False
    assert "xla_cpu_use_fusion_emitters" not in sv.compile_options(sv.LOOP_EMITTERS_BELOW_REQUESTS)
    loop = _run(setup, seed=3)
    monkeypatch.setattr(sv, "LOOP_EMITTERS_BELOW_REQUESTS", 0)
    fused = _run(setup, seed=3)
    for k in ("pinst", "dinst", "dropped"):
        assert np.array_equal(loop.raw[k], fused.raw[k]), k
    for k in ("ttft_t", "finish_t", "ready_t"):
        np.testing.assert_allclose(loop.raw[k], fused.raw[k], rtol=1e-6, atol=0, err_msg=k)
    assert loop.metrics["events"] == fused.metrics["events"] and loop.metrics["leaped"] == fused.metrics["leaped"]


def test_determinism_under_a_seed(setup):
    a, b, c = _run(setup, seed=7), _run(setup, seed=7), _run(setup, seed=8)
    for k in ("ttft_t", "finish_t", "ready_t", "pinst", "dinst"):
        assert np.array_equal(a.raw[k], b.raw[k])
    assert not np.array_equal(a.raw["finish_t"], c.raw["finish_t"])


def test_lanes_split_over_the_devices_give_the_one_device_results(setup):
    """Each device runs its share of the lanes on its own; finished lanes take waiting points.  Ten
    points in eight lanes (so two refills), at different loads, so the lanes' placement loops
    run for different numbers of iterations on different devices.  The program compiled for a
    device's share may vectorise its arithmetic differently from the one-device program, so times
    agree to float32 rounding; every decision (instances, drops) is the same."""
    assert len(jax.local_devices()) >= 2
    points = [(setup, synthetic_trace("azure-conv", 24, (0.5 + 0.3 * k) * setup.served_rps, seed=k)) for k in range(10)]
    split = sv.simulate(points, batch_size=8, keep_raw=True)
    alone = sv.simulate(points, batch_size=8, keep_raw=True, shard=False)
    for a, b in zip(split.results, alone.results):
        assert a.metrics["complete"] and b.metrics["complete"]
        for k in ("pinst", "dinst", "dropped"):
            assert np.array_equal(a.raw[k], b.raw[k]), k
        for k in ("ttft_t", "finish_t", "ready_t"):
            np.testing.assert_allclose(a.raw[k], b.raw[k], rtol=1e-6, atol=0, err_msg=k)


def test_a_point_in_a_lane_that_restarts_runs_as_in_a_fresh_batch(setup):
    """Six points through two lanes on one device: four of them start in a lane that has just run
    another point (its state reset inside the scan's program, its inputs rewritten on the host).
    Each gives the same decisions and times as when it runs alone in the same program (its own
    point in both lanes), so nothing of the lane's previous point is left over."""
    points = [(setup, synthetic_trace("azure-conv", 24, (0.6 + 0.25 * k) * setup.served_rps, seed=30 + k))
              for k in range(6)]
    pooled = sv.simulate(points, batch_size=2, keep_raw=True, shard=False)
    for point, got in zip(points, pooled.results):
        alone = sv.simulate([point, point], batch_size=2, keep_raw=True, shard=False).results[0]
        assert got.metrics["complete"] and alone.metrics["complete"]
        for k in sv.RAW_FIELDS:
            assert np.array_equal(got.raw[k], alone.raw[k]), k
        assert got.metrics["events"] == alone.metrics["events"]


def test_more_load_more_queueing(setup):
    lo, hi = _run(setup, seed=3, load=0.3), _run(setup, seed=3, load=3.0)
    assert hi.metrics["ttft_mean_s"] > lo.metrics["ttft_mean_s"]
    assert hi.metrics["e2e_mean_s"] > lo.metrics["e2e_mean_s"]


def test_infeasible_design_point_is_a_result_not_a_crash(setup):
    bad = su.build_setup("llama3.1-405b", "wsc-2x2", WL, "wsc", config=CONFIG)
    tr = synthetic_trace("conv", 10, 1.0)
    rep = sv.simulate([(bad, tr)])
    m = rep.results[0].metrics
    assert not bad.feasible and rep.groups == 0
    assert m["e2e_mean_s"] == math.inf and m["goodput_rps"] == 0.0 and m["finished"] == 0
    assert rep.results[0].row()["feasible"] is False
    # never NaN: no request finishes, so the makespan is infinite; DRAM use is undefined (null)
    assert m["makespan_s"] == math.inf and m["dram_util_mean"] is None and m["dram_util_peak"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in rep.results[0].row().values())


def test_bad_input_is_a_clear_value_error(setup):
    with pytest.raises(SpecError, match="chunk_tokens must be a positive integer"):
        su.ServingConfig(chunk_tokens=0)
    with pytest.raises(SpecError, match="tpot_slo_s must be > 0"):
        su.ServingConfig(tpot_slo_s=-1.0)
    with pytest.raises(SpecError, match="unknown scheduler 'fifo'"):
        su.build_setup("llama2-7b", "wsc-4x4", WL, "fifo")
    with pytest.raises(SpecError, match="unknown memory policy"):
        su.build_setup("llama2-7b", "wsc-4x4", WL, "wsc", "remote")
    with pytest.raises(SpecError, match="needs a mesh wafer"):
        su.build_setup("llama2-7b", "a100-cluster", WL, "wsc", placement="random")
    with pytest.raises(ValueError, match="unknown model"):
        su.build_setup("llama-9", "wsc-4x4", WL)
    shape = si.shape_for([setup], 64, CONFIG)
    with pytest.raises(SpecError, match="holds 64"):
        si.pack_inputs(setup, synthetic_trace("conv", 65), shape)
    for dtype in ("float16", jnp.bfloat16, "int32"):   # times in hours of milliseconds: never half precision
        with pytest.raises(SpecError, match="dtype must be 'float32' or 'float64'"):
            sv.simulate([(setup, synthetic_trace("conv", 8))], dtype=dtype)


def test_a_clock_too_coarse_for_the_latencies_is_refused(setup):
    """At a rate so low that float32 cannot resolve a decode iteration at the last event, the run is refused
    (it reported zero or negative latencies); float64 resolves it; at a low but ordinary rate float32 is kept.
    Rates whose arrivals no float can hold are refused where the trace is made."""
    ok32, ok64 = _run(setup, seed=4, n=30, load=0.01), _run(setup, seed=4, n=30, load=0.01, dtype=jnp.float64)
    for k in ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s"):
        assert ok32.metrics[k] == pytest.approx(ok64.metrics[k], rel=1e-3)
    with pytest.raises(SpecError, match=r"float32 resolves time only to .* too coarse to measure its latencies "
                                        r"\(its median time per output token comes out as 0 ms\)"):
        _run(setup, seed=4, n=30, load=1e-7)
    fine = _run(setup, seed=4, n=30, load=1e-7, dtype=jnp.float64)
    for k in ("ttft_p50_s", "tpot_p50_s"):
        assert fine.metrics[k] == pytest.approx(ok64.metrics[k], rel=0.05)
    with pytest.raises(SpecError, match="rate = 1e-300 is below the smallest accepted value, 1e-12"):
        synthetic_trace("conv", 30, 1e-300)


def test_the_clock_refusal_quotes_a_latency_the_coarse_clock_made_negative_as_such():
    trace = synthetic_trace("conv", 2, 1.0)
    late = 2.1e7 - float(trace.arrival_s[0])          # float32's spacing there is 2 s
    metrics = {"tpot_p50_s": math.nan, "ttft_p50_s": -0.0121, "makespan_s": late}
    with pytest.raises(SpecError, match=r"too coarse to measure its latencies \(its median time to first token "
                                        r"comes out as -12.1 ms\)"):
        check_clock(trace, metrics, np.float32, "point")
    metrics["ttft_p50_s"] = 0.5
    with pytest.raises(SpecError, match="too coarse for its median time to first token of 500 ms, which the clock"):
        check_clock(trace, metrics, np.float32, "point")
    check_clock(trace, metrics, np.float64, "point")


def test_serve_cli_json_and_table(capsys):
    args = ["wsc-llm", "serve", "--model", "llama2-7b", "--hardware", "wsc-4x4", "--requests", "60",
            "--max-batch", "32", "--load", "1.0"]
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["metrics"]["finished"] == 60 and d["setup"]["scheduler"] == "wsc" and d["trace"]["requests"] == 60
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "TTFT mean s" in out and "goodput req/s" in out and "finished 60 / 60" in out


@pytest.mark.parametrize("args,fragment", [
    (["--rate", "-3"], "--rate must be > 0"),
    (["--load", "0"], "--load must be a positive number"),
    (["--rate", "2", "--load", "1"], "give --rate or --load, not both"),
    (["--workload", "chat"], "unknown workload"),
    (["--requests", "1"], "--requests must be an integer >= 2"),
    (["--model", "llama3.1-405b", "--hardware", "wsc-2x2"], "cannot be served on wsc-2x2"),
    (["--tpot-slo-ms", "-5"], "--tpot-slo-ms must be > 0"),
    (["--ttft-slo-s", "inf"], "--ttft-slo-s must be a finite number"),
    (["--rate", "1e-300", "--requests", "8"], "--rate = 1e-300 is below the smallest accepted value, 1e-12"),
    (["--rate", "1e-6", "--requests", "8"], "float32 resolves time only to"),
])
def test_serve_cli_bad_input_exit_2(args, fragment, capsys):
    code = main(["wsc-llm", "serve", "--hardware", "wsc-4x4", *args])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err and err.count("\n") == 1


def test_sort_free_greedy_rule_equals_the_memory_scheduler():
    """The array program's placement rule is the memory scheduler's greedy_allocate (priority, most free, index).

    Dies beyond ``d`` are padding the rule must leave alone (not allowed), as in the program, whose
    wafers have up to 54 dies.
    """
    rule = jax.jit(mem.greedy_allocate_pairwise)
    rng = np.random.default_rng(0)
    D = 54
    for _ in range(200):
        d = int(rng.integers(1, D + 1))
        free = rng.choice([0.0, 1e9, 2e9, 3.5e9], size=d) + rng.integers(0, 2, d) * rng.random(d) * 1e9
        prio = rng.integers(0, 4, d).astype(np.int32)
        need = float(rng.random() * free.sum() * 1.2)
        want, ok = mem.greedy_allocate(free, need, prio, np)
        got, ok2 = rule(jnp.asarray(np.pad(free, (0, D - d))), need,
                        jnp.asarray(np.pad(prio, (0, D - d), constant_values=mem.NOT_ALLOWED)))
        assert bool(ok2) == bool(ok)
        assert np.allclose(np.asarray(got)[:d], want, rtol=1e-12, atol=1e-3) and not np.any(np.asarray(got)[d:])


def test_packed_decode_boundaries_give_the_plain_steps_results(setup):
    """Three lanes scanned 800 steps computing at most three or five of their due decode
    boundaries per step (the rest waiting for the next step) finish the same requests at the same
    times as the plain vmapped step computing every lane's: every decision, count and time equal."""
    from mocap_jax.wsc import serving_step as ss
    from mocap_jax.wsc.serving_decode import decode_boundary, idle_value

    points = [(setup, synthetic_trace("azure-conv", 24, (1.0 + 0.5 * k) * setup.served_rps, seed=40 + k))
              for k in range(3)]
    shape = si.shape_for([p[0] for p in points], 24, CONFIG)
    inputs = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[si.pack_inputs(s, tr, shape) for s, tr in points])
    zeros = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), ss.state_shapes(inputs, shape))
    restart = np.ones(3, bool)
    R = min(shape.decode_parallel, shape.decode)
    options = sv.compile_options(3 * 24)      # a short run's options, as the product compiles it
    run = lambda capacity: jax.jit(lambda i, s, r: ss.scan_batch(i, s, r, shape, 800, capacity),
                                   compiler_options=options)(inputs, zeros, restart)
    plain, plain_done = run(3 * R)
    assert np.all(plain_done)
    rs = plain.requests
    for capacity in (1, 5):                     # 1: as many as lanes, each lane's earliest
        packed, done = run(capacity)
        assert np.all(done)
        for name in ("first_token_t", "finish_t", "ready_t", "placed_t", "allocation"):
            np.testing.assert_allclose(getattr(packed.requests, name), getattr(rs, name), rtol=1e-6, atol=0,
                                       err_msg=f"{capacity} {name}")
        for name in ("prefill_instance", "decode_instance", "dropped"):
            assert np.array_equal(getattr(packed.requests, name), getattr(rs, name)), (capacity, name)
        assert np.array_equal(packed.totals.leaped, plain.totals.leaped)
        np.testing.assert_allclose(packed.totals.kv_area, plain.totals.kv_area, rtol=1e-6)
    # a boundary that is not due gives what the packed step puts in the place of one not computed
    one = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], (inputs, plain))
    busy = int(np.argmax(np.asarray(plain.decode.load[0]) > 0)) if np.any(plain.decode.load[0] > 0) else 0
    out = jax.jit(decode_boundary, static_argnums=5)(*one, jnp.int32(busy), one[0].requests.arrival[-1], False, shape)
    for name in ("instance", "finished", "freed", "kv_area", "any_finish", "leaped"):
        assert np.all(np.asarray(getattr(out, name)) == idle_value(name, shape)), name
