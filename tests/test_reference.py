"""Self-tests of the event-driven reference (mocap_jax.validation.reference), without MBKR.

The reference is the yardstick of the vectorised evaluator, so it is checked on its own: the
closed forms of the timing recurrence, the recurrence re-evaluated from its own outputs, items of
every scheme, memory resolved in time on hand-computed cases (no double count of the last
chunk, releases at the instant of a start, request vs stage release over two batches), the
activation buffers with and without the MLP token tile, KV conservation, admission, the summary
metrics, bad input and its independence from the array kernels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mocap_jax import costs
from mocap_jax.specs import ModelSpec, SpecError, get_hardware, get_model, mocap_wafer
from mocap_jax.validation.reference import build_items, reference_run, reference_simulate, uniform_partition

# 16 equal dense layers, tied embeddings (no LM-head weights): every stage of a 2, 4, 8 or 16-stage
# pipeline holds the same layers, so items cost the same on every stage.
TIED = ModelSpec("tied-16l", layers=16, hidden=1024, ffn=4096, q_heads=8, kv_heads=2, head_dim=128, vocab=32000,
                 tied_embeddings=True)
# hand-offs cost (almost) nothing and HBM bandwidth is effectively unlimited: the embedding read and
# the hand-offs are ~1e-9 of a stage time
FAST = dict(link_latency_s=0.0, link_bandwidth=1e20, cross_wafer_bandwidth=1e20, hbm_bandwidth=1e20)
IDEAL_2X2 = mocap_wafer(2, 2, name="ideal-2x2", **FAST)
IDEAL_4X4 = mocap_wafer(4, 4, name="ideal-4x4", **FAST)


def _recurrence(t, d, ready):
    """finish[k, s] = max(finish[k-1, s], finish[k, s-1] + d[k, s-1], ready(k) if s == 0) + t[k, s], loop by loop."""
    K, N = t.shape
    f = np.zeros((K, N))
    for k in range(K):
        for s in range(N):
            prev = f[k - 1, s] if k > 0 else 0.0
            arrive = f[k, s - 1] + d[k, s - 1] if s > 0 else ready(k, f)
            f[k, s] = max(prev, arrive) + t[k, s]
    return f


def _kv_per_token(model, hw, n):
    m, h = get_model(model), get_hardware(hw)
    return costs.stage_kv_bytes_per_token(costs.ModelParams.from_spec(m, np.float64),
                                          costs.HardwareParams.from_spec(h, np.float64), n, n, xp=np)


def _held_by_definition(r):
    """KV each stage holds just after each start, from the definitions: an item's KV counts from its
    start until its group's release (stage: the stage finishes the group's last item; request: the
    group's last item leaves the last stage), releases at a start's instant applied first."""
    E, N = r.start_times.shape
    release = np.empty((E, N))
    for it in r.items:
        g = it.group_last
        release[it.index] = r.finish_times[g] if r.release == "stage" else r.finish_times[g, N - 1]
    out = np.zeros((E, N))
    for k in range(E):
        for s in range(N):
            tau = r.start_times[k, s]
            live = (r.start_times[:, s] <= tau) & (release[:, s] > tau)
            out[k, s] = r.kv_bytes[live, s].sum()
    return out


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("hw, microbatches", [(IDEAL_2X2, 5), (IDEAL_4X4, 7)])
def test_equal_times_give_M_plus_N_minus_1_times_t(hw, microbatches):
    # GPipe, one request per microbatch: identical items, identical stages
    r = reference_simulate(TIED, hw, 4096, "gpipe", batch=microbatches, microbatch=1, num_batches=1)
    t = r.stage_times
    np.testing.assert_allclose(t, t[0, 0], rtol=1e-8, err_msg="the set-up should give equal stage times")
    assert r.raw_latency_s == pytest.approx((microbatches + hw.num_dies - 1) * t[0, 0], rel=1e-8)


@pytest.mark.parametrize("hw, seq_len, chunks", [(IDEAL_2X2, 8192, 6), (IDEAL_4X4, 20000, 9)])
def test_stage_uniform_times_give_sum_plus_N_minus_1_max(hw, seq_len, chunks):
    # later chunks cost more (longer prefix), but each item costs the same on every stage
    part = [1000 + 200 * k for k in range(chunks - 1)]
    part.append(seq_len - sum(part))
    r = reference_simulate(TIED, hw, seq_len, partition=part, batch=2, num_batches=1)
    t = r.stage_times
    np.testing.assert_allclose(t, np.repeat(t[:, :1], hw.num_dies, axis=1), rtol=1e-8)
    assert len(np.unique(t[:, 0])) == chunks
    assert r.raw_latency_s == pytest.approx(t[:, 0].sum() + (hw.num_dies - 1) * t[:, 0].max(), rel=1e-8)


CASES = [
    dict(model="llama3-70b", hardware="mocap-4x4", seq_len=32768, chunks=16, num_batches=1),
    dict(model="qwen3-235b-a22b", hardware="mocap-2x4", seq_len=20000, partition=[9000, 6000, 3000, 1500, 500],
         batch=3, num_batches=3, admission="synchronous", release="request"),
    dict(model="mixtral-8x22b", hardware="mocap-4x4x2w", seq_len=16384, scheme="gpipe", batch=5, microbatch=2),
    dict(model="llama3.1-8b", hardware="mocap-2x2", seq_len=7001, chunks=7, batch=2, num_batches=3),
]
PLAN = dict(model="llama3-70b", hardware="mocap-2x4", groups=[(3, [4000, 3000, 1192]), (2, [8192]), (1, [100, 8092])],
            release="request", num_batches=2, placement=[0, 1, 2, 3, 7, 6, 5])


def _run(case):
    case = dict(case)
    if "groups" in case:
        return reference_run(case.pop("model"), case.pop("hardware"), case.pop("groups"), **case)
    return reference_simulate(**case)


@pytest.mark.parametrize("case", CASES + [PLAN])
def test_event_simulation_is_the_recurrence(case):
    r = _run(case)
    sync = r.admission == "synchronous"
    last_of_batch = {it.batch: it.index for it in r.items}
    ready = lambda k, f: f[last_of_batch[r.items[k].batch - 1], -1] if sync and r.items[k].batch > 0 else 0.0
    np.testing.assert_array_equal(r.finish_times, _recurrence(r.stage_times, r.handoff_times, ready))
    np.testing.assert_array_equal(r.item_times, r.stage_times)
    assert np.all(r.start_times[1:] >= r.finish_times[:-1]), "one item at a time per stage, in item order"


def test_items_keep_item_order_when_a_later_item_arrives_first():
    # a slow link: chunk 0's hand-off takes longer than chunk 1's compute plus its own hand-off
    hw = get_hardware("mocap-2x2").replace(name="slowlink-2x2", link_bandwidth=1e8, cross_wafer_bandwidth=1e8)
    r = reference_simulate("llama3.1-8b", hw, 4096, partition=[4000, 96], num_batches=1)
    arrive = r.finish_times[:, :-1] + r.handoff_times[:, :-1]
    assert arrive[1, 0] < arrive[0, 0], "set-up should make chunk 1 arrive first"
    assert r.start_times[1, 1] == r.finish_times[0, 1]


def test_items_of_every_scheme():
    chunked = build_items([(3, uniform_partition(10, 4))], num_batches=2)
    assert [it.tokens for it in chunked] == [3, 3, 2, 2] * 2
    assert [it.prefix for it in chunked] == [0, 3, 6, 8] * 2
    assert [it.last for it in chunked] == [False, False, False, True] * 2
    assert [it.group_last for it in chunked] == [3] * 4 + [7] * 4
    assert [it.group for it in chunked] == [0] * 4 + [1] * 4
    g = reference_simulate("llama3.1-8b", "mocap-2x2", 100, "gpipe", batch=5, microbatch=2)
    assert [it.requests for it in g.items] == [2, 2, 1] * 2
    assert all(it.tokens == 100 and it.prefix == 0 and it.last for it in g.items)
    plan = build_items([(2, [5, 3]), (1, [8])])
    assert [(it.tokens, it.prefix, it.requests, it.group, it.last) for it in plan] == \
        [(5, 0, 2, 0, False), (3, 5, 2, 0, True), (8, 0, 1, 1, True)]


# --------------------------------------------------------------------------- memory resolved in time


def _activation_by_hand(m: ModelSpec, hw, tokens: int, requests: int, on_last_stage: bool, ends_group: bool):
    """Activation bytes of an item on a stage of dense layers, written from the contract's words."""
    attention = tokens * (m.hidden + m.q_heads * (m.qk_head_dim + m.v_dim))
    tile = tokens if hw.mlp_token_tile == 0 else min(tokens, hw.mlp_token_tile)
    mlp = tokens * m.hidden + tile * (2 * m.ffn + m.hidden)
    logits = requests * m.vocab if on_last_stage and ends_group else 0
    return hw.activation_buffer_scale * (max(attention, mlp) + logits) * hw.activation_bytes


@pytest.mark.parametrize("tile, scale", [(4096, 1.0), (0, 1.0), (512, 2.0), (4096, 0.0)])
def test_activation_buffers_with_and_without_the_mlp_tile(tile, scale):
    m = get_model("llama3.1-8b")
    hw = get_hardware("mocap-2x2").replace(name="act", mlp_token_tile=tile, activation_buffer_scale=scale)
    r = reference_simulate(m, hw, 30000, partition=[20000, 9000, 1000], batch=2, num_batches=1)
    for k, (c, last) in enumerate([(20000, False), (9000, False), (1000, True)]):
        for s in range(4):
            assert r.activation_bytes[k, s] == pytest.approx(
                _activation_by_hand(m, hw, 2 * c, 2, s == 3, last), rel=1e-12), (k, s)
    if tile == 4096 and scale == 1.0:
        # tiling bounds the MLP intermediates: the untiled engine needs more for the large chunk only
        untiled = reference_simulate(m, hw.replace(name="untiled", mlp_token_tile=0), 30000,
                                     partition=[20000, 9000, 1000], batch=2, num_batches=1)
        assert np.all(untiled.activation_bytes[0] > r.activation_bytes[0])
        assert untiled.activation_bytes[2, 1] == r.activation_bytes[2, 1]


def test_peak_at_the_last_chunk_counts_its_kv_once():
    # one batch, uniform chunks, stage release: stage s's peak is when its last chunk starts, holding
    # every earlier chunk and writing the last: weights + S x B x kv/token + that chunk's activations
    model, hw, S, B, M = "llama3-70b", "mocap-2x4", 65536, 3, 8
    r = reference_simulate(model, hw, S, chunks=M, batch=B, num_batches=1)
    kv = _kv_per_token(model, hw, 8)
    expect = r.weight_bytes_per_stage + S * B * kv + r.activation_bytes[M - 1]
    np.testing.assert_allclose(r.peak_mem_bytes_per_stage, expect, rtol=1e-13)
    np.testing.assert_allclose(r.kv_peak_bytes_per_stage, S * B * kv, rtol=1e-13)
    # the bound "largest KV held + largest workspace" would count the last chunk's KV twice
    bound = r.weight_bytes_per_stage + S * B * kv + (r.kv_bytes + r.activation_bytes).max(axis=0)
    assert np.all(bound - r.peak_mem_bytes_per_stage == pytest.approx(r.kv_bytes[M - 1], rel=1e-12))


def test_a_release_at_the_instant_of_a_start_is_applied_first():
    # GPipe, stage release: each microbatch frees its KV when it finishes a stage, and the next one
    # starts on stage 0 at exactly that instant, so a stage never holds more than one microbatch's KV
    r = reference_simulate("llama3.1-8b", "mocap-2x2", 4096, "gpipe", batch=3, microbatch=1, num_batches=1)
    assert r.start_times[1, 0] == r.finish_times[0, 0] and r.start_times[2, 0] == r.finish_times[1, 0]
    np.testing.assert_allclose(r.kv_peak_bytes_per_stage, r.kv_bytes[0], rtol=1e-15)
    np.testing.assert_allclose(r.peak_mem_bytes_per_stage, r.weight_bytes_per_stage + r.kv_bytes[0]
                               + r.activation_bytes.max(axis=0), rtol=1e-15)


def test_request_and_stage_release_over_two_batches():
    model, hw, S, B, M = "llama3.1-8b", "mocap-2x4", 32768, 2, 4
    kw = dict(chunks=M, batch=B, num_batches=2, admission="streaming")
    stage = reference_simulate(model, hw, S, release="stage", **kw)
    request = reference_simulate(model, hw, S, release="request", **kw)
    np.testing.assert_array_equal(stage.finish_times, request.finish_times)   # release does not change timing
    kv = _kv_per_token(model, hw, 8)
    # stage release: batch 0 is freed on a stage when the stage finishes it, before batch 1 starts there
    np.testing.assert_allclose(stage.kv_peak_bytes_per_stage, S * B * kv, rtol=1e-13)
    # request release: batch 0 stays until it leaves the last stage; the batch-1 chunks a stage has
    # started by then are held beside it (their count, hand-checked from the start times)
    exit_time = request.finish_times[M - 1, -1]
    for s in range(8):
        started = int(np.sum(request.start_times[M:, s] < exit_time))
        expect = (S + started * (S // M)) * B * kv[s]
        assert request.kv_peak_bytes_per_stage[s] == pytest.approx(expect, rel=1e-13), s
    assert int(np.sum(request.start_times[M:, 0] < exit_time)) == M, "stage 0 starts all of batch 1 before"
    assert request.kv_peak_bytes_per_stage[-1] == pytest.approx(S * B * kv[-1], rel=1e-13)


@pytest.mark.parametrize("case", CASES + [PLAN])
def test_peaks_and_timeline_follow_the_definition(case):
    r = _run(case)
    held = _held_by_definition(r)
    at_start = r.weight_bytes_per_stage + held + r.activation_bytes
    np.testing.assert_allclose(r.peak_mem_bytes_per_stage, at_start.max(axis=0), rtol=1e-12)
    np.testing.assert_allclose(r.kv_peak_bytes_per_stage, held.max(axis=0), rtol=1e-12)
    # the timeline: the KV after everything at each instant
    for i in np.linspace(0, len(r.timeline_times) - 1, 25).astype(int):
        tau = r.timeline_times[i]
        for s in range(r.start_times.shape[1]):
            rel = np.array([r.finish_times[it.group_last, s] if r.release == "stage"
                            else r.finish_times[it.group_last, -1] for it in r.items])
            live = (r.start_times[:, s] <= tau) & (rel > tau)
            assert r.timeline_kv_bytes[i, s] == pytest.approx(r.kv_bytes[live, s].sum(), rel=1e-12, abs=1e-3)


@pytest.mark.parametrize("case", CASES + [PLAN])
def test_kv_is_conserved_at_every_event(case):
    r = _run(case)
    time_, held, written, released = r.kv_audit.T
    np.testing.assert_allclose(held, written - released, rtol=1e-12, atol=1e-3)
    assert np.all(np.diff(time_) >= 0) and np.all(held >= 0)
    assert written[-1] == pytest.approx(r.kv_bytes.sum(), rel=1e-12)
    assert released[-1] == pytest.approx(written[-1], rel=1e-12) and held[-1] == pytest.approx(0, abs=1e-3)
    if "groups" not in case:
        m, hw = get_model(case["model"]), get_hardware(case["hardware"])
        tokens = r.num_batches * case.get("batch", 1) * case["seq_len"]
        assert written[-1] == pytest.approx(tokens * m.layers * m.kv_elements_per_token_layer * hw.kv_bytes,
                                            rel=1e-12)


def test_infeasible_points_report_times_but_no_latency():
    r = reference_simulate("llama3-70b", "mocap-2x2", 131072, chunks=8, batch=16, release="request")
    assert not r.feasible and np.any(r.peak_mem_bytes_per_stage > r.capacity_bytes)
    assert r.prefill_latency_s == math.inf and r.throughput_rps == 0.0
    assert math.isfinite(r.raw_latency_s) and r.raw_latency_s == r.finish_times[7, -1]
    ok = reference_simulate("llama3-70b", "mocap-2x2", 4096, chunks=8, batch=1)
    assert ok.feasible and ok.prefill_latency_s == ok.raw_latency_s


# --------------------------------------------------------------------------- admission and metrics


def test_synchronous_admission_and_the_summary_metrics():
    kw = dict(model="llama3.1-8b", hardware="mocap-2x4", seq_len=8192, chunks=4, batch=2, num_batches=3)
    sync = reference_simulate(admission="synchronous", **kw)
    stream = reference_simulate(admission="streaming", **kw)
    M, N = 4, 8
    for j in (1, 2):
        assert sync.start_times[j * M, 0] == sync.finish_times[j * M - 1, -1]
        assert stream.start_times[j * M, 0] == stream.finish_times[j * M - 1, 0]
    np.testing.assert_array_equal(sync.finish_times[:M], stream.finish_times[:M])
    t0 = stream.stage_times[:M]
    assert stream.period_s == pytest.approx(t0.sum(axis=0).max(), rel=1e-15)
    assert stream.throughput_rps == pytest.approx(2 / t0.sum(axis=0).max(), rel=1e-15)
    assert sync.period_s == sync.prefill_latency_s and sync.throughput_rps == 2 / sync.prefill_latency_s
    assert stream.bubble_fraction == pytest.approx(1 - t0.sum() / (N * stream.prefill_latency_s), rel=1e-14)
    np.testing.assert_allclose(stream.stage_utilisation, t0.sum(axis=0) / stream.period_s, rtol=1e-15)


def test_handoff_routes_share_link_bandwidth():
    # mocap-2x4, stages on dies 0, 2, 1, 3 of the first row: routes 0->2 and 1->3 both use the
    # directed link (1, 2), so each gets half of it; route 2->1 runs alone on (2, 1)
    hw, m = get_hardware("mocap-2x4"), get_model("llama3.1-8b")
    r = reference_simulate(m, hw, 4096, "gpipe", batch=1, placement=[0, 2, 1, 3], num_batches=1)
    nbytes = 4096 * m.hidden * hw.activation_bytes
    lat, bw, eff = hw.link_latency_s, hw.link_bandwidth, hw.eff_link
    expect = [2 * lat + nbytes / (bw / 2 * eff), lat + nbytes / (bw * eff), 2 * lat + nbytes / (bw / 2 * eff), 0.0]
    np.testing.assert_allclose(r.handoff_times[0], expect, rtol=1e-14)


@pytest.mark.parametrize("call, match", [
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, "mocap"), "scheme"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, release="never"), "release"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, admission="eager"), "admission"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, partition=[100, 200]), "sums to"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, partition=[4096, 0]), ">= 1"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, chunks=5000), "chunks"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, batch=0), "batch"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096.5), "seq_len"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, placement=[0, 0, 1, 2]), "distinct"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, placement=[0, 9]), "placement"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, "gpipe", partition=[4096]), "chunked"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, p1=0.9, p2=0.5), "p1 <= p2"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, spill="lazy"), "spill"),
    (lambda: reference_simulate("llama3.1-8b", "mocap-2x2", 4096, num_batches=0), "num_batches"),
    (lambda: reference_run("llama3.1-8b", "mocap-2x2", [(2, [])]), "non-empty"),
    (lambda: reference_run("llama3.1-8b", "mocap-2x2", [(0, [4096])]), "requests"),
    (lambda: reference_run("llama3.1-8b", "mocap-2x2", 7), "groups"),
    (lambda: reference_run("no-such-model", "mocap-2x2", [(1, [4096])]), "model"),
])
def test_bad_input_is_one_spec_error(call, match):
    with pytest.raises(SpecError, match=match):
        call()


def test_reference_is_independent_of_the_array_kernels(imports_of):
    import importlib

    for name in ("items", "quantities", "ledger", "spill", "engine", "result", "simulate"):
        module = importlib.import_module(f"mocap_jax.validation.reference.{name}")
        for entry in imports_of(module):
            parts = set(entry.split(":")[0].split("."))
            assert not parts & {"schedule", "prefill", "mbkr", "api", "jax", "partition", "search"}, \
                f"reference.{name} imports {entry}"
