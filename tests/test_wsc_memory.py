"""KV memory scheduler: the greedy rule by hand, invariants, LP optimum, local-only comparison."""

import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.specs import SpecError, get_model
from mocap_jax.wsc import layout as lay_
from mocap_jax.wsc import memory as mem
from mocap_jax.wsc import memory_optimal as mopt
from mocap_jax.wsc import memory_sim as msim
from mocap_jax.wsc import placement as plc
from mocap_jax.wsc import perf
from mocap_jax.wsc import plan as pl
from mocap_jax.wsc.hardware import wsc_wafer
from mocap_jax.wsc.traces import get_workload

W34 = wsc_wafer(3, 4)


def layout34():
    # prefill P0 at (0,0), P1 at (2,3); decode D0 (1x2) at (0,2)-(0,3), D1 (1x2) at (2,0)-(2,1)
    return lay_.Layout(3, 4, (lay_.Instance("decode", 0, 2, 1, 2), lay_.Instance("decode", 2, 0, 1, 2),
                             lay_.Instance("prefill", 0, 0, 1, 1), lay_.Instance("prefill", 2, 3, 1, 1)))


@pytest.mark.parametrize("xp", [np, jnp])
def test_greedy_allocate_by_hand(xp):
    free = xp.asarray([5.0, 10.0, 3.0, 8.0])
    prio = xp.asarray([1, 1, 0, 3])  # die 3 not allowed
    alloc, ok = mem.greedy_allocate(free, 9.0, prio, xp)
    # priority 0 first (die 2: 3), then priority 1 by most free (die 1: 6 of 10)
    assert bool(ok) and np.allclose(np.asarray(alloc), [0, 6, 3, 0])
    alloc, ok = mem.greedy_allocate(free, 17.0, prio, xp)
    assert bool(ok) and np.allclose(np.asarray(alloc), [4, 10, 3, 0])
    alloc, ok = mem.greedy_allocate(free, 19.0, prio, xp)  # 18 bytes allowed in all: nothing placed
    assert not bool(ok) and np.allclose(np.asarray(alloc), 0)


def test_priority_table_by_hand():
    t = mem.priority_table(W34, layout34(), "greedy")
    # P0 (0,0) -> D0 centre (0,2): box = row 0, cols 0..2
    grid = t[0, 0].reshape(3, 4)
    assert grid.tolist() == [[1, 1, 0, 0],
                             [2, 2, 2, 3],
                             [3, 3, 3, 3]]
    # P1 (2,3) -> D1 centre (2,0): row 2, all columns on the path, row 1 next to it
    assert t[1, 1].reshape(3, 4).tolist() == [[3, 3, 3, 3],
                                             [2, 2, 2, 2],
                                             [0, 0, 1, 1]]
    local = mem.priority_table(W34, layout34(), "local")
    assert set(np.unique(local[0, 0]).tolist()) == {0, 3} and (local[0, 0] == 0).sum() == 2
    with pytest.raises(SpecError, match="unknown memory policy"):
        mem.priority_table(W34, layout34(), "random")


def test_decode_hops():
    h = mem.decode_hops(W34, layout34())
    assert h[0].reshape(3, 4).tolist() == [[2, 1, 0, 0], [3, 2, 1, 1], [4, 3, 2, 2]]


def test_remote_kv_for_the_decode_model():
    kv = np.zeros(W34.num_dies)
    kv[5] = 100.0   # die (1,1): 2 hops from D0 at (0,2)-(0,3)
    kv[2] = 50.0    # on D0 itself: local, not remote
    r = mem.remote_kv(W34, layout34(), 0, kv, jnp.float64)
    assert float(r.tokens.sum()) == 100.0 and float(r.hops[5]) == 2.0
    assert float(r.ingress_links) == 3  # (0,1)->(0,2), (1,2)->(0,2), (1,3)->(0,3)
    model = get_model("llama2-7b")
    mp = pl.model_params(model, jnp.float64)
    from mocap_jax.wsc.hardware import WaferParams

    hw = WaferParams.from_spec(W34, jnp.float64)
    plan = pl.tp_plan(model, W34, pl.InstanceConfig(1, 2), jnp.float64)
    t_remote = perf.decode_iteration_time(mp, hw, plan, jnp.array([150.0]), remote=r)
    assert float(t_remote) > float(perf.decode_iteration_time(mp, hw, plan, jnp.array([150.0])))
    with pytest.raises(SpecError, match="out of range"):
        mem.remote_kv(W34, layout34(), 5, kv)


def test_greedy_schedule_invariants_and_head_of_line():
    rng = np.random.default_rng(3)
    table = mem.priority_table(W34, layout34(), "greedy")
    free0 = rng.uniform(0, 10, W34.num_dies)
    n = 60
    pre = rng.integers(0, 2, n)
    dec = rng.integers(0, 2, n)
    need = rng.uniform(0.5, 6, n)
    alloc, placed, paused, free = (np.asarray(x) for x in mem.greedy_schedule(
        jnp.asarray(free0), jnp.asarray(pre), jnp.asarray(dec), jnp.asarray(need), jnp.asarray(table)))
    assert np.all(alloc >= 0) and np.all(free >= -1e-9)                       # never over capacity
    assert np.allclose(free + alloc.sum(0), free0)                             # no KV lost or created
    assert np.allclose(alloc.sum(1)[placed], need[placed])                     # placed in full
    assert np.all(alloc.sum(1)[~placed] == 0) and np.all(placed ^ paused)      # otherwise paused, nothing held
    for r in range(n):                                                         # only allowed dies
        assert np.all(alloc[r][table[pre[r], dec[r]] == mem.NOT_ALLOWED] == 0)
    for p in (0, 1):                                                           # head of line per prefill
        idx = np.flatnonzero(pre == p)
        first = np.flatnonzero(paused[idx])
        if first.size:
            assert np.all(paused[idx[first[0]:]])
    assert paused.any() and placed.any()


def test_optimal_allocation_by_hand_and_grouping():
    # one request of 8 bytes, two dies: die 0 costs 0 with 5 free, die 1 costs 1 with 10 free
    x = mopt.optimal_allocation([5.0, 10.0], [8.0], [[0.0, 1.0]])
    assert np.allclose(x, [[5, 3]], atol=1e-6)
    # two identical requests (grouped in the LP) and one with other costs; more demand than room
    x = mopt.optimal_allocation([4.0, 4.0, 4.0], [3.0, 3.0, 9.0], [[0, 1, 2], [0, 1, 2], [2, 1, 0]])
    assert x.sum() == pytest.approx(12.0)                           # all room used
    assert np.all(x.sum(0) <= np.array([4, 4, 4]) + 1e-6) and np.all(x.sum(1) <= np.array([3, 3, 9]) + 1e-6)
    assert np.allclose(x[0], x[1])                                  # identical requests split alike
    cost = (x * np.array([[0, 1, 2], [0, 1, 2], [2, 1, 0]])).sum()
    assert cost == pytest.approx(4 * 0 + 4 * 0 + 4 * 1)             # dies 0, 2 at cost 0, die 1 at cost 1


@pytest.fixture(scope="module")
def pressured():
    """llama2-7b on a 3x4 wafer of 24 GB dies: many prefill dies, few decode slots' worth of DRAM."""
    model = get_model("llama2-7b")
    wafer = wsc_wafer(3, 4, dram_gb=24)
    layout = plc.decode_centred_placement(wafer, (1, 1), 8, (1, 2), 2, 1.0)
    pc, dc = pl.InstanceConfig(1, 1), pl.InstanceConfig(1, 2)
    wl = get_workload("azure-conv")
    budget = mem.die_budget(model, wafer, layout, pc, dc, 2048, 512, wl.max_prompt)
    arr, prompt, out = wl.with_rate(60.0).sample(400, seed=2)
    kvb = model.kv_bytes_per_token_layer(2) * model.layers
    reqs = msim.synthetic_requests(layout, prompt, out, arr, 0.13, 2048, kvb, 0.03)
    sims = {p: msim.simulate_kv(wafer, layout, budget, reqs, 256, p) for p in mem.POLICIES}
    return wafer, layout, budget, reqs, sims


def test_die_budget(pressured):
    wafer, layout, budget, _, _ = pressured
    occ = layout.occupancy().ravel()
    assert np.all(budget.free >= 0) and np.all(budget.resident[occ < 0] == 0)
    # decode dies hold half the weights of a 1x1 prefill die and no in-flight prompt reserve
    dec_die = int(np.flatnonzero(occ == 0)[0])
    pre_die = int(np.flatnonzero(occ == 2)[0])
    assert budget.free[dec_die] > budget.free[pre_die]
    with pytest.raises(SpecError, match="needs"):
        mem.die_budget(get_model("llama3-70b"), wafer, layout, pl.InstanceConfig(1, 1), pl.InstanceConfig(1, 2))


def test_simulation_invariants(pressured):
    wafer, layout, budget, reqs, sims = pressured
    n = len(reqs.kv_bytes)
    for policy, s in sims.items():
        assert s.min_free >= 0                                           # never over capacity
        assert np.all(s.peak_util <= wafer.usable_dram_fraction + 1e-9)
        assert s.placed + s.unplaceable == n                             # every request placed (maybe after a pause)
        assert s.unplaceable == 0
        assert np.allclose(s.request_alloc.sum(1)[s.request_placed], reqs.kv_bytes[s.request_placed])
        assert np.allclose(s.final_free, budget.free)                    # all KV released: none lost
        assert np.all(s.release_s[s.request_placed] >= s.place_s[s.request_placed])
    assert sims["local"].remote_bytes == 0 and sims["local"].kv_hop_bytes == 0
    # under pressure the greedy scheduler spills along paths and pauses less than local-only
    assert sims["local"].paused_requests > 0
    assert sims["greedy"].remote_bytes > 0
    assert sims["greedy"].pause_total_s < sims["local"].pause_total_s


def test_snapshot_greedy_local_optimal(pressured):
    wafer, layout, budget, reqs, sims = pressured
    g = sims["greedy"]
    ids = g.resident_at(g.peak_kv_s)
    assert len(ids) > 3
    res = {r.policy: r for r in mopt.compare_snapshot(wafer, layout, budget.free, reqs.prefill[ids],
                                                      g.request_decode[ids], reqs.kv_bytes[ids])}
    opt, gr, lo = res["optimal-lp"], res["greedy"], res["local"]
    assert opt.placed_bytes >= gr.placed_bytes - 1e-3 * gr.demand_bytes
    assert gr.placed_bytes >= lo.placed_bytes
    assert lo.remote_bytes == 0
    if gr.placed_bytes == pytest.approx(opt.placed_bytes, rel=1e-6):
        assert opt.hop_bytes <= gr.hop_bytes * (1 + 1e-9)
    for r in res.values():
        assert np.all(r.die_kv <= budget.free * (1 + 1e-9) + 1.0)


def test_bad_memory_input():
    with pytest.raises(SpecError, match="decode_batch"):
        msim.simulate_kv(W34, layout34(), None, None, 0)
    with pytest.raises(SpecError, match="at least one prefill"):
        msim.synthetic_requests(lay_.Layout(3, 4, (lay_.Instance("decode", 0, 0, 1, 1),)), [10], [5], [0.0], 0.1,
                               2048, 1.0, 0.01)
