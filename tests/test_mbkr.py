"""MBKR: the spill rule against a plain-Python event oracle, 'MBKR never hurts', the idealised gain
formula, eager against overflow spilling, and the placement search."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mocap_jax.api import simulate, simulate_batch
from mocap_jax.mbkr.costs import creditor_blocking
from mocap_jax.mbkr.pairing import partner_of
from mocap_jax.mbkr.placement import (anneal_placement, evaluate_placement, exhaustive_placement, search_placement,
                                      snake_report)
from mocap_jax.mbkr.spills import (FIT_TOLERANCE, RANK_RESOLUTION, SCALAR_SLOTS, Stages, decide, dynamic_spills,
                                   pair_spills)
from mocap_jax.schedule.shape import Spill
from mocap_jax.specs import ModelSpec, get_hardware, mocap_wafer


# --------------------------------------------------------------------------- the rule


def test_the_rule_moves_only_what_cannot_stay_local():
    f = lambda *a, spill=Spill.OVERFLOW: tuple(float(x) for x in decide(*a, spill))
    # fits: nothing moves
    assert f(50.0, 10.0, 5.0, 100.0, 0.0, 0.0, 100.0, True, 0.0, 0.85) == (0.0, 0.0)
    # 20 over the budget, an empty creditor: 20 move
    assert f(90.0, 25.0, 5.0, 100.0, 0.0, 0.0, 100.0, True, 0.0, 0.85) == (20.0, 0.0)
    # the creditor hosts only up to p2 of its budget, and beside its in-flight activations
    assert f(90.0, 25.0, 5.0, 100.0, 80.0, 0.0, 100.0, True, 0.0, 0.85) == (5.0, 1.0)
    assert f(90.0, 25.0, 5.0, 100.0, 0.0, 95.0, 100.0, True, 0.0, 0.85) == (5.0, 1.0)
    # a partner at or above p2 is a debtor, below p1 local-only: neither hosts
    assert f(90.0, 25.0, 5.0, 100.0, 85.0, 0.0, 100.0, True, 0.0, 0.85) == (0.0, 1.0)
    assert f(90.0, 25.0, 5.0, 100.0, 5.0, 0.0, 100.0, True, 0.1, 0.85) == (0.0, 1.0)
    # only the new item's KV can move
    assert f(99.0, 10.0, 20.0, 100.0, 0.0, 0.0, 100.0, True, 0.0, 1.0) == (10.0, 1.0)
    # no partner
    assert f(90.0, 25.0, 5.0, 100.0, 0.0, 0.0, 100.0, False, 0.0, 0.85) == (0.0, 1.0)
    # eager: also what lies above p2 of the debtor's own budget, though it fits
    assert f(80.0, 10.0, 0.0, 100.0, 0.0, 0.0, 100.0, True, 0.0, 0.85, spill=Spill.EAGER) == (5.0, 0.0)


def oracle_spills(st: Stages, partner, p1, p2, eager=False, dynamic=False):
    """Plain-Python event loop of the spill rule (docs/semantics.md): moved [E, N], peak [N], overflow."""
    start, finish, kv, act = (np.asarray(x, np.float64) for x in (st.start, st.finish, st.kv, st.activation))
    valid, group, release = np.asarray(st.valid), np.asarray(st.group), np.asarray(st.release, np.float64)
    W, budget, live = np.asarray(st.weights, np.float64), np.asarray(st.budget, np.float64), np.asarray(st.live)
    E, N = start.shape
    G = release.shape[0]
    events = []
    for s in range(N):
        if not live[s]:
            continue
        for g in range(G):
            events.append((release[g, s], 0, s, g))
        for k in range(E):
            events.append((finish[k, s], 1, s, k))
            events.append((start[k, s], 2, s, k))
    events.sort()
    own = np.zeros((N, G))
    spilled = np.zeros((N, G))
    host = np.array([int(q) for q in partner])
    running = np.zeros(N)
    moved = np.zeros((E, N))
    peak = W.copy()
    overflow = False

    def local():
        hosted = np.zeros(N)
        for a in range(N):
            if host[a] >= 0:
                hosted[host[a]] += spilled[a].sum()
        return own.sum(1) + hosted

    for t, kind, s, i in events:
        if kind == 0:
            own[s, i] = 0.0
            spilled[s, i] = 0.0
            continue
        if kind == 1:
            running[s] = 0.0
            continue
        x, a = kv[i, s] if valid[i] else 0.0, act[i, s]
        loc = local()
        if dynamic:
            u = np.where(live, np.round(loc / budget / RANK_RESOLUTION), np.inf)
            order = sorted(range(N), key=lambda q: (u[q], q))
            n = int(live.sum())
            pos = order.index(s)
            mate = order[n - 1 - pos] if n - 1 - pos != pos else -1
            old = host[s]
            new = mate                       # the middle stage of an odd count: no partner
            mine = spilled[s].sum()
            if mine > 0 and new != old:
                room = min(p2 * budget[new] - loc[new], budget[new] - loc[new] - running[new]) if new >= 0 else 0
                if not (new >= 0 and p1 * budget[new] <= loc[new] < p2 * budget[new] and room >= mine):
                    new = old                # spilled KV that cannot move keeps its host
            host[s] = new
            loc = local()
        y = host[s]
        need = loc[s] + x + a
        over = max(need - budget[s], 0.0)
        if eager:
            over = max(over, min(x, loc[s] + x - p2 * budget[s]))
        room = 0.0
        if y >= 0 and p1 * budget[y] <= loc[y] < p2 * budget[y]:
            room = max(min(p2 * budget[y] - loc[y], budget[y] - loc[y] - running[y]), 0.0)
        m = min(max(min(over, room), 0.0), x)
        if need - m > budget[s] * (1 + FIT_TOLERANCE):
            overflow = True
        own[s, group[i]] += x - m
        spilled[s, group[i]] += m
        moved[i, s] = m
        running[s] = a
        loc = local()
        peak = np.maximum(peak, np.where(live, W + loc + running, 0.0))
    return moved, peak, overflow


def _random_stages(rng, E, N, G, tight):
    """A random but consistent timeline (items in order on every stage) with group releases."""
    t = rng.uniform(0.1, 1.0, (E, N))
    start = np.zeros((E, N))
    finish = np.zeros((E, N))
    for k in range(E):
        for s in range(N):
            start[k, s] = max(finish[k - 1, s] if k else 0.0, finish[k, s - 1] if s else 0.0)
            finish[k, s] = start[k, s] + t[k, s]
    per_group = E // G
    group = np.repeat(np.arange(G), per_group)
    ends = np.arange(G) * per_group + per_group - 1
    release = finish[ends]
    kv = rng.uniform(1.0, 10.0, (E, N))
    act = rng.uniform(0.0, 2.0, (E, N))
    budget = np.full(N, kv.sum(0).max() * tight / G)
    return Stages(start=start, finish=finish, kv=kv, activation=act, valid=np.ones(E, bool), group=group,
                  release=release, weights=np.full(N, 3.0), budget=budget, live=np.ones(N, bool))


#: one program per group count and spill policy: the numbers are traced
_pair_spills = jax.jit(pair_spills, static_argnums=(5, 6))
_dynamic_spills = jax.jit(dynamic_spills, static_argnums=(4,))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("live", [8, 7])       # 7 live stages of 8 slots: the middle one has no partner
def test_pair_spills_match_the_event_oracle(seed, groups, live):
    if groups == 6:
        assert groups > SCALAR_SLOTS, "this case covers a pair's group ledgers kept as one array, not scalars"
    rng = np.random.default_rng(seed)
    N, G = 8, groups
    st = _random_stages(rng, 12, N, G, tight=rng.uniform(0.5, 1.1))
    alive = np.arange(N) < live
    st = st._replace(live=alive, weights=np.where(alive, st.weights, 0.0))
    p1, p2 = float(rng.choice([0.0, 0.1])), float(rng.choice([0.7, 0.85, 1.0]))
    code = int(rng.choice([1, 2]))
    partner = np.where(alive, partner_of(code, live, N, xp=np), -1)
    for spill, eager in ((Spill.OVERFLOW, False), (Spill.EAGER, True)):
        got = _pair_spills(st, jnp.asarray(partner), live, p1, p2, spill, (N + 1) // 2)
        moved, peak, overflow = oracle_spills(st, partner, p1, p2, eager=eager)
        np.testing.assert_allclose(got.moved, moved, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got.peak, peak, rtol=1e-9)
        assert bool(got.overflow) == overflow


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("live", [6, 5])       # 5 live stages of 6 slots: the sixth's events lie at infinity
def test_dynamic_spills_match_the_event_oracle(seed, live):
    rng = np.random.default_rng(100 + seed)
    N, G = 6, 2
    st = _random_stages(rng, 8, N, G, tight=rng.uniform(0.6, 1.0))
    alive = np.arange(N) < live
    st = st._replace(live=alive, weights=np.where(alive, st.weights, 0.0))
    got = _dynamic_spills(st, live, 0.0, 0.85, Spill.OVERFLOW)
    moved, peak, overflow = oracle_spills(st, np.full(N, -1), 0.0, 0.85, dynamic=True)
    np.testing.assert_allclose(got.moved, moved, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.peak, peak, rtol=1e-9)
    assert bool(got.overflow) == overflow


# --------------------------------------------------------------------------- MBKR never hurts

MODELS = ("llama3.1-8b", "qwen3-30b-a3b")


STRUCTURES = [("cross-half", "streaming", "stage"), ("head-to-tail", "synchronous", "request"),
              ("dynamic", "streaming", "request"), ("none", "synchronous", "stage")]


def _never_hurts(model, length, batch, chunks, seed, p1, p2, pairing, admission, release):
    rng = np.random.default_rng(seed)
    S = 2 ** length * 16
    parts = rng.multinomial(S - chunks, np.ones(chunks) / chunks, size=16) + 1
    parts = np.concatenate([parts, np.zeros((16, 8 - chunks), np.int64)], axis=1)
    kw = dict(batch=batch, partition=parts, admission=admission, release=release, num_batches=2, placement="snake",
              fields=("feasible", "prefill_latency_s"))
    plain = simulate_batch(model, "mocap-2x4", S, "terapipe", **kw)
    mbkr = simulate_batch(model, "mocap-2x4", S, "mbkr", pairing=pairing, p1=p1, p2=max(p1, p2), **kw)
    fits = plain["feasible"]
    assert np.all(mbkr["feasible"][fits])
    np.testing.assert_array_equal(mbkr["prefill_latency_s"][fits], plain["prefill_latency_s"][fits])


_draws = dict(model=st.sampled_from(MODELS), length=st.integers(10, 16), batch=st.integers(1, 96),
              chunks=st.integers(5, 8), seed=st.integers(0, 2 ** 16), p1=st.sampled_from([0.0, 0.2]),
              p2=st.sampled_from([0.5, 0.85, 1.0]))


@pytest.mark.parametrize("pairing,admission,release", STRUCTURES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_draws)
def test_mbkr_never_makes_a_fitting_point_infeasible(pairing, admission, release, model, length, batch, chunks,
                                                     seed, p1, p2):
    """Every point that fits without MBKR fits with it, with the same latency (random models, lengths,
    batches, chunk counts, partitions, thresholds; every pairing, both admission modes and release policies)."""
    _never_hurts(model, length, batch, chunks, seed, p1, p2, pairing, admission, release)


@pytest.mark.slow
@pytest.mark.parametrize("pairing", ["cross-half", "head-to-tail", "dynamic", "none"])
@pytest.mark.parametrize("admission", ["streaming", "synchronous"])
@pytest.mark.parametrize("release", ["stage", "request"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_draws)
def test_mbkr_never_hurts_everywhere(pairing, admission, release, model, length, batch, chunks, seed, p1, p2):
    _never_hurts(model, length, batch, chunks, seed, p1, p2, pairing, admission, release)


def test_eager_spilling_can_hurt_where_overflow_spilling_cannot():
    """Eager spilling (everything above p2) fills a partner that needs its room later; at the longest
    sequence that fits without MBKR it turns the point infeasible, while overflow spilling keeps it."""
    kw = dict(chunks=4, batch=1, num_batches=1, placement="snake", p2=0.5)
    from mocap_jax.api import max_feasible_seq_len

    S = max_feasible_seq_len("llama3-70b", "mocap-2x4", "terapipe", chunks=4, batch=1, num_batches=1,
                             granularity=4096)
    eager = simulate("llama3-70b", "mocap-2x4", S, "mbkr", spill="eager", **kw)
    overflow = simulate("llama3-70b", "mocap-2x4", S, "mbkr", spill="overflow", **kw)
    assert overflow.feasible and overflow.extra["spilled_bytes"] == 0
    assert eager.extra["spilled_bytes"] > 0
    assert not eager.feasible or eager.prefill_latency_s > overflow.prefill_latency_s



def test_mbkr_converged_says_whether_the_last_pass_kept_its_timeline():
    """``mbkr_converged`` after k passes is true exactly where pass k returned the finish times it started
    from (oracle: the evaluations with k - 1 and k passes, the first pass starting from the timeline
    without MBKR); where it holds, pass k + 1 changes nothing (a fixed point).  A configuration that
    spills nothing is converged."""
    from mocap_jax.api.config import resolve
    from mocap_jax.bench.pipeline import random_partitions
    from mocap_jax.costs.computed_once import COMPILE_BOUND_OPTIONS
    from mocap_jax.prefill.evaluate import evaluate
    from mocap_jax.prefill.points import batched_items
    from mocap_jax.schedule.items import Chunks
    from mocap_jax.schedule.shape import MBKRMode

    S, M, P = 65536, 8, 32
    parts = random_partitions(np.random.default_rng(3), P, S, M)
    batch = np.random.default_rng(4).integers(20, 130, P)       # some fit without MBKR, most do not
    cfg = resolve("llama3-70b", "mocap-4x4", S, "mbkr", batch=int(batch[0]), partition=parts[0], num_batches=2)
    points, axes = batched_items(cfg.point(M), Chunks.padded(parts, batch, M))
    finish, converged, spilled = {}, {}, None
    for passes in (0, 1, 2, 3, 4):
        shape = cfg.shape(M)._replace(passes=max(passes, 1), mbkr=cfg.shape(M).mbkr if passes else MBKRMode.OFF)
        # a call this small compiles as the product's small blocks do (prefill/batch.block_options)
        ev = jax.jit(jax.vmap(lambda p: evaluate(p, shape), in_axes=(axes,)), compiler_options=COMPILE_BOUND_OPTIONS)(points)
        finish[passes], converged[passes] = np.asarray(ev.finish), np.asarray(ev.mbkr_converged)
        if passes == 3:
            spilled = np.asarray(ev.spilled_bytes_per_stage).sum(1) > 0
    kept = {k: np.all(finish[k] == finish[k - 1], axis=(1, 2)) for k in (1, 2, 3, 4)}
    for k in (1, 2, 3):
        np.testing.assert_array_equal(converged[k], kept[k], err_msg=f"{k} passes")
        assert kept[k + 1][converged[k]].all(), f"a further pass moved a converged timeline after {k} passes"
    assert spilled.any() and (~spilled).any() and converged[3][~spilled].all()
    assert not converged[1].all() and converged[2].any()


# --------------------------------------------------------------------------- the idealised gain


def idealised_gain(M: int, N: int) -> float:
    """Longest-sequence gain cross-half pairing allows with equal chunk costs, no activations, one request,
    per-stage release and links that cost almost nothing (docs/mbkr.md): 2M / max(M, 2M - N/2 + 1)."""
    return 2 * M / max(M, 2 * M - N // 2 + 1)


def _idealised(N_rows, N_cols):
    N = N_rows * N_cols
    m = ModelSpec("ideal", layers=N, hidden=1024, ffn=4 * 2 ** 20, q_heads=1, kv_heads=1, head_dim=128, vocab=16)
    hw = mocap_wafer(N_rows, N_cols, hbm_capacity=1.2e9, weight_bytes=0.01, eff_gemm=0.01, eff_attention=1.0,
                     link_latency_s=0.0, link_bandwidth=1e20, cross_wafer_bandwidth=1e20, activation_buffer_scale=0.0,
                     gemm_fixed_s=0.0)
    return m, hw


@pytest.mark.parametrize("M,rows,cols", [pytest.param(4, 4, 4, marks=pytest.mark.slow),
                                         pytest.param(12, 4, 4, marks=pytest.mark.slow), (16, 4, 4),
                                         pytest.param(32, 4, 4, marks=pytest.mark.slow), (16, 2, 4)])
def test_cross_half_pairing_reaches_the_idealised_gain(M, rows, cols):
    from mocap_jax.api import max_feasible_seq_len

    m, hw = _idealised(rows, cols)
    kw = dict(chunks=M, batch=1, num_batches=1, granularity=M * 64, placement="snake", p1=0.0, p2=1.0,
              dtype="float64")
    plain = max_feasible_seq_len(m, hw, "terapipe", **kw)
    mbkr = max_feasible_seq_len(m, hw, "mbkr", **kw)
    assert mbkr / plain == pytest.approx(idealised_gain(M, rows * cols), rel=0.02)


# --------------------------------------------------------------------------- placement


def test_exhaustive_placement_is_optimal_and_annealing_finds_it_on_small_meshes():
    hw = get_hardware("mocap-2x4")
    best = exhaustive_placement(hw)
    every = [evaluate_placement(hw, p).cost for p in itertools.permutations(range(8))]
    assert best.cost == pytest.approx(min(every))
    assert anneal_placement(hw, chains=64, steps=400).cost == pytest.approx(best.cost)


def test_exhaustive_placement_compiles_once_per_mesh_size(programs_compiled):
    """The exhaustive search's cost program is built once, not once per call: other weights on the
    same mesh size compile nothing."""
    hw = mocap_wafer(2, 3)
    exhaustive_placement(hw, pair_weight=2.0)
    with programs_compiled() as compiled:
        heavy_pairs = exhaustive_placement(hw, pair_weight=5.0)
    assert not compiled
    every = [evaluate_placement(hw, p, pair_weight=5.0).cost for p in itertools.permutations(range(6))]
    assert heavy_pairs.cost == pytest.approx(min(every))


def test_no_placement_puts_every_pair_and_neighbour_adjacent_when_half_is_even():
    hw = get_hardware("mocap-2x4")
    best = exhaustive_placement(hw)
    assert best.pipeline_hops + best.pair_hops > (8 - 1) + 4      # the checkerboard argument


def test_search_is_never_worse_than_snake_and_stays_in_a_region_on_huge_meshes():
    for hw in (get_hardware("mocap-4x4"), mocap_wafer(64, 64)):
        got = search_placement(hw, 16, steps=400)
        assert got.cost <= snake_report(hw, 16).cost + 1e-9
        assert len(set(got.placement.tolist())) == 16
    assert max(search_placement(mocap_wafer(64, 64), 16, steps=400).placement) < 64 * 6 + 6


# --------------------------------------------------------------------------- creditor blocking


def _blocking_oracle(serve, start, finish, host):
    """Plain-Python statement of creditor blocking: each read is charged to its host's first item not
    finished when the debtor's item starts (only the overlapping part if that item starts later)."""
    E, N = start.shape
    out = np.zeros((E, N))
    for k in range(E):
        for s in range(N):
            h = host[k, s]
            if serve[k, s] <= 0 or h < 0:
                continue
            done = int(np.sum(finish[:, h] <= start[k, s]))
            if done == E:
                continue
            nxt = start[done, h]
            charge = serve[k, s] if nxt <= start[k, s] else np.clip(start[k, s] + serve[k, s] - nxt, 0.0, serve[k, s])
            out[done, h] += charge
    return out


@pytest.mark.parametrize("items", [8, 32, 33, 64])
def test_creditor_blocking_matches_its_oracle_on_static_and_per_item_hosts(items):
    """Both paths (a fixed host per stage, and a host per item) against the plain statement, with
    timelines short and long enough for both ways of counting finished items; ties included."""
    rng = np.random.default_rng(items)
    N = 6
    # a stage runs its items one at a time, in order: idle gaps then durations, integers so that times tie
    gap, duration = rng.integers(0, 3, (items, N)), rng.integers(1, 3, (items, N))
    finish = np.cumsum(gap + duration, axis=0).astype(np.float64)
    start = finish - duration
    serve = np.where(rng.random((items, N)) < 0.7, rng.integers(0, 4, (items, N)).astype(np.float64), 0.0)
    stage_host = np.array([3, 4, 5, 0, 1, -1])
    static = np.broadcast_to(stage_host, (items, N))
    dynamic = np.where(rng.random((items, N)) < 0.8, rng.integers(0, N, (items, N)), -1)
    f = jax.jit(creditor_blocking)
    got_static = np.asarray(f(serve, start, finish, static, stage_host))
    got_dynamic = np.asarray(f(serve, start, finish, dynamic))
    np.testing.assert_allclose(got_static, _blocking_oracle(serve, start, finish, static), rtol=1e-12)
    np.testing.assert_allclose(got_dynamic, _blocking_oracle(serve, start, finish, dynamic), rtol=1e-12)
