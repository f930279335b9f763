"""Prefix sums and running maxima along an axis, and counts in sorted sequences, in the forms XLA:CPU runs fastest.

``jnp.cumsum`` and ``lax.cummax`` lower to a ``reduce_window`` as long as the axis on CPU, so
their cost grows with the square of the length: over the 32-64 items of a timeline that made
the KV prefix sums a quarter of a plain evaluation.  An associative scan does the same in
``log2(n)`` rounds (measured on ``[256, 32, 16]``: 0.24 ms against 0.75 ms).  A running maximum
is exact either way; a prefix sum adds in a different order, so it equals ``jnp.cumsum`` to
rounding.

Counting the elements of a sorted sequence at or below each query (:func:`count_sorted`) is a sum
of compares while the sequence is short: XLA:CPU fuses a sum of at most 32 compares into one loop
but splits a longer one into a ``reduce_window`` over a materialised ``[queries, n]`` mask.  A
longer sequence is cut into at most 32 blocks: a fused sum of compares with the blocks' last
elements finds the block holding the boundary, one gather fetches that block's row, and a fused
sum of compares counts inside it.  XLA:CPU pays per gathered index, so one gather of a row beats
the ``log2(n)`` gathers of a binary search: 64 sorted values, 64 queries, 1,024 rows under
``vmap`` took 0.29-0.35 ms against 1.30-1.39 ms for ``jnp.searchsorted(method="scan")``.  Short
sequences keep the plain compares (32 values: 0.18 against 0.24 ms blocked).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: longest sorted sequence counted by one fused sum of compares (and most blocks of a longer one)
FUSED_COUNT_MAX = 32
#: fewest elements per block of a longer sequence: at 64 values blocks of 8 and of 4 ran within a few
#: per cent of each other (a full MBKR evaluation of 64 items: 281-297 against 278-282 us per
#: configuration), blocks of 16 about 40% slower (the counts alone: 0.36-0.46 against 0.26-0.27 ms)
BLOCK_MIN = 8


def prefix_sum(x, axis: int = 0):
    """Inclusive prefix sum along ``axis`` (what ``jnp.cumsum`` computes)."""
    return jax.lax.associative_scan(jnp.add, x, axis=axis)


def prefix_max(x, axis: int = 0):
    """Running maximum along ``axis`` (what ``lax.cummax`` computes)."""
    return jax.lax.associative_scan(jnp.maximum, x, axis=axis)


def count_sorted(values, queries, side: str = "right"):
    """Elements of the nondecreasing ``values [n]`` that are ``<=`` (``side="right"``) or ``<``
    (``side="left"``) each of ``queries`` (any shape); what ``jnp.searchsorted`` returns, ``int32``.
    Neither holds NaN.

    The method is chosen by the static length ``n`` (see the module docstring); every method gives
    the same integers.
    """
    n = values.shape[0]
    if n <= FUSED_COUNT_MAX:
        return jnp.searchsorted(values, queries, side=side, method="compare_all").astype(jnp.int32)
    width = max(BLOCK_MIN, -(-n // FUSED_COUNT_MAX))          # elements per block
    if width > FUSED_COUNT_MAX:
        return jnp.searchsorted(values, queries, side=side, method="scan").astype(jnp.int32)
    blocks = -(-n // width)
    # padding with the largest value keeps every row sorted; where it meets a query it counts (side
    # "right" at the largest query), and the count is clipped to n, which also covers a query past
    # every block (its clamped row adds to a count already at least n)
    top = jnp.inf if jnp.issubdtype(values.dtype, jnp.floating) else jnp.iinfo(values.dtype).max
    rows = jnp.concatenate([values, jnp.full((blocks * width - n,), top, values.dtype)]).reshape(blocks, width)
    below = (lambda v, q: v <= q) if side == "right" else (lambda v, q: v < q)
    q = queries[..., None]
    full = jnp.sum(below(rows[:, -1], q), axis=-1, dtype=jnp.int32)          # whole blocks counted
    inside = jnp.sum(below(rows[jnp.minimum(full, blocks - 1)], q), axis=-1, dtype=jnp.int32)
    return jnp.minimum(full * width + inside, n)
