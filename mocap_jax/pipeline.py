"""The §5 pipeline recurrence as a jit/vmap-friendly array program.

    finish[k, s] = max(finish[k-1, s], finish[k, s-1] + d[k, s-1], ready[k] if s == 0) + t[k, s]

Items ``k`` flow through stages ``s`` in a fixed order.  The kernels take per-item,
per-stage times with arbitrary leading batch axes, ``t[..., K, N]``.

Implementation: a *wavefront* scan.  Cell (k, s) depends only on (k-1, s) and
(k, s-1), so every cell on an anti-diagonal ``j = k + s`` can be updated at once.
The scan runs over the ``K + N - 1`` diagonals; each step is one fused elementwise
update of an ``[N, batch]`` array with the batch axes last (contiguous), which is
what lets two CPU cores evaluate about a million chunked pipelines a second.  A
scan over items with a Python loop over stages would be shorter to write but XLA
duplicates the stage chain into one fusion per stage (quadratic work).

Padding contract: a padded item or stage has ``t = 0`` and ``d = 0``.  A padded item
after the real ones repeats the previous row; a padded stage after the last real
one carries the running maximum, so ``finish[..., -1, -1]`` is always the finish of
the last real item on the last real stage.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax


def _skew(x):
    """``x[K, N, ...] -> out[K+N-1, N, ...]`` with ``out[j, s] = x[j - s, s]`` (0 outside)."""
    K, N = x.shape[:2]
    rest = x.shape[2:]
    L = K + N
    xs = jnp.swapaxes(x, 0, 1)
    xs = jnp.pad(xs, [(0, 0), (0, N)] + [(0, 0)] * len(rest))
    flat = xs.reshape((N * L,) + rest)[: N * (L - 1)]
    return jnp.swapaxes(flat.reshape((N, L - 1) + rest), 0, 1)


def _unskew(y, K):
    """Inverse of :func:`_skew`: ``y[K+N-1, N, ...] -> x[K, N, ...]`` with ``x[k, s] = y[k + s, s]``."""
    Lm1, N = y.shape[:2]
    rest = y.shape[2:]
    ys = jnp.swapaxes(y, 0, 1).reshape((N * Lm1,) + rest)
    ys = jnp.pad(ys, [(0, N)] + [(0, 0)] * len(rest))
    return jnp.swapaxes(ys.reshape((N, Lm1 + 1) + rest)[:, :K], 0, 1)


def _wavefront(t, handoff, ready, stage_free, keep_all: bool):
    """Shared scan.  Inputs already have item, stage axes first: ``t[K, N, *B]``."""
    K, N = t.shape[:2]
    batch = t.shape[2:]
    ts = _skew(t)
    ds = _skew(handoff)
    rs = jnp.concatenate([ready, jnp.zeros((N - 1,) + batch, t.dtype)], axis=0)
    f0 = jnp.zeros((N,) + batch, t.dtype) if stage_free is None else stage_free

    def step(carry, xs):
        f, g = carry                       # f: finish of the latest item per stage; g = f + its hand-off
        t_j, d_j, r_j = xs
        arrive = jnp.concatenate([r_j[None], g[:-1]], axis=0)
        f = jnp.maximum(f, arrive) + t_j
        g = f + d_j
        return (f, g), (f if keep_all else None)

    xs = (ts, ds, rs)
    (f, _), diag = lax.scan(step, (f0, f0), xs)
    return f, diag


def _front(x, tail: int):
    lead = x.ndim - tail
    return jnp.moveaxis(x, tuple(range(lead, x.ndim)), tuple(range(tail)))


def _batched_rule(fn):
    """A vmap rule that keeps the mapped axis a *leading batch axis* of ``fn``.

    ``fn`` already handles any number of leading batch axes (moving them last, where
    they are contiguous), so under ``vmap`` we broadcast the unbatched operands and
    call it again instead of letting JAX batch the inner scan (which would put the
    batch first inside the loop and run several times slower).
    """

    def rule(axis_size, in_batched, *args):
        args = [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape) for a, b in zip(args, in_batched)]
        return fn(*args), True

    return rule


@jax.custom_batching.custom_vmap
def _finish_core(t, handoff, ready, stage_free):
    tf, df, rf, sf, K = _front(t, 2), _front(handoff, 2), _front(ready, 1), _front(stage_free, 1), t.shape[-2]
    _, diag = _wavefront(tf, df, rf, sf, keep_all=True)
    return jnp.moveaxis(_unskew(diag, K), (0, 1), (-2, -1))


_finish_core.def_vmap(_batched_rule(_finish_core))


@jax.custom_batching.custom_vmap
def _latency_core(t, handoff, ready):
    f, _ = _wavefront(_front(t, 2), _front(handoff, 2), _front(ready, 1), None, keep_all=False)
    return f[-1]


_latency_core.def_vmap(_batched_rule(_latency_core))


def _prepare(t, handoff, ready, stage_free=None):
    t = jnp.asarray(t)
    if t.ndim < 2:
        raise ValueError(f"t must have shape [..., K, N] (items, stages), got shape {t.shape}")
    if not jnp.issubdtype(t.dtype, jnp.floating):
        t = t.astype(jnp.result_type(float))
    batch, (K, N) = t.shape[:-2], t.shape[-2:]
    zeros = lambda shp: jnp.zeros(shp, t.dtype)
    d = zeros(t.shape) if handoff is None else jnp.broadcast_to(jnp.asarray(handoff, t.dtype), t.shape)
    r = zeros(batch + (K,)) if ready is None else jnp.broadcast_to(jnp.asarray(ready, t.dtype), batch + (K,))
    f0 = zeros(batch + (N,)) if stage_free is None else jnp.broadcast_to(jnp.asarray(stage_free, t.dtype), batch + (N,))
    return t, d, r, f0


def finish_times(t, handoff: Optional[jax.Array] = None, ready: Optional[jax.Array] = None,
                 stage_free: Optional[jax.Array] = None):
    """Finish time of every item on every stage.

    Args:
      t: ``[..., K, N]`` seconds item k spends on stage s (0 for padding).
      handoff: optional ``[..., K, N]`` hand-off delay of item k from stage s to s+1
        in seconds (entry ``N-1`` is ignored).
      ready: optional ``[..., K]`` earliest time item k may start on stage 0.
      stage_free: optional ``[..., N]`` time each stage becomes free before item 0
        (``finish[-1, :]``), to chain consecutive batches.

    Returns:
      ``[..., K, N]`` finish times in seconds (start = finish - t).
    """
    return _finish_core(*_prepare(t, handoff, ready, stage_free))


def pipeline_latency(t, handoff: Optional[jax.Array] = None, ready: Optional[jax.Array] = None):
    """Finish time of the last item on the last stage (the §5 makespan), in seconds.

    Batched over leading axes (and under ``vmap``); only the running diagonal is
    kept, so memory is ``O(batch x N)`` beyond the inputs.

    Args:
      t: ``[..., K, N]`` per-item, per-stage times in seconds.
      handoff: optional ``[..., K, N]`` hand-off delays s -> s+1 in seconds.
      ready: optional ``[..., K]`` release times of items at stage 0.

    Returns:
      ``[...]`` seconds.

    Examples:
      Equal times ``t`` with no hand-off cost give ``(K + N - 1) * t``; times that are
      the same on every stage give ``sum(t) + (N - 1) * max(t)``.
    """
    t, d, r, _ = _prepare(t, handoff, ready)
    return _latency_core(t, d, r)


def finish_times_items_first(t, handoff):
    """:func:`finish_times` for inputs laid out ``t[K, N, *B]`` (batch axes last), no ready times.

    For kernels that keep many configurations on the trailing (contiguous) axes
    throughout, so no transposes are needed around the wavefront scan.  The loop
    carries only the buffer of diagonals and reads the previous one from it, so each
    step is one in-place update (the scan of :func:`_wavefront` carries two diagonals
    and stacks its outputs: twice the operations per step for XLA:CPU's loop runtime,
    5% of the annealing step); the arithmetic, and so every bit of the result, is the same.

    Returns:
      ``[K, N, *B]`` finish times in seconds (every stage free at time 0).
    """
    K, N = t.shape[:2]
    batch = t.shape[2:]
    zero = jnp.zeros((1, N) + batch, t.dtype)
    ds = jnp.concatenate([zero, _skew(handoff)], axis=0)         # row j: hand-offs of diagonal j-1
    no_arrival = jnp.zeros((1,) + batch, t.dtype)

    def step(j, diagonals):
        """Diagonal j into row j + 1, which holds its stage times until then (row 0: zeros, every
        stage free at time 0); read before written, so the buffer needs no separate input."""
        f = lax.dynamic_index_in_dim(diagonals, j, 0, keepdims=False)
        g = f + lax.dynamic_index_in_dim(ds, j, 0, keepdims=False)
        arrive = jnp.concatenate([no_arrival, g[:-1]], axis=0)
        new = jnp.maximum(f, arrive) + lax.dynamic_index_in_dim(diagonals, j + 1, 0, keepdims=False)
        return lax.dynamic_update_index_in_dim(diagonals, new, j + 1, 0)

    diagonals = lax.fori_loop(0, K + N - 1, step, jnp.concatenate([zero, _skew(t)], axis=0))
    return _unskew(diagonals[1:], K)
