"""Array primitives of the serving program against plain NumPy."""

import jax
import jax.numpy as jnp
import numpy as np

from mocap_jax.wsc import arrays


def test_running_count_matches_numpy_cumsum_at_every_length():
    """Lengths below, at and past a block, multiples of it and not (the last block padded)."""
    rng = np.random.default_rng(5)
    for n in (1, 5, arrays.COUNT_BLOCK, arrays.COUNT_BLOCK + 1, 3 * arrays.COUNT_BLOCK - 2, 256):
        density = rng.random((50, 1))
        masks = rng.random((50, n)) < density
        masks[0], masks[1] = False, True
        got = np.asarray(jax.jit(jax.vmap(arrays.running_count))(jnp.asarray(masks)))
        assert got.dtype == np.int32
        assert np.array_equal(got, np.cumsum(masks, axis=1)), n


def test_first_true_and_select_from_match_numpy():
    rng = np.random.default_rng(3)
    for n, k in ((40, 8), (256, 8)):
        first = jax.jit(jax.vmap(lambda m: arrays.first_true(m, k, n)))
        density = rng.random((300, 1)) ** 3                         # from almost empty to full masks
        masks = rng.random((300, n)) < density
        masks[0] = False
        masks[1] = True
        want = np.stack([np.concatenate([np.flatnonzero(m)[:k], np.full(k, n)])[:k] for m in masks])
        assert np.array_equal(np.asarray(first(jnp.asarray(masks))), want)
    values = rng.normal(size=9).astype(np.float32)
    index = rng.integers(0, values.size, size=(30, 256))
    assert np.array_equal(np.asarray(jax.jit(arrays.select_from)(jnp.asarray(values), jnp.asarray(index))),
                          values[index])
