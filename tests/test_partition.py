"""LBCP: the proxy DP against brute force, DP + annealing (each candidate at its own B') against brute
force of the full objective, the annealer's determinism and device-split invariance, and bad input."""

import dataclasses
import itertools
import math

import jax
import numpy as np
import pytest

import mocap_jax as mj
from mocap_jax.api import resolve
from mocap_jax.api.search import largest_feasible_batch
from mocap_jax.costs import HardwareParams, ModelParams, StageLayout
from mocap_jax.partition.dp import check_granularity, chunk_cost_matrix_jit, proxy_dp, proxy_objective, terapipe_dp
from mocap_jax.partition.objectives import PartitionContext, PartitionProblem
from mocap_jax.partition.plan import PlanSettings, plan_partition
from mocap_jax.search import anneal as anneal_module
from mocap_jax.search.anneal import anneal, evaluate_states
from mocap_jax.specs import SpecError, get_hardware, get_model

MODELS = ("llama3.1-8b", "llama3-70b", "qwen3-30b-a3b", "mixtral-8x22b")
MESHES = ("mocap-2x2", "mocap-2x4")


def compositions(U, M):
    """Every partition of U units into M positive parts, ``[C(U-1, M-1), M]``."""
    return np.array([np.diff((0,) + cuts + (U,)) for cuts in itertools.combinations(range(1, U), M - 1)])


def cost_matrix(model, hw, U, g, B, dtype=np.float64):
    m, h = get_model(model), get_hardware(hw)
    n = h.num_dies
    layout = StageLayout.snake(h, n, n, dtype)
    C = chunk_cost_matrix_jit(ModelParams.from_spec(m, dtype), HardwareParams.from_spec(h, dtype), layout, U, g, B, n)
    return np.asarray(C), n


@pytest.mark.parametrize("seed", range(8))
def test_proxy_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    U, M, g = int(rng.choice([10, 12])), int(rng.integers(2, 5)), int(rng.choice([128, 512, 2048]))
    C, n = cost_matrix(MODELS[seed % 4], MESHES[seed % 2], U, g, int(rng.integers(1, 8)))
    dp = proxy_dp(C, M, n, g, batch_caps=8)
    brute = proxy_objective(C, compositions(U, M), n)
    assert dp.objective == pytest.approx(brute.min(), rel=1e-12)
    assert proxy_objective(C, dp.partition // g, n) == pytest.approx(brute.min(), rel=1e-12)
    assert dp.partition.sum() == U * g and np.all(dp.partition % g == 0)


def test_terapipe_dp_is_optimal_over_any_chunk_count():
    C, n = cost_matrix("llama3-70b", "mocap-2x2", 10, 1024, 2)
    tp = terapipe_dp(C, n, 1024)
    best = min(proxy_objective(C, compositions(10, M), n).min() for M in range(1, 11))
    assert tp.objective == pytest.approx(best, rel=1e-12)


def test_dp_chunks_shrink_as_the_prefix_grows():
    C, n = cost_matrix("llama3-70b", "mocap-4x4", 256, 256, 8, np.float32)
    part = proxy_dp(C, 16, n, 256).partition
    assert part[0] > part[-1]      # larger chunks early, smaller ones late


def _instance(i, rng):
    model, hw = MODELS[i % 4], MESHES[(i // 4) % 2]
    g = int(rng.choice([1024, 4096, 16384]))
    U = int(rng.integers(6, 13))
    scheme = "mbkr" if i % 2 else "terapipe"
    cfg = resolve(model, hw, U * g, scheme, chunks=3, batch=1, num_batches=1, placement="snake",
                  p2=float(rng.choice([0.6, 0.85, 1.0])))
    max_batch = 16
    hint = max(largest_feasible_batch(cfg, max_batch), 1)
    problem = PartitionProblem(shape=cfg.shape(3), objective="prefill", batch_search=True, max_batch=max_batch)
    ctx = PartitionContext(point=cfg.with_batch(hint).point(3), granularity=np.int32(g), batch=np.int32(hint),
                           arrivals=np.zeros(1, cfg.dtype))
    return cfg, problem, ctx, U, g


def _optimality(instances: int, seed: int):
    rng = np.random.default_rng(seed)
    hits, misses = 0, []
    for i in range(instances):
        cfg, problem, ctx, U, g = _instance(i, rng)
        allp = compositions(U, 3)
        rows = np.concatenate([allp, np.repeat(allp[:1], 64 - len(allp), 0)])          # one shape for every U
        # scored 16 at a time: the annealer's 16 chains below then reuse the same compiled program
        values, batches = (np.concatenate(v) for v in zip(*(evaluate_states(problem, rows[k:k + 16], ctx)
                                                             for k in range(0, 64, 16))))
        best = values.min()
        C, n = cost_matrix(cfg.model, cfg.hardware, U, g, int(ctx.batch), np.float32)
        dp_units = proxy_dp(C, 3, n, g, batch_caps=8).partition // g
        res = anneal(problem, ctx, np.broadcast_to(dp_units, (16, 3)), i, steps=120, t_start=0.05)
        found = min(res.objective, float(evaluate_states(problem, np.broadcast_to(dp_units, (16, 3)), ctx)[0][0]))
        if (not np.isfinite(best) and not np.isfinite(found)) or found <= best * (1 + 1e-6):
            hits += 1
        else:
            misses.append((i, found, best, int(batches[np.argmin(values)])))
    return hits, misses


def test_dp_plus_annealing_finds_the_brute_force_optimum_with_own_batches():
    """Each candidate is scored at its own largest batch B' (a partition that admits a larger batch can
    win); DP + annealing finds the brute-force optimum. The first two of the slow test's 200 seeded
    instances cover both schemes (the slow test covers every model)."""
    hits, misses = _optimality(2, 2026)
    assert hits == 2, misses


@pytest.mark.slow
def test_dp_plus_annealing_finds_the_brute_force_optimum_in_200_instances():
    hits, misses = _optimality(200, 2026)
    print(f"\nDP + annealing found the brute-force optimum in {hits}/200 instances")
    assert hits >= 198, misses


def test_own_batch_search_is_exact():
    rng = np.random.default_rng(5)
    cfg, problem, ctx, U, g = _instance(1, rng)
    allp = compositions(U, 3)[:16]
    _, batches = evaluate_states(problem, allp, ctx)
    from mocap_jax.api.search import feasible_batches

    expect = []
    for part in allp:
        one = cfg.__class__(**{**cfg.__dict__, "partition": part * g})
        ok = feasible_batches(one, np.arange(1, 17), 4)
        expect.append(int(np.max(np.nonzero(ok)[0])) + 1 if ok.any() else 0)
    np.testing.assert_array_equal(batches, expect)
    # the search is exact from any starting hint (far below, far above, and scattered around B') with
    # any number of batches per open partition after the first pass
    hints = (np.ones(16), np.full(16, 16), rng.integers(0, 20, 16), np.asarray(expect) + rng.integers(-2, 3, 16))
    for window in (problem.window, 2):
        windowed = dataclasses.replace(problem, window=window)
        search = jax.jit(lambda xs, hint: windowed.batches(xs, ctx, hint)[0])
        for hint in hints:
            np.testing.assert_array_equal(search(allp, hint.astype(np.int32)), expect, err_msg=f"window {window}")


def test_a_short_search_compiled_with_the_loop_emitters_takes_the_fusion_emitters_path(monkeypatch):
    """A search of few chain steps compiles with XLA:CPU's loop emitters, a long one with its fusion
    emitters: the same objective values (to float32 rounding), the same B' and the same moves.  (The
    instance and chains are the next test's, whose short search compiles the same program; MBKR blocks
    compiled each way, spill passes included, are compared in
    test_simulate.py::test_blocks_sharded_over_the_devices_equal_one_device.)"""
    rng = np.random.default_rng(9)
    cfg, problem, ctx, U, g = _instance(0, rng)
    x0 = np.broadcast_to(compositions(U, 3)[0], (16, 3))
    states = compositions(U, 3)[:16]
    assert anneal_module.compile_bound(16 * 40)
    short = anneal(problem, ctx, x0, 3, steps=40, devices=1)
    short_values, short_batches = evaluate_states(problem, states, ctx, devices=1, steps=40)
    monkeypatch.setattr(anneal_module, "LOOP_EMITTERS_BELOW_CHAIN_STEPS", 0)
    assert not anneal_module.compile_bound(16 * 40)
    long = anneal(problem, ctx, x0, 3, steps=40, devices=1)
    long_values, long_batches = evaluate_states(problem, states, ctx, devices=1, steps=40)
    np.testing.assert_array_equal(short_batches, long_batches)
    np.testing.assert_allclose(short_values, long_values, rtol=1e-6)
    np.testing.assert_array_equal(short.chain_states, long.chain_states)
    assert short.accept_rate == long.accept_rate
    np.testing.assert_allclose(short.chain_best, long.chain_best, rtol=1e-6)


def test_annealing_is_deterministic_and_independent_of_the_device_split(monkeypatch):
    rng = np.random.default_rng(9)
    cfg, problem, ctx, U, g = _instance(0, rng)
    x0 = np.broadcast_to(compositions(U, 3)[0], (16, 3))
    a = anneal(problem, ctx, x0, 3, steps=40, devices=1)
    b = anneal(problem, ctx, x0, 3, steps=40, devices=2)
    c = anneal(problem, ctx, x0, 3, steps=40, devices=8)
    np.testing.assert_array_equal(a.chain_best, b.chain_best)
    np.testing.assert_array_equal(a.chain_best, c.chain_best)
    assert a.accept_rate == b.accept_rate == c.accept_rate
    # progress is reported as the steps start and complete, ends at every step, and changes nothing
    reports = []
    d = anneal(problem, ctx, x0, 3, steps=40, devices=1, progress=lambda done, total: reports.append((done, total)))
    np.testing.assert_array_equal(a.chain_best, d.chain_best)
    assert reports == [(0, 40), (8, 40), (16, 40), (24, 40), (32, 40), (40, 40)]
    # the first report comes before the first evaluation, which compiles: a bar shows while it does
    events = []
    first_step = anneal_module._first_step
    monkeypatch.setattr(anneal_module, "_first_step", lambda *a: (events.append("first evaluation"), first_step(*a))[1])
    anneal(problem, ctx, x0, 3, steps=8, devices=1, progress=lambda done, total: events.append((done, total)))
    assert events == [(0, 8), "first evaluation", (8, 8)]


def test_plan_is_never_worse_than_its_starts_and_searches_the_chunk_count():
    s = PlanSettings(chunks=None, chunk_counts=(2, 4), granularity=4096, chains=16, steps=30, seed=3)
    reports = []
    r = plan_partition("llama3.1-8b", "mocap-2x2", 65536, "mocap", settings=s,
                       progress=lambda done, total: reports.append((done, total)))
    # one count over both chunk counts' annealing, in order
    assert reports == [(0, 60), (8, 60), (16, 60), (24, 60), (30, 60), (30, 60), (38, 60), (46, 60), (54, 60), (60, 60)]
    assert r["chose"]["chunks"] and {p["chunks"] for p in r["per_chunks"]} == {2, 4}
    for p in r["per_chunks"]:
        assert p["objective_s"] <= min(p["uniform"]["objective_s"], p["dp"]["objective_s"]) * (1 + 1e-6)
    assert r["objective_s"] == min(p["objective_s"] for p in r["per_chunks"])


@pytest.mark.parametrize("kw,fragment", [
    (dict(seq_len=4096, settings=PlanSettings(chunks=32, granularity=256)), "need S >= 8192"),
    (dict(seq_len=5000, settings=PlanSettings(chunks=4, granularity=256)), "does not divide"),
    (dict(seq_len=8192, settings=PlanSettings(chunks=4, granularity=256, objective="e2e")), "load"),
    (dict(seq_len=8192, load=2.0, settings=PlanSettings(chunks=4, granularity=256)), "the prefill objective does not"),
    (dict(seq_len=8192, batch=0, settings=PlanSettings(chunks=4, granularity=256)), "batch"),
])
def test_plan_bad_input(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        plan_partition("llama3.1-8b", "mocap-2x2", scheme="lbcp", **kw)


def test_the_e2e_objective_refuses_a_clock_too_coarse_for_it():
    """At 1e-6 requests/s the last of 8 arrivals lies near 5e6 s, where float32 resolves 0.5 s against
    latencies of about 10 ms: the search would compare noise, so the plan is refused with the fix, before
    the search runs (its starting partitions already show it).  In float64 the same search has an answer:
    requests about 1e6 s apart never queue, so their mean end-to-end latency is one request's prefill latency
    (float64 resolves about 1e-9 s at 5e6 s, 1e-7 of it)."""
    s = PlanSettings(chunks=4, granularity=256, chains=2, steps=2, objective="e2e")
    kw = dict(scheme="lbcp", settings=s, load=1e-6, requests=8)
    steps = []
    with pytest.raises(SpecError, match=r"e2e objective .*float32 resolves time only to.*--dtype float64"):
        plan_partition("llama3.1-8b", "mocap-2x2", 4096, progress=lambda done, total: steps.append(done), **kw)
    assert steps == []
    r = plan_partition("llama3.1-8b", "mocap-2x2", 4096, dtype="float64", **kw)
    alone = mj.simulate("llama3.1-8b", "mocap-2x2", 4096, "terapipe", batch=1, partition=r["partition"],
                        dtype="float64", timeline=False)
    assert math.isclose(r["objective_s"], alone.prefill_latency_s, rel_tol=1e-6)


def test_granularity_checks():
    assert check_granularity(8192, 4, 256) == 32
    with pytest.raises(SpecError, match="granularity"):
        check_granularity(8192, 4, 0)
    with pytest.raises(SpecError):
        PlanSettings(objective="fastest")
