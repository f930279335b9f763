"""The pipeline timing recurrence as one array program.

    finish[k, s] = max(finish[k-1, s], finish[k, s-1] + d[k, s-1], ready[k] if s == 0) + t[k, s]

with ``finish[-1, s] = stage_free[s]``: items ``k`` flow through stages ``s`` in a fixed order,
one item at a time per stage; a hand-off ``d`` is a pure delay.

The kernel is a *wavefront*: cell (k, s) depends only on (k-1, s) and (k, s-1), so every cell on
an anti-diagonal ``j = k + s`` is updated at once.  The loop runs over the ``K + N - 1``
diagonals; its state is the buffer of skewed diagonals, updated in place, with every batch axis
last (contiguous), which is what lets a CPU evaluate about a million chunked pipelines a second.
(A scan over items with a Python loop over stages is shorter to write, but XLA then duplicates
the stage chain into one fusion per stage.)  Under ``vmap`` a custom batching rule keeps the
mapped axis a trailing batch axis instead of letting JAX batch the loop from the front.

Padding contract: a padded item or stage has ``t = 0`` and ``d = 0``.  A padded item after the
real ones repeats the previous row; a padded stage after the last real one carries the running
maximum, so ``finish[..., -1, -1]`` is always the finish of the last real item on the last real
stage.

Closed forms the kernel reproduces (tested): equal times ``t`` with no hand-off cost give
``(K + N - 1) t``; per-item times identical on every stage give ``sum(t) + (N - 1) max(t)``.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
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
    """Inverse of :func:`_skew`: ``y[K+N-1, N, ...] -> x[K, N, ...]`` with ``x[k, s] = y[k + s, s]``
    (a gather of whole batch rows)."""
    N = y.shape[1]
    s = jnp.arange(N)[None, :]
    return y[jnp.arange(K)[:, None] + s, s]


def wavefront(t, handoff, ready=None, stage_free=None):
    """Finish times of items laid out items-first, every batch axis last.

    Args:
      t: ``[K, N, *B]`` seconds item k spends on stage s.
      handoff: ``[K, N, *B]`` hand-off delay of item k from stage s to s+1 (entry N-1 unused).
      ready: optional ``[K, *B]`` earliest start of item k on stage 0 (default 0).
      stage_free: optional ``[N, *B]`` time each stage becomes free before item 0 (default 0).

    Returns:
      ``[K, N, *B]`` finish times in seconds.
    """
    K, N = t.shape[:2]
    batch = t.shape[2:]
    dtype = t.dtype
    zero_row = jnp.zeros((1, N) + batch, dtype)
    ds = jnp.concatenate([zero_row, _skew(handoff)], axis=0)                  # row j: hand-offs of diagonal j-1
    rs = None if ready is None else jnp.concatenate([ready, jnp.zeros((N,) + batch, dtype)], axis=0)
    stage = jnp.arange(N).reshape((N,) + (1,) * len(batch))

    def step(j, diagonals):
        """Diagonal j into row j + 1, which holds its stage times until then (row 0 is the virtual
        diagonal of items before item 0); read before written, so no separate input is needed."""
        f = lax.dynamic_index_in_dim(diagonals, j, 0, keepdims=False)
        if stage_free is not None:                                              # f[-1, s] for item 0 of stage s
            f = jnp.where(stage == j, stage_free, f)
        g = f + lax.dynamic_index_in_dim(ds, j, 0, keepdims=False)
        first = jnp.zeros((1,) + batch, dtype) if rs is None else lax.dynamic_index_in_dim(rs, j, 0, keepdims=True)
        arrive = jnp.concatenate([first, g[:-1]], axis=0)
        new = jnp.maximum(f, arrive) + lax.dynamic_index_in_dim(diagonals, j + 1, 0, keepdims=False)
        return lax.dynamic_update_index_in_dim(diagonals, new, j + 1, 0)

    diagonals = lax.fori_loop(0, K + N - 1, step, jnp.concatenate([zero_row, _skew(t)], axis=0))
    return _unskew(diagonals[1:], K)


def _to_items_first(x, trailing: int):
    """Move the last ``trailing`` axes (items, stages / items / stages) to the front, materialised:
    XLA would otherwise fold the transpose into the loop, which then reads with a stride."""
    lead = x.ndim - trailing
    return jnp.moveaxis(x, tuple(range(lead, x.ndim)), tuple(range(trailing)))


@jax.custom_batching.custom_vmap
def _finish(t, handoff, ready, stage_free):
    out = wavefront(_to_items_first(t, 2), _to_items_first(handoff, 2), _to_items_first(ready, 1),
                    _to_items_first(stage_free, 1))
    return jnp.moveaxis(out, (0, 1), (-2, -1))


@_finish.def_vmap
def _finish_vmap(axis_size, in_batched, t, handoff, ready, stage_free):
    """Keep the mapped axis a leading batch axis of :func:`_finish` (which moves batch axes last)
    instead of letting JAX batch the loop from the front, which runs several times slower."""
    args = [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)
            for a, b in zip((t, handoff, ready, stage_free), in_batched)]
    return _finish(*args), True


def finish_times(t, handoff: Optional[jax.Array] = None, ready: Optional[jax.Array] = None,
                 stage_free: Optional[jax.Array] = None):
    """Finish time of every item on every stage.

    Args:
      t: ``[..., K, N]`` seconds item k spends on stage s (0 for padding).
      handoff: optional ``[..., K, N]`` hand-off delay of item k from stage s to s+1 in seconds
        (entry ``N-1`` is ignored).
      ready: optional ``[..., K]`` earliest time item k may start on stage 0.
      stage_free: optional ``[..., N]`` time each stage becomes free before item 0.

    Returns:
      ``[..., K, N]`` finish times in seconds (start = finish - t).

    Raises:
      ValueError: ``t`` not at least 2-D; an argument given as numbers (not traced) holding a NaN
        or infinite time, or a negative ``t`` or ``handoff``.
    """
    for name, x, durations in (("t", t, True), ("handoff", handoff, True), ("ready", ready, False),
                               ("stage_free", stage_free, False)):
        _check_concrete(name, x, durations)
    # given numbers, the recurrence runs as one compiled program (kept per shape and dtype): run
    # operation by operation, every step of the wavefront would be dispatched, and first compiled, alone
    traced = any(isinstance(x, jax.core.Tracer) for x in (t, handoff, ready, stage_free))
    t = jnp.asarray(t) if traced else np.asarray(t)
    if t.ndim < 2:
        raise ValueError(f"t must have shape [..., K, N] (items, stages), got shape {t.shape}")
    if not jnp.issubdtype(t.dtype, jnp.floating):
        t = t.astype(jnp.result_type(float))
    return (_filled_finish if traced else _filled_finish_compiled)(t, handoff, ready, stage_free)


def _filled_finish(t, handoff, ready, stage_free):
    """:func:`_finish` with the optional arguments filled in (zeros) and broadcast to their shapes."""
    batch, (K, N) = t.shape[:-2], t.shape[-2:]
    full = lambda x, shape: jnp.zeros(shape, t.dtype) if x is None else jnp.broadcast_to(jnp.asarray(x, t.dtype), shape)
    return _finish(t, full(handoff, t.shape), full(ready, batch + (K,)), full(stage_free, batch + (N,)))


_filled_finish_compiled = jax.jit(_filled_finish)


def _check_concrete(name: str, x, durations: bool) -> None:
    """Refuse a NaN or infinite time, or a negative duration, in an argument given as numbers: the
    recurrence would carry it into every later finish.  Traced arguments are the enclosing program's
    to check (the evaluator's costs are finite by construction)."""
    if x is None or isinstance(x, jax.core.Tracer):
        return
    a = np.asarray(x)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        return
    bad = ~np.isfinite(a) | (a < 0) if durations else ~np.isfinite(a)
    if np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must hold finite{', non-negative' if durations else ''} seconds; "
                         f"{name}{list(where) if where else ''} is {float(a[where]):g}")


def pipeline_latency(t, handoff: Optional[jax.Array] = None, ready: Optional[jax.Array] = None):
    """Finish of the last item on the last stage (the makespan), ``[..., K, N] -> [...]`` seconds.

    Examples:
      Equal times ``t`` with no hand-off cost give ``(K + N - 1) * t``; times that are the same on
      every stage give ``sum(t) + (N - 1) * max(t)``.
    """
    return finish_times(t, handoff, ready)[..., -1, -1]


def start_times(finish, handoff, ready=None, stage_free=None):
    """Start time of every item on every stage, ``[..., K, N]``, from the finish times: the same
    ``max(finish[k-1, s], finish[k, s-1] + d[k, s-1], ready[k] if s == 0)`` the recurrence takes, so
    a start equals the event that released it bit for bit (``finish - t`` may differ by a rounding,
    which would reorder an item's start against a release at the same instant)."""
    finish = jnp.asarray(finish)
    batch, (K, N) = finish.shape[:-2], finish.shape[-2:]
    zeros = lambda shape: jnp.zeros(shape, finish.dtype)
    free = zeros(batch + (1, N)) if stage_free is None else jnp.asarray(stage_free, finish.dtype)[..., None, :]
    prev_item = jnp.concatenate([jnp.broadcast_to(free, batch + (1, N)), finish[..., :-1, :]], axis=-2)
    first = zeros(batch + (K, 1)) if ready is None else jnp.asarray(ready, finish.dtype)[..., :, None]
    prev_stage = jnp.concatenate([jnp.broadcast_to(first, batch + (K, 1)),
                                  finish[..., :, :-1] + jnp.asarray(handoff, finish.dtype)[..., :, :-1]], axis=-1)
    return jnp.maximum(prev_item, prev_stage)
