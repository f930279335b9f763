"""EvaluateE2E: end-to-end latency of requests under FCFS batching (one configuration, an array program).

Requests arrive at given times.  Whenever the pipeline can admit a batch -- stage 0 is free
(streaming) or the previous batch has left the last stage (synchronous) -- the scheduler takes up
to B waiting requests in arrival order (at least one: if none is waiting it waits for the next
arrival).  A chunked batch completes when its last chunk leaves the last stage; a GPipe request
when its microbatch does.  E2E latency = completion - arrival.

Each batch runs the same item builders, stage times and timing recurrence as
:func:`mocap_jax.prefill.evaluate.evaluate`, with the stages' free times carried from batch to
batch.  MBKR under load is approximated: a batch of b requests carries the MBKR extra time of a
full batch of B' requests scaled by ``(b - B_plain) / (B' - B_plain)`` clipped to [0, 1], where
``B_plain`` is the largest batch that fits without MBKR (a batch that fits without spilling spills
nothing).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..costs.computed_once import COMPILE_BOUND_OPTIONS
from ..prefill.evaluate import Point, Structure
from ..prefill.points import replace_items
from ..schedule.items import chunked_items, gpipe_items
from ..schedule.recurrence import finish_times
from ..schedule.shape import SimShape
from ..specs import SpecError


class ServingShape(NamedTuple):
    """Static structure of an E2E evaluation: the prefill bucket, the requests, GPipe or chunked."""

    prefill: SimShape
    requests: int
    gpipe: bool = False


def e2e_latency(point: Point, partition, seq_len, microbatch, batch_cap, arrivals, mbkr_extra, plain_cap,
                shape: ServingShape) -> dict:
    """End-to-end latency of ``requests`` arrivals under FCFS batching.

    Args:
      point: the configuration (its items are rebuilt for every admitted batch).
      partition: ``[K]`` chunk sizes (chunked schemes).
      seq_len, microbatch: GPipe requests' tokens and requests per microbatch.
      batch_cap: int B, most requests per batch.
      arrivals: ``[R]`` sorted arrival times (s).
      mbkr_extra: ``[K, N]`` MBKR extra seconds of a full batch (zeros without MBKR).
      plain_cap: int, the largest batch that fits without MBKR.

    Returns:
      dict: ``completion_s``, ``e2e_s`` ``[R]``, ``batch_sizes`` ``[R]`` (0 for unused slots),
      ``mean_s``, ``p50_s``, ``p99_s``, ``throughput_rps`` (completed / makespan).
    """
    R = shape.requests
    pre = shape.prefill
    K = pre.items
    dt = point.model.hidden.dtype
    idx = jnp.arange(R)
    B = jnp.asarray(batch_cap)
    span = jnp.maximum(B - plain_cap, 1).astype(dt)

    def one_batch(carry, _):
        q, stage_free, exit_prev, done = carry
        live = q < R
        first = arrivals[jnp.minimum(q, R - 1)]
        gate = exit_prev if pre.admission.value == "synchronous" else stage_free[0]
        start = jnp.maximum(gate, first)
        b = jnp.minimum(jnp.clip(jnp.sum((idx >= q) & (arrivals <= start)), 1, B), R - q)
        items = gpipe_items(seq_len, b, microbatch, K, xp=jnp) if shape.gpipe else chunked_items(partition, b)
        s = Structure(replace_items(point, items), pre._replace(batches=1))
        spill = jnp.clip((b - plain_cap).astype(dt) / span, 0.0, 1.0)
        f = finish_times(s.t + mbkr_extra * spill, s.d, jnp.full((K,), start, dt), stage_free)
        if shape.gpipe:
            finished = f[jnp.clip((idx - q) // microbatch, 0, K - 1), -1]
        else:
            finished = jnp.full((R,), f[-1, -1])
        mine = live & (idx >= q) & (idx < q + b)
        done = jnp.where(mine, finished, done)
        carry = (jnp.where(live, q + b, q).astype(jnp.int32), jnp.where(live, f[-1], stage_free),
                 jnp.where(live, f[-1, -1], exit_prev), done)
        return carry, jnp.where(live, b, 0).astype(jnp.int32)

    init = (jnp.zeros((), jnp.int32), jnp.zeros((pre.stages,), dt), jnp.zeros((), dt), jnp.zeros((R,), dt))
    (_, _, _, done), sizes = jax.lax.scan(one_batch, init, None, length=R)
    e2e = done - arrivals
    makespan = jnp.max(done) - jnp.min(arrivals)
    return dict(completion_s=done, e2e_s=e2e, batch_sizes=sizes, mean_s=jnp.mean(e2e),
                p50_s=jnp.percentile(e2e, 50), p99_s=jnp.percentile(e2e, 99), throughput_rps=R / makespan)


e2e_latency_jit = jax.jit(e2e_latency, static_argnames=("shape",), compiler_options=COMPILE_BOUND_OPTIONS)

#: End-to-end latency is computed on an absolute clock (arrival times), so its float spacing at
#: the last event must stay below this share of the median end-to-end latency, or the latencies
#: are rounding noise (at 1e-9 requests/s, float32 reports every latency as 0).  At this bound the
#: mean, median and p99 stay within about 3e-4 of float64; at 1e-3 they reach 1.4e-3 (measured:
#: ``sweeps/README.md``, "Why 1e-4").
E2E_CLOCK_RESOLUTION = 1e-4


def clock_resolved(last_arrival_s, e2e_mean_s, e2e_p50_s, e2e_p99_s, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Whether ``dtype`` resolves each evaluation's end-to-end latencies (:data:`E2E_CLOCK_RESOLUTION`).

    Arguments are ``[P]`` (or scalars) in seconds; where only the mean is known (the ``e2e`` objective of
    the chunk-size search), it stands for the median and the p99.  Returns ``(resolved [P] bool, spacing [P] s)``: the
    spacing of ``dtype`` at the last event (last arrival + p99 latency)."""
    last = np.abs(np.asarray(last_arrival_s, np.float64) + np.asarray(e2e_p99_s, np.float64))
    spacing = np.spacing(last.astype(dtype)).astype(np.float64)
    mean = np.asarray(e2e_mean_s, np.float64)
    return np.isfinite(mean) & (spacing <= E2E_CLOCK_RESOLUTION * np.asarray(e2e_p50_s, np.float64)), spacing


def check_clock(where: str, load_rps: float, requests: int, last_arrival_s: float, e2e_mean_s: float,
                e2e_p50_s: float, e2e_p99_s: float, dtype, float64_option: str) -> None:
    """Refuse one evaluation whose clock is too coarse (:func:`clock_resolved`), saying what to change;
    ``where`` names it in the message and ``float64_option`` says how the caller chooses float64."""
    resolved, spacing = clock_resolved(last_arrival_s, e2e_mean_s, e2e_p50_s, e2e_p99_s, dtype)
    if resolved:
        return
    dtype = np.dtype(dtype)
    fix = "raise the load or lower the requests" + (f", or use float64 ({float64_option})" if dtype != np.float64 else "")
    raise SpecError(f"{where}: load = {load_rps:g} requests/s with requests = {requests} spreads arrivals over "
                    f"{float(last_arrival_s):.4g} s, where {dtype} resolves time only to {float(spacing):.3g} s, too "
                    f"coarse for its end-to-end latencies ({float(e2e_p50_s):.4g} s as computed); {fix}")
