"""Serving model (DESIGN §8): arrivals, FCFS batching, end-to-end latency (EvaluateE2E).

Requests arrive (Poisson, fixed interval, offline, or a trace).  Whenever the
pipeline can admit a new batch -- stage 0 is free (streaming) or the previous batch
has left the last stage (synchronous) -- the scheduler takes up to ``B`` waiting
requests in arrival order (at least one: if none is waiting it waits for the next
arrival).  A chunked batch completes when its last chunk leaves the last stage; a
GPipe microbatch (one request) completes when it leaves the last stage.

``e2e_latency`` is a single-configuration array program (a scan over batch slots,
each running the §5 recurrence with the stage availability carried over), so it
is jit-compiled once per shape and vmapped over configurations.

MBKR costs under load: the extra item times of a full batch (from the prefill
evaluation at batch ``B``) are scaled by ``b / B`` for a batch of ``b`` requests --
an approximation documented in the README's assumptions table.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import costs
from .pipeline import finish_times
from .schedule import Point, chunked_items, gpipe_items

ARRIVALS = ("poisson", "fixed", "offline", "trace")


def arrival_times(kind: str, rate: float | None, count: int, seed: int = 0, trace=None) -> np.ndarray:
    """``[count]`` sorted arrival times in seconds.

    Args:
      kind: ``poisson`` (rate ``rate`` /s), ``fixed`` (every ``1/rate`` s), ``offline`` (all at 0)
        or ``trace`` (the first ``count`` times of ``trace``, shifted to start at 0 and, if
        ``rate`` is given, rescaled to that mean rate).
    """
    if kind not in ARRIVALS:
        raise ValueError(f"unknown arrival process {kind!r}; choose one of {', '.join(ARRIVALS)}")
    if count <= 0:
        raise ValueError(f"need a positive number of requests, got {count}")
    if kind in ("poisson", "fixed") and (rate is None or not rate > 0):
        raise ValueError(f"load must be a positive request rate (requests/s), got {rate!r}")
    if kind == "offline":
        return np.zeros(count)
    if kind == "fixed":
        return np.arange(count) / rate
    if kind == "poisson":
        rng = np.random.default_rng(seed)
        return np.cumsum(rng.exponential(1.0 / rate, count)) - 0.0
    t = np.sort(np.asarray(trace, dtype=np.float64))[:count]
    if len(t) < count:
        raise ValueError(f"the trace has {len(t)} requests, fewer than the {count} asked for")
    t = t - t[0]
    if rate is not None:
        span = t[-1] if t[-1] > 0 else 1.0
        t = t * ((count - 1) / span) / rate
    return t


class ServingShape(NamedTuple):
    """Static structure of an E2E evaluation."""

    k_pad: int
    n_pad: int
    requests: int
    gpipe: bool = False
    synchronous: bool = False


def e2e_latency(point: Point, partition, seq_len, batch_cap, arrivals, mbkr_extra, shape: ServingShape) -> dict:
    """End-to-end latency of ``requests`` arrivals under FCFS batching (one configuration).

    Args:
      point: the configuration (its ``items`` are ignored; batches are built per admission).
      partition: ``[K_pad]`` chunk sizes (chunked schemes).
      seq_len: scalar S (GPipe items).
      batch_cap: scalar int B, most requests per batch.
      arrivals: ``[R]`` sorted arrival times (s).
      mbkr_extra: ``[K_pad, N_pad]`` MBKR extra seconds of a full batch (zeros without MBKR).

    Returns:
      dict: ``completion_s`` [R], ``e2e_s`` [R], ``batch_sizes`` [R] (0 for unused slots),
      ``mean_s``, ``p50_s``, ``p99_s``, ``throughput_rps`` (completed / makespan).
    """
    R, n_pad, k_pad = shape.requests, shape.n_pad, shape.k_pad
    dt = point.model.hidden.dtype
    idx = jnp.arange(R)
    B = jnp.asarray(batch_cap)

    def one_batch(carry, _):
        q, stage_free, exit_prev, comp = carry
        live = q < R
        first = arrivals[jnp.minimum(q, R - 1)]
        gate = exit_prev if shape.synchronous else stage_free[0]
        start = jnp.maximum(gate, first)
        waiting = jnp.sum((idx >= q) & (arrivals <= start))
        b = jnp.clip(waiting, 1, B)
        b = jnp.minimum(b, R - q)
        items = gpipe_items(seq_len, b, 1, k_pad) if shape.gpipe else chunked_items(partition, b)
        c, p, bb = (x.astype(dt) for x in (items.tokens, items.prefix, items.requests))
        t = costs.stage_times(point.model, point.hardware, point.layout, c, p, bb, items.last, n_pad)
        t = t + mbkr_extra * (b.astype(dt) / B.astype(dt))
        d = costs.handoff_time(point.model, point.hardware, point.layout, c, bb, n_pad)
        t = jnp.where(items.valid[:, None], t, 0.0)
        d = jnp.where(items.valid[:, None], d, 0.0)
        f = finish_times(t, d, jnp.full((k_pad,), start, dt), stage_free)
        if shape.gpipe:   # request q + k completes when microbatch k leaves the last stage
            done = f[jnp.clip(idx - q, 0, k_pad - 1), -1]
        else:
            done = jnp.full((R,), f[-1, -1])
        mine = live & (idx >= q) & (idx < q + b)
        comp = jnp.where(mine, done, comp)
        new = (jnp.where(live, q + b, q).astype(jnp.int32), jnp.where(live, f[-1], stage_free),
               jnp.where(live, f[-1, -1], exit_prev), comp)
        return new, jnp.where(live, b, 0).astype(jnp.int32)

    init = (jnp.zeros((), jnp.int32), jnp.zeros((n_pad,), dt), jnp.zeros((), dt), jnp.zeros((R,), dt))
    (_, _, _, comp), sizes = jax.lax.scan(one_batch, init, None, length=R)
    e2e = comp - arrivals
    makespan = jnp.max(comp) - jnp.min(arrivals)
    return dict(completion_s=comp, e2e_s=e2e, batch_sizes=sizes, mean_s=jnp.mean(e2e),
                p50_s=jnp.percentile(e2e, 50), p99_s=jnp.percentile(e2e, 99), throughput_rps=R / makespan)


e2e_latency_jit = jax.jit(e2e_latency, static_argnames=("shape",))
