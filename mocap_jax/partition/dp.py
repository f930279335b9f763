"""LBCP's starting point and TeraPipe's slicing: exact dynamic programs over chunk boundaries.

A partition is M chunk sizes, each a positive multiple of a granularity g, summing to S; inside,
partitions are in units of g (``U = S / g``).

* :func:`chunk_cost_matrix` -- ``C[y, x]``, the bottleneck-stage seconds of a chunk covering
  units ``[y, x)`` after a prefix of ``y`` units, for every (y, x) at once;
* :func:`proxy_dp` -- the exact minimiser of TeraPipe's proxy ``sum_i t_i + (N - 1) max_i t_i``
  over partitions into M chunks: for a cap T on ``max t`` a DP over (chunks used, units covered)
  minimises ``sum t``; caps are evaluated as one vmapped batch at a time, in ascending order,
  until no larger cap can win (``dp(inf) + (N - 1) T >= best``);
* :func:`terapipe_dp` -- the same proxy with the chunk count free (TeraPipe's slicing of one
  request group; :mod:`mocap_jax.partition.terapipe` adds its batch splitting).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import costs
from ..costs import HardwareParams, ModelParams, StageLayout
from ..specs import SpecError


def check_granularity(seq_len: int, chunks: int | None, granularity: int) -> int:
    """Validate (S, M, g); return ``U = S / g``."""
    if isinstance(granularity, bool) or not isinstance(granularity, (int, np.integer)) or granularity <= 0:
        raise SpecError(f"granularity must be a positive integer number of tokens, got {granularity!r}")
    if seq_len % granularity:
        raise SpecError(f"granularity g={granularity} does not divide seq_len {seq_len}; choose g dividing S "
                         f"(e.g. {np.gcd(seq_len, 256)}) or a sequence length that is a multiple of g")
    U = seq_len // granularity
    if chunks is not None and chunks > U:
        raise SpecError(f"M={chunks} chunks of at least g={granularity} tokens need S >= {chunks * granularity}, "
                         f"but S={seq_len}; use fewer chunks or a smaller g")
    return U


def chunk_cost_matrix(model: ModelParams, hw: HardwareParams, layout: StageLayout, units: int, granularity,
                      batch, n_pad: int):
    """``C[y, x]``: bottleneck-stage seconds of a chunk covering units ``[y, x)``; ``inf`` where ``x <= y``.

    Shape ``[U + 1, U + 1]``.  The chunk ending at ``U`` carries the LM head.
    """
    dt = model.hidden.dtype
    y = jnp.arange(units + 1)[:, None]
    x = jnp.arange(units + 1)[None, :]
    c = ((x - y) * granularity).astype(dt)
    p = jnp.broadcast_to(y * granularity, c.shape).astype(dt)
    b = jnp.full(c.shape, batch, dt)
    last = jnp.broadcast_to(x == units, c.shape)
    t = costs.stage_times(model, hw, layout, jnp.maximum(c, 0), p, b, last, n_pad)
    C = jnp.max(t, axis=-1)
    return jnp.where(x > y, C, jnp.inf)


chunk_cost_matrix_jit = jax.jit(chunk_cost_matrix, static_argnums=(3, 6))
"""``chunk_cost_matrix`` compiled once per (U, N_pad); g and the batch are traced."""


def _dp_fixed(C, chunks: int, cap):
    """min sum t over partitions of [0, U] into ``chunks`` chunks with every t <= cap; and backpointers."""
    Cc = jnp.where(C <= cap, C, jnp.inf)
    U1 = C.shape[0]
    dp0 = jnp.full((U1,), jnp.inf, C.dtype).at[0].set(0.0)

    def step(dp, _):
        tot = dp[:, None] + Cc                      # [y, x]
        return jnp.min(tot, axis=0), jnp.argmin(tot, axis=0)

    dp, back = jax.lax.scan(step, dp0, None, length=chunks)
    return dp[-1], back


def free_slicing_dp(C, cap):
    """TeraPipe's slicing: min sum t over partitions of [0, U] into any number of chunks with every t <= cap.

    ``C [U + 1, U + 1]`` a cost table, ``cap`` scalar seconds.  Returns ``(min_sum, back[U + 1])``
    with ``back[x]`` the start of the last chunk of the best partition of ``[0, x)``.  The cap masks one
    column per step, so a vmap over caps (and tables) never holds a masked copy of the whole table.
    """
    U1 = C.shape[0]

    def step(dp, x):
        cand = dp + jnp.where(C[:, x] <= cap, C[:, x], jnp.inf)
        return dp.at[x].set(jnp.where(x == 0, 0.0, jnp.min(cand))), jnp.argmin(cand)

    dp, back = jax.lax.scan(step, jnp.full((U1,), jnp.inf, C.dtype), jnp.arange(U1))
    return dp[-1], back


_dp_fixed_caps = jax.jit(jax.vmap(_dp_fixed, in_axes=(None, None, 0)), static_argnums=1)
_dp_fixed_one = jax.jit(_dp_fixed, static_argnums=1)
_dp_free_caps = jax.jit(jax.vmap(free_slicing_dp, in_axes=(None, 0)))
_dp_free_one = jax.jit(free_slicing_dp)


class DPResult(NamedTuple):
    """Exact proxy optimum: ``partition`` (tokens), ``objective`` (s), ``cap`` (s), caps evaluated."""

    partition: np.ndarray
    objective: float
    cap: float
    caps_evaluated: int


def _search_caps(C: np.ndarray, solve_caps, num_stages: int, batch_caps: int):
    vals = np.unique(C[np.isfinite(C)])
    inf_sum = float(np.asarray(solve_caps(jnp.asarray(C), jnp.asarray([np.inf], C.dtype)))[0])
    if not np.isfinite(inf_sum):
        raise SpecError("no partition exists for these S, M and g")
    best, best_cap, evaluated = np.inf, np.inf, 0
    # skip caps too small to be feasible: bisection over the sorted candidates (vectorised rounds)
    lo, hi = 0, len(vals) - 1
    while hi - lo > batch_caps:
        probe = np.linspace(lo, hi, batch_caps).astype(int)
        ok = np.isfinite(np.asarray(solve_caps(jnp.asarray(C), jnp.asarray(vals[probe]))))
        evaluated += len(probe)
        first = int(np.argmax(ok)) if ok.any() else len(probe) - 1
        hi = probe[first]
        lo = probe[max(first - 1, 0)]
    i = lo
    while i < len(vals):
        if inf_sum + (num_stages - 1) * vals[i] >= best:
            break
        caps = vals[i: i + batch_caps]
        sums = np.asarray(solve_caps(jnp.asarray(C), jnp.asarray(caps)))
        evaluated += len(caps)
        obj = sums + (num_stages - 1) * caps
        j = int(np.argmin(obj))
        if obj[j] < best:
            best, best_cap = float(obj[j]), float(caps[j])
        i += batch_caps
    return best, best_cap, evaluated


def proxy_dp(C: np.ndarray, chunks: int, num_stages: int, granularity: int, batch_caps: int = 64) -> DPResult:
    """Exact minimiser of ``sum t + (N-1) max t`` over partitions into ``chunks`` chunks (multiples of g)."""
    C = np.asarray(C)
    U = C.shape[0] - 1
    best, cap, evaluated = _search_caps(C, lambda c, caps: _dp_fixed_caps(c, chunks, caps)[0], num_stages, batch_caps)
    _, back = _dp_fixed_one(jnp.asarray(C), chunks, jnp.asarray(cap, C.dtype))
    back = np.asarray(back)
    bounds = [U]
    for m in range(chunks - 1, -1, -1):
        bounds.append(int(back[m, bounds[-1]]))
    bounds = bounds[::-1]
    part = np.diff(bounds) * granularity
    return DPResult(part.astype(np.int64), best, cap, evaluated)


def terapipe_dp(C: np.ndarray, num_stages: int, granularity: int, batch_caps: int = 64) -> DPResult:
    """TeraPipe's partitioning: the proxy optimum over any number of chunks."""
    C = np.asarray(C)
    best, cap, evaluated = _search_caps(C, lambda c, caps: _dp_free_caps(c, caps)[0], num_stages, batch_caps)
    _, back = _dp_free_one(jnp.asarray(C), jnp.asarray(cap, C.dtype))
    return DPResult(slicing_from_back(np.asarray(back), granularity), best, cap, evaluated)


def slicing_from_back(back: np.ndarray, granularity: int) -> np.ndarray:
    """Chunk sizes (tokens, ``int64 [M]``) of the best partition of ``[0, U]`` from the backpointers
    ``back[U + 1]`` of :func:`free_slicing_dp`."""
    bounds = [back.shape[0] - 1]
    while bounds[-1] > 0:
        bounds.append(int(back[bounds[-1]]))
    return (np.diff(bounds[::-1]) * granularity).astype(np.int64)


def proxy_objective(C: np.ndarray, partition_units, num_stages: int) -> np.ndarray:
    """Proxy value of partitions given in units, ``[..., M] -> [...]`` (for checks and brute force)."""
    pu = np.asarray(partition_units)
    b = np.concatenate([np.zeros(pu.shape[:-1] + (1,), np.int64), np.cumsum(pu, -1)], -1)
    t = C[b[..., :-1], b[..., 1:]]
    return t.sum(-1) + (num_stages - 1) * t.max(-1)
