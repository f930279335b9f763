"""The spill programs' event order and the prefix scans against NumPy oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.mbkr.spills import merge_ranks
from mocap_jax.schedule.prefix import prefix_max, prefix_sum


@pytest.mark.parametrize("seed", range(4))
def test_merge_ranks_is_the_stable_sort_by_value_list_and_index(seed):
    """Positions in the merged order equal a stable lexsort of (value, list, index), ties included
    (values drawn from a few levels, infinities as padding)."""
    rng = np.random.default_rng(seed)
    lengths = [int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 40)), int(rng.integers(1, 40))]
    levels = np.array([0.0, 0.5, 1.0, 1.5, np.inf], np.float32)
    lists = [np.sort(rng.choice(levels, size=n)) for n in lengths]
    got = jax.jit(merge_ranks)([jnp.asarray(x) for x in lists])
    values = np.concatenate(lists)
    which = np.concatenate([np.full(n, q) for q, n in enumerate(lengths)])
    index = np.concatenate([np.arange(n) for n in lengths])
    order = np.lexsort((index, which, values))
    want = np.empty(len(values), np.int64)
    want[order] = np.arange(len(values))
    np.testing.assert_array_equal(np.concatenate([np.asarray(g) for g in got]), want)


def test_prefix_scans_match_numpy():
    rng = np.random.default_rng(1)
    x = rng.random((3, 37, 5))
    np.testing.assert_allclose(np.asarray(prefix_sum(jnp.asarray(x), axis=1)), np.cumsum(x, axis=1), rtol=1e-12)
    ints = rng.integers(-50, 50, (37, 4))
    np.testing.assert_array_equal(np.asarray(prefix_max(jnp.asarray(ints))), np.maximum.accumulate(ints, axis=0))
