"""Contention model pieces by hand: link resources, sharing rules against exact water-filling, traffic bytes."""

import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.specs import SpecError
from mocap_jax.specs import mesh
from mocap_jax.wsc import geometry as geo
from mocap_jax.wsc import perf
from mocap_jax.wsc import plan as pl
from mocap_jax.wsc import traffic as tf
from mocap_jax.wsc.hardware import WaferParams, a100_cluster, wsc_wafer
from mocap_jax.wsc.reference_flows import FlowNetwork, water_level
from mocap_jax.wsc.serving_state import TrafficState

from test_wsc_perf import HW, TOY


def test_link_resources_follow_xy_routes():
    w = wsc_wafer(3, 4)
    d = w.num_dies
    for a in range(d):
        for b in range(d):
            expect = []
            for x, y in mesh.xy_route(w.mesh_spec(), a, b):
                kind = {1: 0, -1: 1, w.cols: 2, -w.cols: 3}[y - x]
                expect.append(kind * d + x)
            assert geo.route_resources(w, a, b) == sorted(expect)
    cap = geo.link_capacity(w).reshape(4, 3, 4)
    assert np.all(cap[0, :, 3] == 0) and np.all(cap[1, :, 0] == 0) and np.all(cap[2, 2] == 0) and np.all(cap[3, 0] == 0)
    assert (cap > 0).sum() == len(geo.directed_links(w))
    # a cluster: NVLink ports inside a node, network ports between nodes
    c = a100_cluster(2, 4)
    assert geo.route_resources(c, 0, 3) == [0 * 8 + 0, 1 * 8 + 3]
    assert geo.route_resources(c, 1, 6) == [2 * 8 + 1, 3 * 8 + 6]


def test_read_routes_become_each_instances_die_link_pairs_in_order():
    """``[q, d, L]`` 0/1 route rows -> each instance's (die, link) pairs, die by die and each route's
    links in index order, padded with die 0 and link L (no link), against a loop over the routes;
    routes longer in all than the program holds are refused."""
    from mocap_jax.wsc.serving_inputs import _route_entries

    rng = np.random.default_rng(4)
    for _ in range(100):
        q, d, L = (int(x) for x in rng.integers(1, [6, 7, 30]))
        routes = (rng.random((q, d, L)) < rng.random()).astype(np.int64)
        entries = max(1, int(routes.sum(axis=(1, 2)).max()) + int(rng.integers(0, 3)))
        Q = q + int(rng.integers(0, 3))
        dies, links = np.zeros((Q, entries), np.int32), np.full((Q, entries), L, np.int32)
        for i in range(q):
            pairs = [(j, l) for j in range(d) for l in np.flatnonzero(routes[i, j])]
            for k, (j, l) in enumerate(pairs):
                dies[i, k], links[i, k] = j, l
        got = _route_entries(routes, Q, entries)
        assert np.array_equal(got["read_dies"], dies) and np.array_equal(got["read_links"], links)
    with pytest.raises(SpecError, match="cross 3 links in all, but the program holds 2"):
        _route_entries(np.ones((1, 1, 3), np.int64), 1, 2)


def test_packed_transfer_counts_give_the_float64_shares_rounded_once():
    """The program keeps a transfer's route counts as bytes and divides by the instance's dies in the
    step; that equals the share computed in float64 and rounded to float32 once, for every count and
    instance size a byte holds, and on a packed wafer set-up."""
    from mocap_jax.wsc import setup as su
    from mocap_jax.wsc.serving_inputs import pack_inputs, shape_for
    from mocap_jax.wsc.synthetic import synthetic_trace
    from mocap_jax.wsc.workload import WORKLOAD_PRESETS

    counts = np.arange(256, dtype=np.float64)[:, None]
    dies = np.arange(1, 256, dtype=np.float64)[None, :]
    assert np.array_equal(counts.astype(np.float32) / dies.astype(np.float32), (counts / dies).astype(np.float32))
    setup = su.build_setup("llama2-7b", "wsc-llm-64g", WORKLOAD_PRESETS["azure-conv"], "wsc", "greedy",
                           config=su.ServingConfig(contention="max-min"))
    trace = synthetic_trace("azure-conv", 16, 1.0, seed=0)
    shape = shape_for([setup], 16, setup.config)
    tr = pack_inputs(setup, trace, shape).traffic
    assert tr.transfer_counts.dtype == np.uint8
    t = setup.traffic
    P, D = t.transfer_counts.shape[:2]
    in_step = jnp.asarray(tr.transfer_counts).astype(jnp.float32) / jnp.asarray(tr.transfer_sources)[:, None, None]
    want = (t.transfer_counts / t.prefill_dies[:, None, None]).astype(np.float32)
    assert D == shape.dies and np.array_equal(np.asarray(in_step)[:P], want)
    assert np.all(np.asarray(in_step)[P:] == 0)


def test_ring_uses_match_the_plan_and_transfer_counts_sum_hops():
    w = wsc_wafer(4, 4)
    cfg = pl.InstanceConfig(2, 2)
    plan = pl.tp_plan(TOY, w, cfg)
    order, _ = pl.instance_rings(TOY, cfg)
    uses = geo.ring_resource_uses(w, [[(1 + r) * 4 + 1 + c for r, c in order]])
    assert uses.max() == float(plan.ring_load) and uses.sum() == 4  # a 2x2 ring: four one-hop steps
    line = pl.instance_rings(TOY, pl.InstanceConfig(1, 4))[0]
    assert geo.ring_resource_uses(w, [[c for _, c in line]]).sum() == 3 + 3  # the closing step runs back 3 hops
    counts = geo.transfer_resource_counts(w, [0, 1])
    hops = geo.hop_matrix(w)
    assert np.array_equal(counts.sum(axis=1), hops[0] + hops[1])
    table = geo.read_resource_table(w, [5, 6])
    assert np.array_equal(table.sum(axis=1), hops[:, [5, 6]].min(axis=1))


def _water_level_bisection(d, c):
    lo, hi = 0.0, max(d.max(), c)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.minimum(d, mid).sum() < c else (lo, mid)
    return hi


def test_water_level_against_bisection():
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = rng.exponential(1.0, rng.integers(1, 8)) * rng.choice([0.1, 1, 10])
        c = float(rng.uniform(0.2, 1.2) * d.sum())
        level = water_level(d, c)
        if d.sum() <= c:
            assert level == np.inf
        else:
            assert level == pytest.approx(_water_level_bisection(d, c), rel=1e-9)
            assert np.minimum(d, level).sum() == pytest.approx(c, rel=1e-9)


def test_flow_network_shares_by_hand():
    # one link of capacity 10: demands 2, 6, 8; max-min level 4 (2 + 4 + 4), proportional 10 / 16
    net = FlowNetwork(np.array([10.0]), np.array([1.0]), "max-min")
    for k, x in enumerate((2.0, 6.0, 8.0)):
        net.add(k, np.array([x]), np.array([0.0]))
    got = {k: float(v[0][0]) for k, v in net.shares().items()}
    assert got == pytest.approx({0: 1.0, 1: 4 / 6, 2: 4 / 8})
    net.rule = "proportional"
    assert {k: float(v[0][0]) for k, v in net.shares().items()} == pytest.approx({k: 10 / 16 for k in range(3)})
    with pytest.raises(SpecError, match="unknown contention rule"):
        FlowNetwork(np.array([1.0]), np.array([1.0]), "fifo")


def test_array_share_rules():
    share = lambda d, o, c, rule: float(tf.share(jnp.asarray(d), jnp.asarray(o), jnp.asarray(c), rule))
    # not over-subscribed: full demand under both rules; no demand: share 1
    assert share(3.0, 6.0, 10.0, tf.MAX_MIN) == 1.0 and share(3.0, 6.0, 10.0, tf.PROPORTIONAL) == 1.0
    assert share(0.0, 60.0, 10.0, tf.MAX_MIN) == 1.0
    # proportional is exact from the total
    assert share(8.0, 8.0, 10.0, tf.PROPORTIONAL) == pytest.approx(10 / 16)
    # max-min: exact when every competitor demands at least the fair share ...
    assert share(8.0, 16.0, 12.0, tf.MAX_MIN) == pytest.approx(water_level(np.array([8.0, 8.0, 8.0]), 12.0) / 8.0)
    # ... and when a small stream's demand fits beside the others (it gets all of it)
    assert share(1.0, 8.0, 10.0, tf.MAX_MIN) == 1.0
    # otherwise between the exact fair share and the proportional one: a large stream beside small
    # ones gets the proportional share (more than max-min gives it) ...
    exact = min(1.0, water_level(np.array([2.0, 6.0, 8.0]), 10.0) / 8.0)
    assert exact == pytest.approx(0.5) and share(8.0, 8.0, 10.0, tf.MAX_MIN) == pytest.approx(10 / 16)
    # ... and a small stream beside large ones what the others leave, up to its fair share
    exact_small = min(1.0, water_level(np.array([2.0, 6.0, 8.0]), 10.0) / 2.0)
    approx_small = share(2.0, 14.0, 10.0, tf.MAX_MIN)
    assert 10 / 16 <= approx_small <= exact_small + 1e-12


def test_iteration_traffic_by_hand():
    mp, hw = pl.model_params(TOY, jnp.float64), WaferParams.from_spec(HW, jnp.float64)
    one = pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 1))
    dram, ring, group = (float(x) for x in perf.iteration_traffic(mp, hw, one, 8.0, 8.0, 1.0))
    # per block: weights 36992 x 2 B + activations 2 x 8 x 64 x 2 B + KV 8 x 64 x 2 B; embedding 8 x 64 x 4 B; LM head
    assert dram == pytest.approx(2 * (36992 * 2 + 2048 + 1024) + 8 * 64 * 4 + 6400 * 2)
    assert ring == 0.0 and group == 0.0  # one die: no collectives
    quad = pl.tp_plan(TOY, HW, pl.InstanceConfig(2, 2))
    _, ring, _ = (float(x) for x in perf.iteration_traffic(mp, hw, quad, 2.0, 0.0, 0.0))
    # all-reduces of 2 tokens x 128 elements x 2 B: 2 per block (2 blocks) + embedding's, each 2 x 3/4 of the tensor
    per = 2 * 3 / 4
    assert ring == pytest.approx(2 * per * 2 * 128 * 2 + per * 2 * 64 * 2)


def test_transfer_time_with_competitors_ending():
    """Two equal transfers on one link: the second gets half until the first ends, then all of it."""
    w = wsc_wafer(1, 2)
    cap = 100.0
    L = 8
    link = np.zeros(L)
    link[0] = 1.0  # the east link out of die 0
    zeros = lambda *s: jnp.zeros(s)
    state = TrafficState(prefill_link=zeros(1, L), prefill_dram=zeros(1, 2), decode_link=zeros(1, L),
                         decode_dram=zeros(1, 2), instance_link=zeros(L), instance_dram=zeros(2),
                         transfer_link=jnp.asarray(np.stack([link * cap, np.zeros(L)])),
                         transfer_end=jnp.asarray([1.0, 0.0]), transfer_next=jnp.asarray(1))
    inp = type("I", (), {"traffic": type("X", (), {"link_capacity": jnp.asarray(link * cap), "rule": 0})()})()
    # 150 bytes at t = 0: shared (50/s) for 1 s while the other transfer runs, then 100/s: 1 + 100 / 100 = 2 s
    seconds = tf._transfer_seconds(inp, state, jnp.asarray(link * 150.0), jnp.asarray(link * cap), 0.0)
    assert float(seconds) == pytest.approx(2.0)
    assert w.num_dies * 4 == L
