"""EvaluateE2E against a plain-Python serving oracle (FCFS batching, the timing recurrence by double
loop), arrival processes, and bad input.

The oracle takes each batch size's stage and hand-off times from single-batch simulations and
does the batching and the carried stage-free times itself, so it checks the serving layer, not the
cost model (tested elsewhere)."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

import mocap_jax as mj
from mocap_jax.api import resolve
from mocap_jax.schedule.shape import bucket
from mocap_jax.serving.arrivals import arrival_times
from mocap_jax.serving.e2e import ServingShape, e2e_latency_jit


@functools.lru_cache(maxsize=None)
def _times(model, hw, S, partition, b, gpipe):
    r = mj.simulate(model, hw, S, "gpipe" if gpipe else "terapipe", partition=None if gpipe else list(partition),
                    batch=b, num_batches=1, dtype="float64", timeline=False)
    return r.stage_times, r.handoff_times


def oracle_e2e(model, hw, S, partition, B, arrivals, gpipe=False, synchronous=False):
    """FCFS batching and the recurrence as an independent double loop over items and stages."""
    R = len(arrivals)
    comp = np.zeros(R)
    stage_free = None
    exit_prev = 0.0
    q = 0
    while q < R:
        gate = exit_prev if synchronous or stage_free is None else stage_free[0]
        start = max(gate, arrivals[q])
        waiting = int(np.sum(arrivals[q:] <= start))
        b = min(max(waiting, 1), B, R - q)
        t, d = _times(model, hw, S, tuple(int(x) for x in partition), b, gpipe)
        K, n = t.shape
        stage_free = np.zeros(n) if stage_free is None else stage_free
        f = np.zeros((K, n))
        for k in range(K):
            for s in range(n):
                prev_item = f[k - 1, s] if k else stage_free[s]
                prev_stage = f[k, s - 1] + d[k, s - 1] if s else start
                f[k, s] = max(prev_item, prev_stage) + t[k, s]
        comp[q:q + b] = f[:, -1] if gpipe else f[-1, -1]
        stage_free, exit_prev = f[-1].copy(), f[-1, -1]
        q += b
    return comp


@pytest.mark.parametrize("case", range(6))
def test_e2e_matches_oracle(case):
    rng = np.random.default_rng(case)
    model, hw = ("llama3.1-8b", "mocap-2x2") if case % 2 else ("qwen3-30b-a3b", "mocap-2x4")
    S, M, B, R = 16384, 4, int(rng.integers(1, 5)), 24
    gpipe, sync = case in (2, 5), case in (3, 4)
    part = rng.multinomial(S - M, np.ones(M) / M) + 1
    rate = float(rng.uniform(1, 40))
    arr = arrival_times("poisson" if case % 3 else "fixed", rate, R, seed=case)
    cfg = resolve(model, hw, S, "gpipe" if gpipe else "terapipe", partition=None if gpipe else part, batch=B,
                  num_batches=1, admission="synchronous" if sync else "streaming", dtype="float64")
    k = bucket(B) if gpipe else bucket(M)
    padded = np.zeros(k, np.int32)
    if not gpipe:
        padded[:M] = part
    shape = cfg.shape(k)
    out = e2e_latency_jit(cfg.point(k), jnp.asarray(padded), S, 1, B, jnp.asarray(arr),
                          jnp.zeros((k, shape.stages)), 0, ServingShape(prefill=shape, requests=R, gpipe=gpipe))
    want = oracle_e2e(model, hw, S, part, B, arr, gpipe, sync)
    np.testing.assert_allclose(np.asarray(out["completion_s"]), want, rtol=1e-9)
    e2e = want - arr
    assert float(out["mean_s"]) == pytest.approx(e2e.mean(), rel=1e-9)
    assert float(out["p99_s"]) == pytest.approx(np.percentile(e2e, 99), rel=1e-9)
    sizes = np.asarray(out["batch_sizes"])
    assert sizes.sum() == R and sizes.max() <= B          # every request served exactly once, FCFS batches


def test_arrival_processes():
    assert np.all(arrival_times("offline", None, 5) == 0)
    np.testing.assert_allclose(arrival_times("fixed", 2.0, 4), [0, 0.5, 1.0, 1.5])
    a = arrival_times("poisson", 10.0, 20000, seed=1)
    assert np.all(np.diff(a) >= 0) and 1 / np.diff(a).mean() == pytest.approx(10.0, rel=0.03)
    tr = arrival_times("trace", 5.0, 3, trace=[10.0, 12.0, 14.0])
    np.testing.assert_allclose(tr, [0, 0.2, 0.4])


@pytest.mark.parametrize("kind,rate,fragment", [("poisson", 0.0, "load must be > 0"),
                                                ("fixed", -1.0, "load must be > 0"),
                                                ("gamma", 1.0, "unknown arrival process")])
def test_arrival_bad_input(kind, rate, fragment):
    with pytest.raises(ValueError, match=fragment):
        arrival_times(kind, rate, 10)
