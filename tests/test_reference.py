"""Self-tests of the event-driven reference simulator (mocap_jax.validation.reference).

The reference is the yardstick of the vectorised simulator, so it is checked here on
its own: the §5 closed forms, the recurrence of docs/semantics.md re-evaluated from
its own outputs, KV conservation at every ledger event, the occupancy definition,
release policies on hand-checked tiny cases and the two admission modes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mocap_jax import costs
from mocap_jax.specs import ModelSpec, get_hardware, get_model, mocap_wafer
from mocap_jax.validation.reference import build_items, reference_simulate, uniform_partition

# A dense model with tied embeddings (no LM head cost) and 16 layers, so every stage of
# a 2, 4, 8 or 16-stage pipeline holds the same layers.
TIED = ModelSpec("tied-16l", layers=16, hidden=1024, ffn=4096, q_heads=8, kv_heads=2, head_dim=128, vocab=32000,
                 tied_embeddings=True)
# "Ideal" hardware: no hand-off cost (zero hop latency, effectively infinite link
# bandwidth) and effectively infinite HBM bandwidth, so the embedding read and the
# hand-offs are below half an ulp of any stage time and every stage of a balanced model
# takes exactly the same time.
IDEAL_2X2 = mocap_wafer(2, 2, name="ideal-2x2", link_latency_s=0.0, link_bandwidth=1e30, cross_wafer_bandwidth=1e30,
                        hbm_bandwidth=1e30)
IDEAL_4X4 = mocap_wafer(4, 4, name="ideal-4x4", link_latency_s=0.0, link_bandwidth=1e30, cross_wafer_bandwidth=1e30,
                        hbm_bandwidth=1e30)


def _recurrence(t, d, ready_fn):
    """finish[k, s] of docs/semantics.md, written out loop by loop."""
    K, N = t.shape
    f = np.zeros((K, N))
    for k in range(K):
        for s in range(N):
            prev_item = f[k - 1, s] if k > 0 else 0.0
            arrive = f[k, s - 1] + d[k, s - 1] if s > 0 else ready_fn(k, f)
            f[k, s] = max(prev_item, arrive) + t[k, s]
    return f


def _occupancy(r, release):
    """occ_s(tau) at every finish time, from the definition (finish <= tau < release)."""
    items = r.items
    K, N = r.finish_times.shape
    rel = np.empty((K, N))
    for it in items:
        g = it.group_last
        for s in range(N):
            rel[it.index, s] = r.finish_times[g, s] if release == "stage" else r.finish_times[g, N - 1]
    taus = np.unique(r.finish_times)
    occ = np.zeros((len(taus), N))
    for i, tau in enumerate(taus):
        held = (r.finish_times <= tau) & (tau < rel)
        occ[i] = (r.kv_bytes * held).sum(axis=0)
    return taus, occ


# --------------------------------------------------------------------------- closed forms (§5)


@pytest.mark.parametrize("hw, microbatches", [(IDEAL_2X2, 5), (IDEAL_4X4, 7)])
def test_equal_times_without_handoff_cost_give_M_plus_N_minus_1_times_t(hw, microbatches):
    # gpipe, one request per microbatch: every item is identical, every stage equal.
    r = reference_simulate(TIED, hw, 4096, scheme="gpipe", batch=microbatches, microbatch=1)
    t = r.stage_times
    assert np.all(t == t[0, 0]), "the ideal set-up should give exactly equal stage times"
    N = hw.num_dies
    assert r.batch_latency_s == pytest.approx((microbatches + N - 1) * t[0, 0], rel=1e-13)
    assert r.prefill_latency_s == r.batch_latency_s


@pytest.mark.parametrize("hw, seq_len, chunks", [(IDEAL_2X2, 8192, 6), (IDEAL_4X4, 20000, 9)])
def test_stage_uniform_times_give_sum_plus_N_minus_1_max(hw, seq_len, chunks):
    # chunked: later chunks cost more (longer prefix), but each item costs the same on every stage.
    part = [1000 + 200 * k for k in range(chunks - 1)]
    part.append(seq_len - sum(part))
    r = reference_simulate(TIED, hw, seq_len, scheme="terapipe", partition=part, batch=2)
    t = r.stage_times
    assert np.all(t == t[:, :1]), "per-item times should be identical on every stage"
    assert len(np.unique(t[:, 0])) == chunks, "chunk times should differ"
    N = hw.num_dies
    tk = t[:, 0]
    assert r.batch_latency_s == pytest.approx(tk.sum() + (N - 1) * tk.max(), rel=1e-13)


def test_identical_items_on_real_hardware_follow_the_general_closed_form():
    # No hand-off cost, identical items with unequal stage times: sum_s t_s + (M-1) max_s t_s.
    hw = get_hardware("mocap-2x4").replace(name="nolink-2x4", link_latency_s=0.0, link_bandwidth=1e30,
                                           cross_wafer_bandwidth=1e30)
    r = reference_simulate("llama3-70b", hw, 8192, scheme="gpipe", batch=6, microbatch=1)
    ts = r.stage_times[0]
    assert np.all(r.stage_times == ts)
    assert ts[0] != ts[1] and ts[-1] != ts[1], "embedding and LM head make the end stages slower"
    assert r.batch_latency_s == pytest.approx(ts.sum() + 5 * ts.max(), rel=1e-12)


# --------------------------------------------------------------------------- the recurrence


CASES = [
    dict(model="llama3-70b", hardware="mocap-4x4", seq_len=32768, chunks=16),
    dict(model="qwen3-235b-a22b", hardware="mocap-2x4", seq_len=20000, partition=[9000, 6000, 3000, 1500, 500],
         batch=3, num_batches=3, admission="synchronous", release="request"),
    dict(model="mixtral-8x22b", hardware="mocap-4x4x2w", seq_len=16384, scheme="gpipe", batch=5, microbatch=2,
         num_batches=2),
    dict(model="llama3.1-8b", hardware="mocap-2x2", seq_len=7001, chunks=7, batch=2, num_batches=3),
    dict(model="llama3.1-8b", hardware="mocap-2x4", seq_len=4096, scheme="gpipe", batch=4, num_batches=3,
         admission="synchronous", release="request"),
]


@pytest.mark.parametrize("case", CASES)
def test_event_simulation_matches_the_recurrence(case):
    r = reference_simulate(**case)
    last_of_batch = {}
    for it in r.items:
        last_of_batch[it.batch] = max(last_of_batch.get(it.batch, -1), it.index)
    sync = case.get("admission") == "synchronous"

    def ready(k, f):
        b = r.items[k].batch
        return f[last_of_batch[b - 1], -1] if sync and b > 0 else 0.0

    f = _recurrence(r.stage_times, r.handoff_times, ready)
    np.testing.assert_allclose(r.finish_times, f, rtol=1e-13, atol=0)
    np.testing.assert_allclose(r.start_times, r.finish_times - r.stage_times, rtol=1e-12, atol=1e-15)
    # one item at a time per stage, in item order
    assert np.all(r.start_times[1:] >= r.finish_times[:-1] - 1e-15)
    assert r.finish_times.shape == (len(r.items), len(r.placement))
    assert r.items_per_batch * r.num_batches == len(r.items)


def test_items_keep_item_order_when_a_later_item_arrives_first():
    # Very slow links: the hand-off of a big chunk takes longer than the next small chunk's
    # compute plus its own hand-off, so chunk 1 reaches stage 1 before chunk 0 does.  Stages
    # still serve items in item order.
    hw = get_hardware("mocap-2x2").replace(name="slowlink-2x2", link_bandwidth=1e8, cross_wafer_bandwidth=1e8)
    r = reference_simulate("llama3.1-8b", hw, 4096, partition=[4000, 96])
    arrive = r.finish_times[:, :-1] + r.handoff_times[:, :-1]
    assert arrive[1, 0] < arrive[0, 0], "set-up should make chunk 1 arrive first"
    assert r.start_times[1, 1] == pytest.approx(r.finish_times[0, 1], rel=1e-15)
    f = _recurrence(r.stage_times, r.handoff_times, lambda k, f: 0.0)
    np.testing.assert_allclose(r.finish_times, f, rtol=1e-13)


# --------------------------------------------------------------------------- items


def test_items_of_chunked_and_gpipe_schemes():
    items = build_items("terapipe", 10, 3, chunks=4, num_batches=2)
    assert [it.tokens for it in items] == [3, 3, 2, 2] * 2
    assert [it.prefix for it in items] == [0, 3, 6, 8] * 2
    assert [it.requests for it in items] == [3] * 8
    assert [it.last for it in items] == [False, False, False, True] * 2
    assert [it.group_last for it in items] == [3] * 4 + [7] * 4
    g = build_items("gpipe", 100, 5, microbatch=2, num_batches=2)
    assert [it.requests for it in g] == [2, 2, 1] * 2
    assert all(it.tokens == 100 and it.prefix == 0 and it.last for it in g)
    assert [it.group_last for it in g] == [0, 1, 2, 3, 4, 5]
    assert uniform_partition(10, 4) == [3, 3, 2, 2]


# --------------------------------------------------------------------------- KV memory


@pytest.mark.parametrize("case", CASES)
def test_kv_is_conserved_at_every_event(case):
    r = reference_simulate(**case)
    audit = r.kv_audit
    assert len(audit) > 0
    held, produced, freed = audit[:, 1], audit[:, 2], audit[:, 3]
    np.testing.assert_allclose(held, produced - freed, rtol=1e-12, atol=1e-3)
    assert np.all(held >= -1e-3)
    assert np.all(np.diff(audit[:, 0]) >= 0), "events are logged in time order"
    # everything produced is eventually freed, and it is exactly the KV of every token on every layer
    m = get_model(case["model"])
    hw = get_hardware(case["hardware"])
    total = case.get("num_batches", 1) * case.get("batch", 1) * case["seq_len"] * m.layers * \
        m.kv_elements_per_token_layer * hw.kv_bytes
    assert produced[-1] == pytest.approx(total, rel=1e-12)
    assert freed[-1] == pytest.approx(total, rel=1e-12)
    assert held[-1] == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("case", CASES)
def test_timeline_and_peak_follow_the_occupancy_definition(case):
    r = reference_simulate(**case)
    release = case.get("release", "stage")
    taus, occ = _occupancy(r, release)
    N = len(r.placement)
    for s in range(N):
        tl = r.kv_timeline[s]
        assert np.all(np.diff(tl[:, 0]) > 0), "one sample per event time"
        # the timeline is the occupancy after everything at each sample time
        idx = np.searchsorted(taus, tl[1:, 0])
        assert np.all(taus[idx] == tl[1:, 0])
        np.testing.assert_allclose(tl[1:, 1], occ[idx, s], rtol=1e-12, atol=1e-3)
    np.testing.assert_allclose(r.kv_peak_bytes_per_stage, np.maximum(occ.max(axis=0), 0), rtol=1e-12)
    np.testing.assert_allclose(r.peak_mem_bytes_per_stage, r.weight_bytes_per_stage + r.workspace_bytes_per_stage
                               + r.kv_peak_bytes_per_stage, rtol=1e-15)


def test_release_policies_on_two_chunks():
    # B=1, partition [3000, 1000] on 4 stages.
    hw = get_hardware("mocap-2x2")
    m = get_model("llama3.1-8b")
    kvpt = m.layers // 4 * m.kv_elements_per_token_layer * hw.kv_bytes  # 8 layers per stage
    st = reference_simulate(m, hw, 4000, partition=[3000, 1000], release="stage")
    # stage policy: chunk 0 is held from finish[0, s] until finish[1, s]; chunk 1 never counts.
    np.testing.assert_allclose(st.kv_peak_bytes_per_stage, [3000 * kvpt] * 4, rtol=1e-15)
    rq = reference_simulate(m, hw, 4000, partition=[3000, 1000], release="request")
    # request policy: both chunks until the request leaves stage 3; stage 3 frees at its own finish.
    np.testing.assert_allclose(rq.kv_peak_bytes_per_stage, [4000 * kvpt] * 3 + [3000 * kvpt], rtol=1e-15)
    # stage 1 under the request policy: 3000 tokens from finish[0,1], 4000 from finish[1,1] to finish[1,3]
    tl = rq.kv_timeline[1]
    f = rq.finish_times
    expect = [(0.0, 0.0), (f[0, 1], 3000 * kvpt), (f[1, 1], 4000 * kvpt), (f[1, 3], 0.0)]
    np.testing.assert_allclose(tl, np.array(expect), rtol=1e-15)
    # identical times either way: release does not change timing without MBKR
    np.testing.assert_array_equal(st.finish_times, rq.finish_times)


def test_gpipe_release_policies_and_a_tie_at_release_time():
    # Ideal hardware: equal stage times t, no hand-off cost, so finish[1, s] == finish[0, s+1] exactly.
    r = reference_simulate(TIED, IDEAL_2X2, 2048, scheme="gpipe", batch=2, microbatch=1, release="stage")
    assert np.all(r.kv_peak_bytes_per_stage == 0), "whole-request items free their KV as they finish"
    q = reference_simulate(TIED, IDEAL_2X2, 2048, scheme="gpipe", batch=2, microbatch=1, release="request")
    f = q.finish_times
    assert f[1, 2] == f[0, 3], "set-up should produce an exact tie"
    one = 2048 * TIED.layers // 4 * TIED.kv_elements_per_token_layer * IDEAL_2X2.kv_bytes
    # stage 0: microbatch 1 lands (2t) before microbatch 0 leaves stage 3 (4t) -> both held.
    # stage 1: lands at 3t < 4t -> both.  stage 2: lands at 4t, the instant microbatch 0 is
    # freed -> only one counts.  stage 3: frees at its own finish -> nothing.
    np.testing.assert_allclose(q.kv_peak_bytes_per_stage, [2 * one, 2 * one, one, 0.0], rtol=1e-15)


def test_workspace_weights_and_feasibility():
    r = reference_simulate("llama3-70b", "mocap-2x2", 65536, chunks=8, batch=2)
    m, hw = get_model("llama3-70b"), get_hardware("mocap-2x2")
    mp = costs.ModelParams.from_spec(m, np.float64)
    hp = costs.HardwareParams.from_spec(hw, np.float64)
    w = costs.stage_weight_bytes(mp, hp, 4, 4, xp=np)
    np.testing.assert_allclose(r.weight_bytes_per_stage, w)
    assert r.weight_bytes_per_stage.sum() == pytest.approx(m.total_params * 2 - 2 * m.hidden, rel=1e-6)
    kvpt = m.layers // 4 * m.kv_elements_per_token_layer * hw.kv_bytes
    expect_ws = 2 * 8192 * kvpt + hw.activation_workspace_factor * 2 * 8192 * m.hidden * hw.activation_bytes
    np.testing.assert_allclose(r.workspace_bytes_per_stage, expect_ws, rtol=1e-15)
    assert r.feasible == bool(np.all(r.peak_mem_bytes_per_stage <= r.usable_hbm_bytes))
    # 70B on 4 dies with 16 requests of 128k tokens held to the end does not fit
    big = reference_simulate("llama3-70b", "mocap-2x2", 131072, chunks=8, batch=16, release="request")
    assert not big.feasible
    assert big.prefill_latency_s == math.inf and big.throughput_rps == 0.0
    assert np.isfinite(big.finish_times).all() and big.batch_latency_s > 0
    assert np.any(big.peak_mem_bytes_per_stage > big.usable_hbm_bytes)


# --------------------------------------------------------------------------- admission and metrics


def test_synchronous_admission_waits_for_the_previous_batch():
    kw = dict(model="llama3.1-8b", hardware="mocap-2x4", seq_len=8192, chunks=4, batch=2, num_batches=3)
    sync = reference_simulate(admission="synchronous", **kw)
    stream = reference_simulate(admission="streaming", **kw)
    M = 4
    for j in (1, 2):
        first, prev_last = j * M, j * M - 1
        assert sync.start_times[first, 0] == sync.finish_times[prev_last, -1]
        # streaming: the next batch enters as soon as stage 0 is free
        assert stream.start_times[first, 0] == stream.finish_times[prev_last, 0]
        assert stream.start_times[first, 0] < stream.finish_times[prev_last, -1]
    # the batches run back to back: synchronous is k times one batch exactly
    np.testing.assert_allclose(sync.finish_times[-1, -1], 3 * sync.batch_latency_s, rtol=1e-13)
    assert stream.finish_times[-1, -1] < sync.finish_times[-1, -1]
    # batch 0 is the same either way
    np.testing.assert_array_equal(sync.finish_times[:M], stream.finish_times[:M])
    assert sync.prefill_latency_s == stream.prefill_latency_s
    # throughput: B / bottleneck stage work (streaming), B / latency (synchronous)
    t0 = stream.stage_times[:M]
    assert stream.throughput_rps == pytest.approx(2 / t0.sum(axis=0).max(), rel=1e-14)
    assert sync.throughput_rps == pytest.approx(2 / sync.prefill_latency_s, rel=1e-14)
    N = 8
    assert stream.bubble_fraction == pytest.approx(1 - t0.sum() / (N * stream.prefill_latency_s), rel=1e-14)
    assert 0 < stream.bubble_fraction < 1


def test_links_record_handoffs():
    # mocap-4x4x2w: the snake over a 4x8 grid crosses the wafer boundary inside every row.
    r = reference_simulate("llama3.1-8b", "mocap-4x4x2w", 4096, scheme="gpipe", batch=1)
    d = r.handoff_times[0]
    assert len(r.link_busy_s) == 31  # snake neighbours are one hop apart: one link per hand-off
    for s in range(len(d) - 1):
        a, b = int(r.placement[s]), int(r.placement[s + 1])
        assert r.link_busy_s[(a, b)] == pytest.approx(d[s], rel=1e-12)
    # a slower wafer-to-wafer link shows up on the hand-off that crosses the boundary (stage 3 -> 4)
    slow = get_hardware("mocap-4x4x2w").replace(name="slow-xw", cross_wafer_bandwidth=1e11)
    rs = reference_simulate("llama3.1-8b", slow, 4096, scheme="gpipe", batch=1)
    ds = rs.handoff_times[0]
    assert ds[3] > 10 * ds[2] and ds[2] == pytest.approx(d[2], rel=1e-15)
    assert rs.link_busy_s[(3, 4)] == pytest.approx(ds[3], rel=1e-12)
    two = reference_simulate("llama3.1-8b", "mocap-2x2", 4096, chunks=4, batch=1)
    assert max(two.link_peak_concurrency.values()) == 1  # hand-offs here are far shorter than stage times


@pytest.mark.parametrize("kwargs, match", [
    (dict(scheme="mocap"), "scheme"),
    (dict(release="never"), "release"),
    (dict(admission="eager"), "admission"),
    (dict(partition=[100, 200]), "sums to"),
    (dict(partition=[4096, 0]), "positive"),
    (dict(chunks=5000), "chunks"),
    (dict(batch=0), "batch"),
    (dict(placement=[0, 0, 1, 2]), "distinct"),
    (dict(scheme="gpipe", partition=[4096]), "chunked"),
])
def test_bad_input_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        reference_simulate("llama3.1-8b", "mocap-2x2", 4096, **kwargs)


def test_custom_placement_sets_the_stages():
    r = reference_simulate("llama3.1-8b", "mocap-2x4", 4096, chunks=4, placement=[0, 1, 5, 4])
    assert r.finish_times.shape == (4, 4)
    assert set(r.link_busy_s) == {(0, 1), (1, 5), (5, 4)}


def test_reference_is_independent_of_the_array_kernels(imports_of):
    from mocap_jax.validation import reference

    imported = imports_of(reference)
    text = " ".join(imported)
    for kernel in ("pipeline", "schedule", "memory", "api", "simulate", "jax"):
        assert kernel not in text.replace("simpy", ""), f"reference imports {kernel}: {sorted(imported)}"


def test_handoff_routes_share_link_bandwidth():
    # mocap-2x4, stages on dies 0, 2, 1, 3 of the first row: routes 0->2 and 1->3 both use the
    # directed link (1, 2), so each gets half of it; route 2->1 runs alone on (2, 1).
    hw = get_hardware("mocap-2x4")
    m = get_model("llama3.1-8b")
    r = reference_simulate(m, hw, 4096, scheme="gpipe", batch=1, placement=[0, 2, 1, 3])
    nbytes = 4096 * m.hidden * hw.activation_bytes
    lat, bw, eff = hw.link_latency_s, hw.link_bandwidth, hw.eff_link
    expect = [2 * lat + nbytes / (bw / 2 * eff), lat + nbytes / (bw * eff), 2 * lat + nbytes / (bw / 2 * eff), 0.0]
    np.testing.assert_allclose(r.handoff_times[0], expect, rtol=1e-14)
    # the shared link carried both hand-offs (they do not overlap here: the union is their sum)
    assert r.link_busy_s[(1, 2)] == pytest.approx(expect[0] + expect[2], rel=1e-12)
