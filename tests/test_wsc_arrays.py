"""Array primitives of the serving program against plain NumPy."""

import jax
import jax.numpy as jnp
import numpy as np

from mocap_jax.wsc import arrays


def test_first_true_and_select_from_match_numpy():
    rng = np.random.default_rng(3)
    n, k = 40, 8
    first = jax.jit(jax.vmap(lambda m: arrays.first_true(m, k, n)))
    density = rng.random((300, 1)) ** 3                             # from almost empty to full masks
    masks = rng.random((300, n)) < density
    masks[0] = False
    masks[1] = True
    want = np.stack([np.concatenate([np.flatnonzero(m)[:k], np.full(k, n)])[:k] for m in masks])
    assert np.array_equal(np.asarray(first(jnp.asarray(masks))), want)
    values = rng.normal(size=9).astype(np.float32)
    index = rng.integers(0, values.size, size=(30, 256))
    assert np.array_equal(np.asarray(jax.jit(arrays.select_from)(jnp.asarray(values), jnp.asarray(index))),
                          values[index])
