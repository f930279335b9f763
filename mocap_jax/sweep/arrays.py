"""Array helpers of the host-side planner and block builder (NumPy only)."""

from __future__ import annotations

import numpy as np


def unique_rows(cols: list[np.ndarray]):
    """Unique rows of the columns (lexicographic order) and the row index of every element.

    Each column is first reduced to dense codes, which are combined into one int64 key (mixed
    radix), so only 1-D sorts run (``np.unique(axis=0)`` is much slower).
    """
    n = len(cols[0])
    key = np.zeros(n, np.int64)
    uvals = []
    radix = 1
    for col in cols:
        u, inv = np.unique(np.asarray(col), return_inverse=True)
        uvals.append(u)
        radix *= max(len(u), 1)
        if radix >= 1 << 62:   # too many combinations for one key
            m = np.stack([np.asarray(c, np.float64) for c in cols], axis=1)
            uniq, inv = np.unique(m, axis=0, return_inverse=True)
            return uniq, inv.reshape(-1)
        key = key * max(len(u), 1) + inv.reshape(-1)
    ukey, inv = np.unique(key, return_inverse=True)
    rows = []
    rest = ukey
    for u in reversed(uvals):
        size = max(len(u), 1)
        rows.append(u[rest % size])
        rest = rest // size
    rows.reverse()
    if not n:
        return np.zeros((0, len(cols))), inv.reshape(-1)
    ints = all(np.issubdtype(r.dtype, np.integer) or r.dtype == bool for r in rows)
    uniq = np.stack([r.astype(np.int64 if ints else np.float64) for r in rows], axis=1)
    return uniq, inv.reshape(-1)


def power_of_two_bucket(x: np.ndarray, minimum: int = 4) -> np.ndarray:
    """Smallest power of two >= x (and >= minimum), elementwise."""
    x = np.maximum(np.asarray(x, np.int64), minimum)
    return (1 << np.ceil(np.log2(x)).astype(np.int64)).astype(np.int64)
