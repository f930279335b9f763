"""Array primitives of the serving program that stay cheap on CPU over a decode batch's slots.

Prefix sums come from :mod:`mocap_jax.schedule.prefix` (an associative scan: ``jnp.cumsum``
lowers to a reduce-window whose cost grows with the square of the length, which over hundreds of
slots dominates a scan step); the helpers here count or select instead of scattering or gathering.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..schedule.prefix import prefix_sum


def first_true(mask, k: int, fill: int):
    """Indices of the first ``k`` True entries of a 1-D ``mask`` (``fill`` where there are fewer).

    The ``j``-th True entry sits after the entries whose running count of Trues is at most ``j``;
    counting them (a ``[k, n]`` comparison) avoids a scatter of ``n`` indices.
    """
    n = mask.shape[0]
    count = prefix_sum(mask.astype(jnp.int32))
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


__all__ = ["first_true", "select_from", "leading_true"]
