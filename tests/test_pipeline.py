"""The §5 recurrence: closed forms, a plain-Python oracle, batching, dtypes and trace counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mocap_jax as mj
from mocap_jax.pipeline import finish_times, pipeline_latency
from mocap_jax.schedule import batch_finish_times


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


def oracle_batches(t, d, num_batches, synchronous):
    """Consecutive identical batches, streaming or synchronous admission, as a plain loop."""
    K, N = t.shape
    out, stage_free, exit_time = [], np.zeros(N), 0.0
    for _ in range(num_batches):
        ready = np.full(K, exit_time if synchronous else 0.0)
        f = oracle(t, d, ready, stage_free)
        out.append(f)
        stage_free, exit_time = f[-1], f[-1, -1]
    return np.stack(out)


@pytest.mark.parametrize("seed", range(5))
def test_equal_times_closed_form(seed):
    rng = np.random.default_rng(seed)
    K, N = rng.integers(1, 40), rng.integers(1, 20)
    tau = rng.uniform(1e-4, 1.0)
    got = pipeline_latency(jnp.full((K, N), tau, jnp.float64))
    assert got == pytest.approx((K + N - 1) * tau, rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_stage_uniform_closed_form(seed):
    rng = np.random.default_rng(seed)
    K, N = rng.integers(1, 40), rng.integers(1, 20)
    t_k = rng.uniform(1e-3, 1.0, K)
    t = np.repeat(t_k[:, None], N, axis=1)
    got = pipeline_latency(jnp.asarray(t))
    assert float(got) == pytest.approx(t_k.sum() + (N - 1) * t_k.max(), rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_finish_times_match_oracle_with_handoff_ready_and_stage_free(seed):
    rng = np.random.default_rng(seed)
    K, N = rng.integers(1, 12), rng.integers(1, 9)
    t, d = rng.uniform(0, 1, (K, N)), rng.uniform(0, 0.5, (K, N))
    ready, sf = rng.uniform(0, 3, K), rng.uniform(0, 2, N)
    got = np.asarray(finish_times(t, d, ready, sf))
    np.testing.assert_allclose(got, oracle(t, d, ready, sf), rtol=1e-12)
    assert float(pipeline_latency(t, d, ready)) == pytest.approx(oracle(t, d, ready)[-1, -1], rel=1e-12)


@pytest.mark.parametrize("synchronous", [False, True])
def test_admission_modes_match_oracle(synchronous):
    rng = np.random.default_rng(7)
    t, d = rng.uniform(0, 1, (6, 5)), rng.uniform(0, 0.2, (6, 5))
    got = np.asarray(batch_finish_times(jnp.asarray(t), jnp.asarray(d), jnp.asarray(synchronous), 3))
    np.testing.assert_allclose(got, oracle_batches(t, d, 3, synchronous), rtol=1e-12)
    if synchronous:  # each batch enters only after the previous one left the last stage
        assert np.all(got[1:, 0, 0] - t[0, 0] >= got[:-1, -1, -1] - 1e-12)


def test_batched_equals_loop_and_vmap():
    rng = np.random.default_rng(3)
    t, d = rng.uniform(0, 1, (4, 3, 7, 5)), rng.uniform(0, 0.1, (4, 3, 7, 5))
    batched = np.asarray(pipeline_latency(t, d))
    vmapped = np.asarray(jax.vmap(jax.vmap(pipeline_latency))(t, d))
    loop = np.array([[oracle(t[i, j], d[i, j])[-1, -1] for j in range(3)] for i in range(4)])
    np.testing.assert_allclose(batched, loop, rtol=1e-12)
    np.testing.assert_allclose(vmapped, loop, rtol=1e-12)
    # vmap with an unbatched hand-off operand
    half = np.asarray(jax.vmap(pipeline_latency, in_axes=(0, None))(t[0], d[0, 0]))
    np.testing.assert_allclose(half, [oracle(t[0, j], d[0, 0])[-1, -1] for j in range(3)], rtol=1e-12)


def test_padding_items_and_stages_is_neutral():
    rng = np.random.default_rng(5)
    t, d = rng.uniform(0, 1, (5, 4)), rng.uniform(0, 0.1, (5, 4))
    d[:, -1] = 0.0
    tp = np.zeros((8, 8))
    dp = np.zeros((8, 8))
    tp[:5, :4], dp[:5, :4] = t, d
    assert float(pipeline_latency(tp, dp)) == pytest.approx(oracle(t, d)[-1, -1], rel=1e-12)


def test_float32_agrees_with_float64():
    rng = np.random.default_rng(11)
    t, d = rng.uniform(1e-3, 1, (64, 32, 16)), rng.uniform(0, 1e-3, (64, 32, 16))
    f64 = np.asarray(pipeline_latency(jnp.asarray(t, jnp.float64), jnp.asarray(d, jnp.float64)))
    f32 = np.asarray(pipeline_latency(jnp.asarray(t, jnp.float32), jnp.asarray(d, jnp.float32)))
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, f64, rtol=1e-5)


def test_simulate_float32_vs_float64():
    kw = dict(chunks=16, batch=3, num_batches=2)
    a = mj.simulate("llama3-70b", "mocap-4x4", 32768, dtype="float32", **kw)
    b = mj.simulate("llama3-70b", "mocap-4x4", 32768, dtype="float64", **kw)
    np.testing.assert_allclose(a.finish_times, b.finish_times, rtol=1e-5)
    np.testing.assert_allclose(a.kv_peak_bytes_per_stage, b.kv_peak_bytes_per_stage, rtol=1e-5)
    assert a.prefill_latency_s == pytest.approx(b.prefill_latency_s, rel=1e-5)
