"""Prefix sums and running maxima along an axis, as log-depth associative scans.

``jnp.cumsum`` and ``lax.cummax`` lower to a ``reduce_window`` as long as the axis on CPU, so
their cost grows with the square of the length: over the 32-64 items of a timeline that made
the KV prefix sums a quarter of a plain evaluation.  An associative scan does the same in
``log2(n)`` rounds (measured on ``[256, 32, 16]``: 0.24 ms against 0.75 ms).  A running maximum
is exact either way; a prefix sum adds in a different order, so it equals ``jnp.cumsum`` to
rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def prefix_sum(x, axis: int = 0):
    """Inclusive prefix sum along ``axis`` (what ``jnp.cumsum`` computes)."""
    return jax.lax.associative_scan(jnp.add, x, axis=axis)


def prefix_max(x, axis: int = 0):
    """Running maximum along ``axis`` (what ``lax.cummax`` computes)."""
    return jax.lax.associative_scan(jnp.maximum, x, axis=axis)
