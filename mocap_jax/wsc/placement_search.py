"""TransferCost as arrays, and instance placement as a problem of the package's annealer.

:func:`transfer_cost_arrays` is the TransferCost of centre dies (numpy or jax.numpy).
:class:`LayoutProblem` is WSC placement for :func:`mocap_jax.search.anneal.anneal`: a chain's
state is a placement of ``N`` rectangles flattened from ``[N, 3]`` -- per instance the top-left
``(row, col)`` and a rotated flag (the rectangle is ``w x h`` instead of ``h x w``) -- into a
``[3 N]`` int vector.  Moves: relocate one rectangle (random position and orientation), shift one
by a die, and *region swap* -- move a rectangle onto a same-shaped target and every rectangle
wholly inside the target into its old place (this keeps a fully packed grid valid, e.g. a 1x2
rectangle trades places with two 1x1 ones).  A proposal that leaves the grid or overlaps is
invalid (the annealer rejects it).  The objective is the TransferCost of the proposal at its
chain's alpha: the alphas are a table in the context and each chain's auxiliary state is its
row of that table, which the objective returns unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..costs import pytree
from ..search.anneal import randint

Array = Any
#: shifts of one die: up, down, left, right (row, col, rotated)
SHIFTS = ((-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0))


def transfer_cost_arrays(prefill_dies, decode_dies, hops, incidence, alpha, xp=jnp):
    """TransferCost from centre dies (the array core, numpy or jax.numpy).

    Args:
      prefill_dies: ``[P]`` centre die of each prefill instance.
      decode_dies: ``[Q]`` centre die of each decode instance (Q >= 1).
      hops: ``[D, D]`` hop matrix.
      incidence: ``[D, D, L]`` XY-route link incidence (:func:`~mocap_jax.wsc.geometry.route_incidence`).
      alpha: shared-link factor (>= 1).

    Returns:
      (cost, link uses ``[L]``, nearest decode index ``[P]``).
    """
    dist = hops[prefill_dies][:, decode_dies]
    nearest = xp.argmin(dist, axis=1)
    routes = incidence[prefill_dies, decode_dies[nearest]]
    use = xp.sum(routes.astype(xp.float64 if xp is np else jnp.result_type(float)), axis=0)
    cost = xp.sum(xp.where(use > 0, use * xp.power(alpha, xp.maximum(use - 1, 0)), 0.0))
    return cost, use, nearest


@pytree
class LayoutContext:
    """Numbers of a placement search.

    Fields:
      hops: ``[D, D]`` int hop matrix of the wafer.
      incidence: ``[D, D, L]`` uint8 XY-route link incidence.
      alpha: ``[A]`` float32 shared-link factors; chain c anneals at ``alpha[aux_c]``.
    """

    hops: Array
    incidence: Array
    alpha: Array


@dataclass(frozen=True)
class LayoutProblem:
    """Annealing over placements of rectangles on a ``rows x cols`` grid (hashable).

    Attributes:
      heights, widths: unrotated size in dies of each of the ``N`` instances.
      prefill: whether each instance is a prefill instance (else decode).
      rows, cols: the grid.
    """

    heights: tuple[int, ...]
    widths: tuple[int, ...]
    prefill: tuple[bool, ...]
    rows: int
    cols: int

    def initial_aux(self, ctx: LayoutContext, chains: int):
        """Alpha row of each chain: the chains in ``len(alpha)`` equal consecutive groups."""
        groups = np.asarray(ctx.alpha).shape[0]
        return jnp.asarray(np.arange(chains) * groups // chains, jnp.int32)

    def oriented(self, pos):
        """``(heights [N], widths [N])`` of placement ``pos [N, 3]`` with its rotations applied."""
        rotated = pos[:, 2] > 0
        h, w = jnp.asarray(self.heights, jnp.int32), jnp.asarray(self.widths, jnp.int32)
        return jnp.where(rotated, w, h), jnp.where(rotated, h, w)

    def valid(self, pos):
        """Whether every rectangle of ``pos [N, 3]`` lies on the grid and none overlap."""
        h, w = self.oriented(pos)
        r, c = pos[:, 0], pos[:, 1]
        inside = jnp.all((r >= 0) & (c >= 0) & (r + h <= self.rows) & (c + w <= self.cols))
        grid_r = jnp.arange(self.rows)[None, :, None]
        grid_c = jnp.arange(self.cols)[None, None, :]
        cover = ((grid_r >= r[:, None, None]) & (grid_r < (r + h)[:, None, None])
                 & (grid_c >= c[:, None, None]) & (grid_c < (c + w)[:, None, None]))   # [N, rows, cols]
        return inside & (jnp.max(jnp.sum(cover, axis=0)) <= 1)

    def propose(self, words, x, ctx: LayoutContext):
        """One relocate, shift or region-swap move (a third each) of the placement ``x [3 N]``.

        Word 0 picks the instance moved, word 1 the instance whose position a region swap may
        target, word 2 a random position (its top and bottom 16 bits: row, column), word 3 the
        move (bits 8 and up), shift direction (bits 0-1), orientation (bit 2) and whether the
        region swap targets an instance's position or the random one (bit 3)."""
        n = len(self.heights)
        pos = x.reshape(n, 3)
        i, j = randint(words[0], 0, n), randint(words[1], 0, n)
        spot = jnp.stack([randint(words[2] >> 16, 0, self.rows), randint(words[2] & 0xFFFF, 0, self.cols),
                          ((words[3] >> 2) & 1).astype(jnp.int32)])
        move = randint(words[3] >> 8, 0, 3)
        relocated = pos.at[i].set(spot)
        shifted = pos.at[i].add(jnp.asarray(SHIFTS, jnp.int32)[(words[3] & 3).astype(jnp.int32)])
        h, w = self.oriented(pos)
        onto_instance = ((words[3] >> 3) & 1) == 1
        top = jnp.where(onto_instance, pos[j, 0], spot[0])
        left = jnp.where(onto_instance, pos[j, 1], spot[1])
        within = ((pos[:, 0] >= top) & (pos[:, 0] + h <= top + h[i]) & (pos[:, 1] >= left)
                  & (pos[:, 1] + w <= left + w[i]) & (jnp.arange(n) != i))
        offset = jnp.stack([pos[i, 0] - top, pos[i, 1] - left, jnp.zeros((), jnp.int32)])
        swapped = jnp.where(within[:, None], pos + offset, pos).at[i, :2].set(jnp.stack([top, left]))
        proposal = jnp.where(move == 0, relocated, jnp.where(move == 1, shifted, swapped))
        return proposal.reshape(-1), self.valid(proposal)

    def centre_dies(self, pos):
        """``[N]`` centre die of each rectangle (clipped onto the grid, so invalid placements evaluate)."""
        h, w = self.oriented(pos)
        row = jnp.clip(pos[:, 0] + (h - 1) // 2, 0, self.rows - 1)
        return row * self.cols + jnp.clip(pos[:, 1] + (w - 1) // 2, 0, self.cols - 1)

    def evaluate(self, xs, ctx: LayoutContext, aux):
        """``(TransferCost [C] float32, aux)`` of placements ``xs [C, 3 N]`` at their chains' alphas."""
        prefill = np.flatnonzero(self.prefill)
        decode = np.flatnonzero(~np.asarray(self.prefill))

        def one(x, alpha):
            die = self.centre_dies(x.reshape(-1, 3))
            return transfer_cost_arrays(die[prefill], die[decode], ctx.hops, ctx.incidence, alpha)[0]

        return jax.vmap(one)(xs, ctx.alpha[aux]).astype(jnp.float32), aux


__all__ = ["transfer_cost_arrays", "LayoutContext", "LayoutProblem"]
