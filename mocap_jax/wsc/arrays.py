"""Array primitives of the serving program that stay cheap on CPU over a decode batch's slots.

The helpers here count or select instead of scattering or gathering; running counts over the
slots go in blocks (:func:`running_count`).
"""

from __future__ import annotations

import jax.numpy as jnp

#: entries per block of :func:`running_count`: the fastest of 8, 16 and 32 at the serving program's
#: shape (256 slots per decode batch), faster there than a log-depth associative scan or one
#: reduce-window over the slots (the measurements: docs/wsc_llm.md, "Performance")
COUNT_BLOCK = 16


def running_count(mask):
    """Inclusive running count of the True entries of a 1-D ``mask`` (``int32``; what ``jnp.cumsum``
    gives, exactly).

    Counted in blocks of :data:`COUNT_BLOCK`: a running sum inside every block (a reduce-window as
    long as the block, which XLA:CPU runs in one pass) plus the running sum of the blocks' totals.
    """
    n = mask.shape[0]
    pad = -n % COUNT_BLOCK
    x = jnp.concatenate([mask.astype(jnp.int32), jnp.zeros(pad, jnp.int32)]).reshape(-1, COUNT_BLOCK)
    inner = jnp.cumsum(x, axis=1)
    totals = inner[:, -1]
    return (inner + (jnp.cumsum(totals) - totals)[:, None]).reshape(-1)[:n]


def first_true(mask, k: int, fill: int):
    """Indices of the first ``k`` True entries of a 1-D ``mask`` (``fill`` where there are fewer).

    The ``j``-th True entry sits after the entries whose running count of Trues is at most ``j``;
    counting them (a ``[k, n]`` comparison) avoids a scatter of ``n`` indices.
    """
    n = mask.shape[0]
    count = running_count(mask)
    before = jnp.sum(count[None, :] <= jnp.arange(k, dtype=jnp.int32)[:, None], axis=1, dtype=jnp.int32)
    return jnp.where(before < n, before, fill).astype(jnp.int32)


def select_from(values, index):
    """``values[index]`` for a short 1-D ``values`` (static length) and any ``index`` array in range.

    A chain of selects, one per entry of ``values``: on CPU a gather of many indices from a
    few values costs far more.
    """
    out = jnp.broadcast_to(values[0], jnp.shape(index))
    for j in range(1, values.shape[0]):
        out = jnp.where(index == j, values[j], out)
    return out


def leading_true(mask):
    """How many entries of a 1-D ``mask`` are True before the first False."""
    if mask.shape[0] == 0:
        return jnp.zeros((), jnp.int32)
    return jnp.where(jnp.all(mask), mask.shape[0], jnp.argmin(mask)).astype(jnp.int32)


__all__ = ["COUNT_BLOCK", "running_count", "first_true", "select_from", "leading_true"]
