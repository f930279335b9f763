"""EvaluateE2E against a plain-Python serving oracle (FCFS batching, §5 recurrence by double loop),
arrival processes, and bad input."""

import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax import api, costs
from mocap_jax.schedule import bucket
from mocap_jax.serving import ServingShape, arrival_times, e2e_latency_jit
from mocap_jax.specs import get_hardware, get_model


def oracle_e2e(model, hw, S, partition, B, arrivals, gpipe=False, synchronous=False):
    """Independent loop implementation of docs/semantics.md + mocap_jax.serving's batching rule."""
    m, h = get_model(model), get_hardware(hw)
    n = h.num_dies
    mp, hp = costs.ModelParams.from_spec(m, np.float64), costs.HardwareParams.from_spec(h, np.float64)
    lay = costs.StageLayout.snake(h, n, n, np.float64)
    R = len(arrivals)
    comp = np.zeros(R)
    stage_free = np.zeros(n)
    exit_prev = 0.0
    q = 0
    while q < R:
        start = max(exit_prev if synchronous else stage_free[0], arrivals[q])
        waiting = int(np.sum(arrivals[q:] <= start))
        b = min(max(waiting, 1), B, R - q)
        if gpipe:
            c = np.full(b, float(S)); p = np.zeros(b); req = np.ones(b); last = np.ones(b, bool)
        else:
            c = np.asarray(partition, float); p = np.cumsum(c) - c; req = np.full(len(c), float(b))
            last = np.arange(len(c)) == len(c) - 1
        t = costs.stage_times(mp, hp, lay, c, p, req, last, n, xp=np)
        d = costs.handoff_time(mp, hp, lay, c, req, n, xp=np)
        K = len(c)
        f = np.zeros((K, n))
        for k in range(K):
            for s in range(n):
                prev_item = f[k - 1, s] if k else stage_free[s]
                prev_stage = f[k, s - 1] + d[k, s - 1] if s else start
                f[k, s] = max(prev_item, prev_stage) + t[k, s]
        if gpipe:
            comp[q:q + b] = f[:, -1]
        else:
            comp[q:q + b] = f[-1, -1]
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
    m, h = get_model(model), get_hardware(hw)
    n = h.num_dies
    k_pad = bucket(B) if gpipe else bucket(M)
    point = api._point(m, h, api._items("gpipe" if gpipe else "terapipe", S, B, part, 1, k_pad),
                       api.check_placement(h, None, n), bucket(n), "streaming", "stage", np.float64)
    pp = np.zeros(k_pad, np.int32)
    pp[:M] = part
    out = e2e_latency_jit(point, pp, S, B, jnp.asarray(arr), jnp.zeros((k_pad, bucket(n))),
                          ServingShape(k_pad=k_pad, n_pad=bucket(n), requests=R, gpipe=gpipe, synchronous=sync))
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


@pytest.mark.parametrize("kind,rate,fragment", [("poisson", 0.0, "positive request rate"),
                                                ("fixed", -1.0, "positive request rate"),
                                                ("gamma", 1.0, "unknown arrival process")])
def test_arrival_bad_input(kind, rate, fragment):
    with pytest.raises(ValueError, match=fragment):
        arrival_times(kind, rate, 10)
