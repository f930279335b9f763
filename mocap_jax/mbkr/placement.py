"""Stage-to-die placement for MBKR (DESIGN §2, §6).

A placement maps pipeline stage s to die ``placement[s]``.  Its cost is the
traffic-weighted route length of the transfers it creates under XY routing:

    cost = handoff_weight * sum_s hop_cost(s, s+1) + pair_weight * sum_pairs hop_cost(s, partner[s])

where ``hop_cost`` counts hops in units of a standard D2D link (a cross-wafer link
slower than the D2D links counts ``link_bandwidth / cross_wafer_bandwidth`` hops).
No stage order puts every consecutive pair and every cross-half pair on
neighbouring dies when N/2 is even (checkerboard argument, §2), so the map is
searched: exhaustively on meshes of up to 8 dies, otherwise by simulated annealing
over permutations, many chains at once as one vectorised program.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import mesh
from .pairing import STATIC_PAIRING_CODE, partner_of
from ..specs import HardwareSpec

EXHAUSTIVE_MAX_DIES = 8


def hop_cost_matrix(hw: HardwareSpec) -> np.ndarray:
    """``[D, D]`` route length between dies in standard-link units (hops on a uniform mesh)."""
    D = hw.num_dies
    C = np.zeros((D, D))
    for a in range(D):
        for b in range(D):
            C[a, b] = sum(hw.link_bandwidth / mesh.link_bandwidth(hw, l) for l in mesh.xy_route(hw, a, b))
    return C


def _pairs(pairing: str, n: int) -> np.ndarray:
    partner = partner_of(STATIC_PAIRING_CODE.get(pairing, 0), n, n, xp=np)
    return np.array([(s, int(q)) for s, q in enumerate(partner) if q > s], dtype=np.int64).reshape(-1, 2)


@dataclass
class PlacementReport:
    """A placement and what it costs.  Hops are plain hop counts; ``cost`` is weighted."""

    placement: np.ndarray
    cost: float
    pipeline_hops: int
    pair_hops: int
    max_pipeline_hops: int
    max_pair_hops: int
    max_link_share: int
    method: str

    def to_dict(self) -> dict:
        return {"placement": self.placement.tolist(), "cost": self.cost, "pipeline_hops": self.pipeline_hops,
                "pair_hops": self.pair_hops, "max_pipeline_hops": self.max_pipeline_hops,
                "max_pair_hops": self.max_pair_hops, "max_link_share": self.max_link_share, "method": self.method}


def evaluate_placement(hw: HardwareSpec, placement, pairing: str = "cross-half", handoff_weight: float = 1.0,
                       pair_weight: float = 1.0, method: str = "given") -> PlacementReport:
    """Hop counts, weighted cost and the worst link sharing of one placement."""
    pl = np.asarray(placement, dtype=np.int64)
    n = len(pl)
    H = mesh.hop_matrix(hw)
    C = hop_cost_matrix(hw)
    pairs = _pairs(pairing, n)
    pipe = [int(H[pl[s], pl[s + 1]]) for s in range(n - 1)]
    pair = [int(H[pl[a], pl[b]]) for a, b in pairs]
    cost = handoff_weight * sum(C[pl[s], pl[s + 1]] for s in range(n - 1)) + \
        pair_weight * sum(C[pl[a], pl[b]] for a, b in pairs)
    routes = [(pl[s], pl[s + 1]) for s in range(n - 1)] + [(pl[a], pl[b]) for a, b in pairs] + \
        [(pl[b], pl[a]) for a, b in pairs]
    loads = mesh.link_loads(hw, routes)
    return PlacementReport(pl, float(cost), sum(pipe), sum(pair), max(pipe, default=0), max(pair, default=0),
                           int(max(loads.values(), default=0)), method)


def _cost_fn(C: jnp.ndarray, pairs, n: int, handoff_weight, pair_weight):
    """``perm -> cost`` for ``perm[D]`` (die of each slot; stages are the first ``n`` slots); ``pairs``
    an ``[P, 2]`` array of paired stages (static or traced)."""
    a_idx, b_idx = jnp.asarray(pairs[:, 0]), jnp.asarray(pairs[:, 1])

    def cost(perm):
        pl = perm[:n]
        pipe = jnp.sum(C[pl[:-1], pl[1:]])
        pair = jnp.sum(C[pl[a_idx], pl[b_idx]]) if len(pairs) else 0.0
        return handoff_weight * pipe + pair_weight * pair

    return cost


def exhaustive_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                         handoff_weight: float = 1.0, pair_weight: float = 1.0) -> PlacementReport:
    """Best placement over every ordered choice of dies (meshes of at most 8 dies)."""
    D = hw.num_dies
    n = D if num_stages is None else num_stages
    if D > EXHAUSTIVE_MAX_DIES:
        raise ValueError(f"exhaustive placement enumerates {D}! maps; use it on meshes of <= {EXHAUSTIVE_MAX_DIES} dies")
    perms = np.array(list(itertools.permutations(range(D), n)), dtype=np.int64)
    C = jnp.asarray(hop_cost_matrix(hw))
    costs = np.asarray(jax.jit(jax.vmap(_cost_fn(C, _pairs(pairing, n), n, handoff_weight, pair_weight)))(perms))
    best = perms[int(np.argmin(costs))]
    return evaluate_placement(hw, best, pairing, handoff_weight, pair_weight, method="exhaustive")


def anneal_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                     handoff_weight: float = 1.0, pair_weight: float = 1.0, chains: int = 256, steps: int = 4000,
                     t_start: float = 2.0, t_end: float = 0.01, seed: int = 0) -> PlacementReport:
    """Simulated annealing over die permutations; ``chains`` independent chains as one vmapped scan.

    A move swaps the dies of two slots (a stage and any other die, so unused dies can
    come into play); Metropolis acceptance with geometric cooling from ``t_start`` to
    ``t_end``.  Chains start from the snake layout and from random maps.
    """
    D = hw.num_dies
    n = D if num_stages is None else num_stages
    snake = np.concatenate([mesh.snake_placement(hw, n), np.setdiff1d(np.arange(D), mesh.snake_placement(hw, n))])
    # random numbers drawn on the host (threefry inside the program was most of its compile time)
    rng = np.random.default_rng(seed)
    starts = np.stack([snake] + [rng.permutation(D) for _ in range(chains - 1)])
    slot = rng.integers(0, n, (chains, steps), dtype=np.int32)         # a stage's slot ...
    other = rng.integers(0, D, (chains, steps), dtype=np.int32)        # ... swapped with any die's slot
    uniform = rng.random((chains, steps), dtype=np.float32)
    best = _anneal_permutations(jnp.asarray(hop_cost_matrix(hw), jnp.float32), jnp.asarray(_pairs(pairing, n)),
                                starts, slot, other, uniform, np.float32(handoff_weight), np.float32(pair_weight),
                                np.float32(t_start), np.float32(t_end), n=n)
    return evaluate_placement(hw, np.asarray(best)[:n], pairing, handoff_weight, pair_weight, method="annealing")


@functools.partial(jax.jit, static_argnames=("n",))
def _anneal_permutations(C, pairs, starts, slot, other, uniform, handoff_weight, pair_weight, t_start, t_end, *,
                         n: int):
    """Best die permutation found by annealing chains from ``starts[chains, D]``, with the random
    swaps ``slot``, ``other`` and acceptance draws ``uniform``, each ``[chains, steps]`` (one program:
    meshes with the same die count, stage count, pair count, chains and steps share it)."""
    cost = _cost_fn(C, pairs, n, handoff_weight, pair_weight)
    steps = slot.shape[1]
    decay = (t_end / t_start) ** (1.0 / max(steps - 1, 1))

    def chain(perm, slot, other, uniform):
        def step(carry, xs):
            perm, c, best, best_c = carry
            a, b, u, i = xs
            new = perm.at[a].set(perm[b]).at[b].set(perm[a])
            nc = cost(new)
            temp = t_start * decay ** i
            accept = (nc <= c) | (u < jnp.exp(-(nc - c) / temp))
            perm = jnp.where(accept, new, perm)
            c = jnp.where(accept, nc, c)
            better = c < best_c
            return (perm, c, jnp.where(better, perm, best), jnp.where(better, c, best_c)), None

        c0 = cost(perm)
        (_, _, best, best_c), _ = jax.lax.scan(step, (perm, c0, perm, c0), (slot, other, uniform, jnp.arange(steps)))
        return best, best_c

    best, best_c = jax.vmap(chain)(starts, slot, other, uniform)
    return best[jnp.argmin(best_c)]


def search_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                     handoff_weight: float = 1.0, pair_weight: float = 1.0, seed: int = 0, **anneal) -> PlacementReport:
    """Exhaustive search on meshes of up to 8 dies, annealing beyond; never worse than snake."""
    n = hw.num_dies if num_stages is None else num_stages
    if hw.num_dies <= EXHAUSTIVE_MAX_DIES:
        rep = exhaustive_placement(hw, n, pairing, handoff_weight, pair_weight)
    else:
        rep = anneal_placement(hw, n, pairing, handoff_weight, pair_weight, seed=seed, **anneal)
    snake = evaluate_placement(hw, mesh.snake_placement(hw, n), pairing, handoff_weight, pair_weight, "snake")
    return rep if rep.cost <= snake.cost else snake


def snake_report(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                 handoff_weight: float = 1.0, pair_weight: float = 1.0) -> PlacementReport:
    n = hw.num_dies if num_stages is None else num_stages
    return evaluate_placement(hw, mesh.snake_placement(hw, n), pairing, handoff_weight, pair_weight, "snake")


def grid_picture(hw: HardwareSpec, placement) -> str:
    """Text picture of the die grid with the stage number on each die ('.' unused)."""
    stage_of = {int(d): s for s, d in enumerate(placement)}
    width = len(str(len(placement)))
    rows = []
    for r in range(hw.rows):
        cells = []
        for c in range(hw.grid_cols):
            d = mesh.die_index(hw, r, c)
            cells.append(str(stage_of[d]).rjust(width) if d in stage_of else ".".rjust(width))
            if hw.wafers > 1 and c % hw.cols == hw.cols - 1 and c != hw.grid_cols - 1:
                cells.append("|")
        rows.append(" ".join(cells))
    return "\n".join(rows)
