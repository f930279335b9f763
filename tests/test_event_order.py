"""The spill programs' event order, the prefix scans and counts in sorted sequences against NumPy oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.mbkr.spills import merge_ranks
from mocap_jax.schedule.prefix import FUSED_COUNT_MAX, count_sorted, prefix_max, prefix_sum


@pytest.mark.parametrize("seed", range(4))
def test_merge_ranks_is_the_stable_sort_by_value_list_and_index(seed):
    """Positions in the merged order equal a stable lexsort of (value, list, index), ties included
    (values drawn from a few levels, infinities as padding; one long list is counted by fused compares,
    the other by binary search)."""
    rng = np.random.default_rng(seed)
    lengths = [int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, FUSED_COUNT_MAX + 1)),
               int(rng.integers(FUSED_COUNT_MAX + 1, 3 * FUSED_COUNT_MAX))]
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
    summed = jax.jit(prefix_sum, static_argnames="axis")(jnp.asarray(x), axis=1)
    np.testing.assert_allclose(np.asarray(summed), np.cumsum(x, axis=1), rtol=1e-12)
    ints = rng.integers(-50, 50, (37, 4))
    np.testing.assert_array_equal(np.asarray(jax.jit(prefix_max)(jnp.asarray(ints))), np.maximum.accumulate(ints, axis=0))


@pytest.mark.parametrize("n", [1, 7, FUSED_COUNT_MAX, FUSED_COUNT_MAX + 1, 64, 100, 300, 32 * FUSED_COUNT_MAX + 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_count_sorted_is_searchsorted_on_both_sides_of_the_method_switch(n, dtype):
    """Every method (fused compares up to FUSED_COUNT_MAX elements, blocks of fused compares beyond,
    a binary search where the blocks would exceed FUSED_COUNT_MAX) counts like ``np.searchsorted``,
    with ties, queries outside the range, the dtype's largest value and infinite padding."""
    rng = np.random.default_rng(n)
    values = np.sort(rng.integers(-5, 6, n)).astype(dtype)
    queries = rng.integers(-7, 8, 50).astype(dtype)
    if dtype == np.float32:
        values[-max(n // 4, 1):] = np.inf
        queries[:3] = [np.inf, -np.inf, 0.5]
    else:
        top = np.iinfo(np.int32)
        values[-max(n // 4, 1):] = top.max
        queries[:2] = [top.max, top.min]
    count = jax.jit(count_sorted, static_argnames="side")
    for side in ("left", "right"):
        got = count(jnp.asarray(values), jnp.asarray(queries), side=side)
        assert got.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(got), np.searchsorted(values, queries, side=side))
        grid = count(jnp.asarray(values), jnp.asarray(queries.reshape(5, 10)), side=side)
        np.testing.assert_array_equal(np.asarray(grid), np.searchsorted(values, queries, side=side).reshape(5, 10))
