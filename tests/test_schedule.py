"""Items, the timing recurrence and memory resolved in time, against plain-Python oracles and hand cases."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax import costs
from mocap_jax.api import resolve, simulate
from mocap_jax.costs import HardwareParams, ModelParams, StageLayout
from mocap_jax.prefill.evaluate import timeline
from mocap_jax.schedule import memory
from mocap_jax.schedule.shape import Release
from mocap_jax.schedule.items import chunked_items, gpipe_items, item_table, pad_items, uniform_partition
from mocap_jax.schedule.recurrence import finish_times, pipeline_latency, wavefront
from mocap_jax.schedule.shape import Admission, SimShape
from mocap_jax.specs import ModelSpec, get_hardware, get_model, mocap_wafer


# the kernels as the evaluator runs them, compiled (run operation by operation, each operation of
# each shape would be a program of its own; finish_times and pipeline_latency compile themselves
# when given numbers)
wavefront_program = jax.jit(wavefront)
held_program = jax.jit(memory.held_before_start, static_argnums=6)
timeline_program = jax.jit(timeline, static_argnums=2)


def oracle(t, d, ready=None, stage_free=None):
    """finish[k, s] = max(finish[k-1, s], finish[k, s-1] + d[k, s-1], ready[k] if s == 0) + t[k, s]."""
    K, N = t.shape
    f = np.zeros((K, N))
    for k in range(K):
        for s in range(N):
            prev_item = f[k - 1, s] if k else (0.0 if stage_free is None else stage_free[s])
            prev_stage = f[k, s - 1] + d[k, s - 1] if s else (0.0 if ready is None else ready[k])
            f[k, s] = max(prev_item, prev_stage) + t[k, s]
    return f


# --------------------------------------------------------------------------- items


def test_item_table_groups_prefixes_and_ends():
    t = item_table(np.array([3, 2, 5, 1, 0, 0]), np.array([4, 4, 2, 2, 0, 0]), np.array([0, 0, 1, 1, 1, 1]))
    assert t.prefix.tolist() == [0, 3, 0, 5, 0, 0]
    assert t.last.tolist() == [False, True, False, True, False, False]
    assert t.group_last.tolist()[:4] == [1, 1, 3, 3]
    assert t.valid.tolist() == [True] * 4 + [False] * 2
    assert t.requests.tolist() == [4, 4, 2, 2, 0, 0]


def test_chunked_and_gpipe_items_share_the_builder_traced_and_on_host():
    host = chunked_items(np.array([4, 4, 2]), 3)
    traced = jax.jit(chunked_items)(jnp.array([4, 4, 2]), 3)
    for a, b in zip(jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(traced)):
        np.testing.assert_array_equal(a, np.asarray(b))
    g = gpipe_items(100, 5, 2, 4)
    assert g.requests.tolist() == [2, 2, 1, 0] and g.last.tolist() == [True, True, True, False]
    assert g.group_last.tolist() == [0, 1, 2, 3]
    padded = pad_items(chunked_items(np.array([5, 5]), 2), 4)
    assert padded.tokens.tolist() == [5, 5, 0, 0] and padded.group_last.tolist() == [1, 1, 2, 3]


def test_uniform_partition():
    assert uniform_partition(10, 3).tolist() == [4, 3, 3]
    assert uniform_partition(9, 3).sum() == 9


# --------------------------------------------------------------------------- recurrence


@pytest.mark.parametrize("seed", range(4))
def test_closed_forms(seed):
    rng = np.random.default_rng(seed)
    K, N = int(rng.integers(1, 40)), int(rng.integers(1, 20))
    tau = rng.uniform(1e-4, 1.0)
    assert float(pipeline_latency(jnp.full((K, N), tau))) == pytest.approx((K + N - 1) * tau, rel=1e-12)
    t_k = rng.uniform(1e-3, 1.0, K)
    got = pipeline_latency(jnp.asarray(np.repeat(t_k[:, None], N, axis=1)))
    assert float(got) == pytest.approx(t_k.sum() + (N - 1) * t_k.max(), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_finish_times_match_the_oracle_with_handoffs_ready_and_stage_free(seed):
    rng = np.random.default_rng(seed)
    K, N = int(rng.integers(1, 12)), int(rng.integers(1, 9))
    t, d = rng.uniform(0, 1, (K, N)), rng.uniform(0, 0.5, (K, N))
    ready, free = rng.uniform(0, 3, K), rng.uniform(0, 3, N)
    np.testing.assert_allclose(finish_times(t, d, ready, free), oracle(t, d, ready, free), rtol=1e-12)
    # the same under vmap (configurations kept as a trailing batch axis inside) and batched leading axes
    tb, db = np.stack([t, 2 * t]), np.stack([d, d])
    want = np.stack([oracle(t, d), oracle(2 * t, d)])
    np.testing.assert_allclose(jax.jit(jax.vmap(finish_times))(tb, db), want, rtol=1e-12)
    np.testing.assert_allclose(finish_times(tb, db), want, rtol=1e-12)
    np.testing.assert_allclose(wavefront_program(np.moveaxis(tb, 0, -1), np.moveaxis(db, 0, -1))[..., 1], want[1],
                               rtol=1e-12)


def test_float32_agrees_with_float64():
    rng = np.random.default_rng(7)
    t, d = rng.uniform(0, 1, (32, 16)), rng.uniform(0, 0.1, (32, 16))
    f64 = finish_times(jnp.asarray(t), jnp.asarray(d))
    f32 = finish_times(jnp.asarray(t, jnp.float32), jnp.asarray(d, jnp.float32))
    np.testing.assert_allclose(f32, f64, rtol=1e-5)


def test_synchronous_batches_wait_for_the_previous_exit():
    rng = np.random.default_rng(3)
    K, N = 5, 4
    t, d = rng.uniform(0.1, 1, (K, N)), rng.uniform(0, 0.1, (K, N))
    shape = SimShape(items=K, stages=N, batches=3, admission=Admission.SYNCHRONOUS)
    got = np.asarray(timeline_program(np.tile(t, (3, 1)), np.tile(d, (3, 1)), shape)[0]).reshape(3, K, N)
    free, exit_time = np.zeros(N), 0.0
    for j in range(3):
        want = oracle(t, d, np.full(K, exit_time), free)
        np.testing.assert_allclose(got[j], want, rtol=1e-12)
        free, exit_time = want[-1], want[-1, -1]
    streaming = np.asarray(timeline_program(np.tile(t, (3, 1)), np.tile(d, (3, 1)),
                                    shape._replace(admission=Admission.STREAMING))[0])
    np.testing.assert_allclose(streaming, oracle(np.tile(t, (3, 1)), np.tile(d, (3, 1))), rtol=1e-12)


def test_the_recurrence_compiles_once_per_shape():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def latency(t):
        return pipeline_latency(t)

    for scale in (1.0, 2.0, 3.0):
        latency(jnp.full((8, 4), scale))


# --------------------------------------------------------------------------- memory resolved in time


def _tiny(tile=4096, scale=1.0):
    m = ModelSpec("tiny", layers=4, hidden=256, ffn=1024, q_heads=4, kv_heads=2, head_dim=64, vocab=1000)
    hw = mocap_wafer(2, 2, hbm_capacity=50e9, mlp_token_tile=tile, activation_buffer_scale=scale)
    return m, hw


def _activation(m, hw, c, b, last, stage, n=4):
    """Hand statement of the activation buffers of a chunk of c tokens x b requests on a 1-layer stage."""
    T = b * c
    tile = T if hw.mlp_token_tile == 0 else min(T, hw.mlp_token_tile)
    attn = T * (m.hidden + m.q_heads * (m.head_dim + m.head_dim))
    mlp = T * m.hidden + tile * (2 * m.ffn + m.hidden)
    head = b * m.vocab if (last and stage == n - 1) else 0
    return hw.activation_buffer_scale * (max(attn, mlp) + head) * hw.activation_bytes


@pytest.mark.parametrize("tile", [0, 128, 4096])
def test_activation_buffers_follow_their_statement(tile):
    m, hw = _tiny(tile)
    mp, hp = ModelParams.from_spec(m, np.float64), HardwareParams.from_spec(hw, np.float64)
    layout = StageLayout.snake(hw, 4, 4, np.float64)
    c, b = np.array([512.0, 64.0]), np.array([3.0, 3.0])
    got = costs.item_activation_bytes(mp, hp, layout, c, b, np.array([False, True]), 4, xp=np)
    for k in range(2):
        for s in range(4):
            assert got[k, s] == pytest.approx(_activation(m, hw, c[k], b[k], k == 1, s), rel=1e-12)


def test_peak_memory_is_resolved_in_time_without_double_counting():
    """One request: a stage's peak is at its last chunk, weights + the whole sequence's KV + that chunk's
    activations (the chunk's KV is counted once, as KV being written)."""
    m, hw = _tiny()
    part = np.array([3000, 500, 500])
    r = simulate(m, hw, int(part.sum()), "terapipe", partition=part, batch=2, num_batches=1, dtype="float64",
                 placement="snake")
    kv_tok = m.kv_bytes_per_token_layer(hw.kv_bytes)                 # one layer per stage
    for s in range(4):
        acts = [_activation(m, hw, c, 2, k == 2, s) for k, c in enumerate(part)]
        want = max(r.weight_bytes_per_stage[s] + 2 * (part[:k + 1].sum()) * kv_tok + acts[k] for k in range(3))
        assert r.peak_mem_bytes_per_stage[s] == pytest.approx(want, rel=1e-12)
        assert r.kv_peak_bytes_per_stage[s] == pytest.approx(2 * part.sum() * kv_tok, rel=1e-12)


def _held_oracle(start, kv, group, release, policy):
    """KV of the earlier items each stage still holds when item k starts, by the definition: an
    earlier item's KV is held unless its group's release (``stage``: the same group only) is at or
    before that start."""
    E, N = start.shape
    held = np.zeros((E, N))
    for k in range(E):
        for s in range(N):
            for j in range(k):
                if policy == Release.STAGE:
                    held[k, s] += kv[j, s] * (group[j] == group[k])
                else:
                    held[k, s] += kv[j, s] * (release[group[j], s] > start[k, s])
    return held


@pytest.mark.parametrize("groups", [5, 80])          # 80 > 64: the counting path
@pytest.mark.parametrize("policy", [Release.REQUEST, Release.STAGE])
def test_held_kv_before_each_start_against_its_definition(groups, policy):
    rng = np.random.default_rng(groups)
    E, N = 2 * groups + 3, 4
    group = np.sort(np.concatenate([np.arange(groups), rng.integers(0, groups, E - groups)]))
    ends = np.array([np.flatnonzero(group == g)[-1] for g in range(groups)], np.int32)
    first = np.array([np.flatnonzero(group == group[k])[0] for k in range(E)], np.int32)
    tokens = rng.integers(1, 5000, E).astype(np.float64)
    per_token = rng.uniform(1e3, 1e5, N)
    start = np.sort(rng.uniform(0, 10, (E, N)), axis=0)
    # a group is released after its last item started there, and groups are released in order
    release = np.maximum.accumulate(start[ends] + rng.uniform(0.01, 3, (groups, N)), axis=0)
    got = held_program(jnp.asarray(start), jnp.asarray(tokens), jnp.asarray(per_token), jnp.asarray(ends),
                       jnp.asarray(release), jnp.asarray(first), policy)
    want = _held_oracle(start, tokens[:, None] * per_token[None, :], group, release, policy)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-3)


def test_request_release_holds_the_previous_batch_while_the_next_starts():
    """With two batches the stage policy frees a batch's KV before the next batch's first chunk starts on a
    stage; the request policy keeps it until the batch leaves the last stage, so early stages hold both."""
    m, hw = _tiny(scale=0.0)
    kw = dict(chunks=4, batch=1, num_batches=2, dtype="float64", placement="snake")
    stage = simulate(m, hw, 4096, "terapipe", release="stage", **kw)
    request = simulate(m, hw, 4096, "terapipe", release="request", **kw)
    kv_seq = 4096 * m.kv_bytes_per_token_layer(hw.kv_bytes)
    np.testing.assert_allclose(stage.kv_peak_bytes_per_stage, kv_seq, rtol=1e-12)
    assert request.kv_peak_bytes_per_stage[0] > kv_seq * 1.2
    assert request.kv_peak_bytes_per_stage[-1] == pytest.approx(kv_seq, rel=1e-12)


def test_the_occupancy_timeline_peaks_where_the_memory_peak_says():
    m, hw = _tiny()
    r = simulate(m, hw, 8192, "terapipe", chunks=4, batch=3, num_batches=2, dtype="float64", placement="snake")
    np.testing.assert_allclose(r.timeline_kv_bytes.max(axis=0), r.kv_peak_bytes_per_stage, rtol=1e-12)
    assert np.all(r.timeline_mem_bytes.max(axis=0) <= r.peak_mem_bytes_per_stage * (1 + 1e-12))


def test_feasibility_and_its_reasons():
    m = get_model("llama3-70b")
    hw = get_hardware("mocap-4x4")
    fits = simulate(m, hw, 65536, "terapipe", chunks=16, batch=4)
    assert fits.feasible and np.isfinite(fits.prefill_latency_s)
    too_long = simulate(m, hw, 32 * 2 ** 20, "terapipe", chunks=16, batch=1, num_batches=1)
    assert not too_long.feasible and too_long.prefill_latency_s == np.inf and np.isfinite(too_long.raw_latency_s)
    assert too_long.throughput_rps == 0.0


def test_config_shapes_are_buckets():
    cfg = resolve("llama3-70b", "mocap-4x4", 65536, "gpipe", batch=5, microbatch=2)
    assert cfg.items_per_batch == 3 and cfg.shape().items == 4 and cfg.shape().groups == 4
