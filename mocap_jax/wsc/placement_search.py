"""Search over placements of rectangles on a grid: simulated annealing, all chains as one program.

:func:`search_placement` is the only entry point; the placement code calls it with the
TransferCost of a layout.  Its interface -- a cost over placements, start placements (one per
chain), the number of steps and a seed -- is all a replacement search needs to provide.

A placement of ``N`` rectangles is an int array ``[N, 3]``: top-left ``(row, col)`` and a
rotated flag (the rectangle is ``w x h`` instead of ``h x w``).  Moves: relocate one rectangle
(random position and orientation), shift one by a die, and *region swap* -- move a rectangle
onto a same-shaped target and every rectangle wholly inside the target into its old place (this
keeps a fully packed grid valid, e.g. a 1x2 rectangle trades places with two 1x1 ones).  Invalid
proposals (out of bounds, overlapping) are rejected before the cost is evaluated.  Temperatures
cool geometrically; every chain keeps its best placement, so no chain returns worse than its start.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import SpecError

Array = Any


def search_placement(cost: Callable, shared: Any, per_chain: Any, starts: np.ndarray, shapes: np.ndarray,
                     grid: tuple[int, int], steps: int, seed: int, temperatures: tuple[float, float] = (2.0, 0.01),
                     rotate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Minimise ``cost`` over placements by simulated annealing (``C`` chains at once).

    Args:
      cost: ``cost(positions [N, 3], heights [N], widths [N], shared, chain) -> scalar``, a
        module-level JAX function (it is a static argument of the compiled search);
        ``heights`` / ``widths`` are the oriented sizes.
      shared: pytree of arrays every chain's cost reads (e.g. the hop matrix).
      per_chain: pytree of arrays with a leading ``[C]`` axis (e.g. each chain's alpha).
      starts: ``[C, N, 3]`` int start placement of each chain (valid).
      shapes: ``[N, 2]`` int unrotated ``(h, w)`` of each rectangle.
      grid: ``(rows, cols)``.
      steps: proposals per chain.
      seed: PRNG seed (the same seed gives the same answer).
      temperatures: first and last temperature (cost units).
      rotate: allow rotations (relocations draw a random orientation).

    Returns:
      (best positions ``[C, N, 3]``, best costs ``[C]``), host arrays.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise SpecError(f"steps must be a positive integer, got {steps!r}")
    t_start, t_end = temperatures
    if not (t_start > 0 and t_end > 0):
        raise SpecError("annealing temperatures must be positive")
    starts = np.asarray(starts, np.int32)
    shapes = np.asarray(shapes, np.int32)
    temps = np.geomspace(t_start, t_end, steps)
    best, best_cost = _anneal(cost, shared, per_chain, jnp.asarray(starts), jax.random.PRNGKey(seed),
                              jnp.asarray(shapes[:, 0]), jnp.asarray(shapes[:, 1]), jnp.asarray(temps),
                              int(grid[0]), int(grid[1]), steps, int(bool(rotate)))
    return np.asarray(best), np.asarray(best_cost)


@partial(jax.jit, static_argnames=("cost", "rows", "cols", "steps", "rotate"))
def _anneal(cost, shared, per_chain, pos0, key, base_h, base_w, temps, rows, cols, steps, rotate):
    n = base_h.shape[0]
    rr = jnp.arange(rows)[:, None]
    cc = jnp.arange(cols)[None, :]

    def dims(pos):
        rot = pos[:, 2] > 0
        return jnp.where(rot, base_w, base_h), jnp.where(rot, base_h, base_w)

    def valid(pos):
        h, w = dims(pos)
        r, c = pos[:, 0], pos[:, 1]
        inb = jnp.all((r >= 0) & (c >= 0) & (r + h <= rows) & (c + w <= cols))
        m = ((rr[None] >= r[:, None, None]) & (rr[None] < (r + h)[:, None, None])
             & (cc[None] >= c[:, None, None]) & (cc[None] < (c + w)[:, None, None]))
        return inb & (jnp.max(jnp.sum(m, axis=0)) <= 1)

    def chain(p0, k, chain_args):
        evaluate = lambda pos: cost(pos, *dims(pos), shared, chain_args)
        c0 = evaluate(p0)

        def step(carry, inp):
            pos, c, best_pos, best_c = carry
            k, temp = inp
            ks = jax.random.split(k, 7)
            i = jax.random.randint(ks[0], (), 0, n)
            j = jax.random.randint(ks[1], (), 0, n)
            move = jax.random.randint(ks[2], (), 0, 3)
            rel = jnp.stack([jax.random.randint(ks[3], (), 0, rows), jax.random.randint(ks[4], (), 0, cols),
                             jax.random.randint(ks[5], (), 0, 2) * rotate]).astype(pos.dtype)
            d = jax.random.randint(ks[6], (), 0, 4)
            shift = jnp.array([[-1, 0, 0], [1, 0, 0], [0, -1, 0], [0, 1, 0]], dtype=pos.dtype)[d]
            pi, pj = pos[i], pos[j]
            relocated = pos.at[i].set(rel)
            shifted = pos.at[i].add(shift)
            # region swap: rectangle i moves to a target of its own (oriented) shape, and every
            # rectangle lying wholly inside the target moves by the opposite offset into i's old place
            h, w = dims(pos)
            use_j = jax.random.bernoulli(jax.random.fold_in(k, 2))
            tr = jnp.where(use_j, pj[0], rel[0])
            tc = jnp.where(use_j, pj[1], rel[1])
            inside = ((pos[:, 0] >= tr) & (pos[:, 0] + h <= tr + h[i]) & (pos[:, 1] >= tc)
                      & (pos[:, 1] + w <= tc + w[i]) & (jnp.arange(n) != i))
            offset = jnp.stack([pi[0] - tr, pi[1] - tc, jnp.zeros((), pos.dtype)])
            swapped = jnp.where(inside[:, None], pos + offset, pos).at[i, :2].set(jnp.stack([tr, tc]))
            prop = jnp.where(move == 0, relocated, jnp.where(move == 1, shifted, swapped))
            ok = valid(prop)
            cp = jnp.where(ok, evaluate(prop), jnp.inf)
            u = jax.random.uniform(jax.random.fold_in(k, 1))
            accept = ok & ((cp <= c) | (u < jnp.exp(-(cp - c) / temp)))
            pos = jnp.where(accept, prop, pos)
            c = jnp.where(accept, cp, c)
            better = c < best_c
            return (pos, c, jnp.where(better, pos, best_pos), jnp.where(better, c, best_c)), None

        keys = jax.random.split(k, steps)
        (_, _, best_pos, best_c), _ = jax.lax.scan(step, (p0, c0, p0, c0), (keys, temps))
        return best_pos, best_c

    return jax.vmap(chain)(pos0, jax.random.split(key, pos0.shape[0]), per_chain)


__all__ = ["search_placement"]
