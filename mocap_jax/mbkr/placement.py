"""Stage-to-die placement for MBKR: keep pipeline neighbours and MBKR pairs close on the mesh.

A placement maps pipeline stage s to die ``placement[s]``.  Its cost is the traffic-weighted
route length of the transfers it creates under XY routing:

    cost = handoff_weight * sum_s hop_cost(s, s+1) + pair_weight * sum_pairs hop_cost(s, partner[s])

where ``hop_cost`` counts hops in units of a standard D2D link (a cross-wafer link slower than
the D2D links counts ``link_bandwidth / cross_wafer_bandwidth`` hops).  No stage order puts every
consecutive pair and every cross-half pair on neighbouring dies when N/2 is even (colour the mesh
as a checkerboard: along a path of neighbours stages s and s + N/2 get the same colour, and
same-coloured dies are never neighbours), so the map is searched: exhaustively on meshes of up to
8 dies, otherwise by the package's annealer (:mod:`mocap_jax.search.anneal`) over permutations of
a region of the mesh (the whole mesh, or on meshes much larger than the pipeline the smallest
corner rectangle with room for twice the stages).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..costs import pytree
from ..search.anneal import anneal, randint
from ..specs import HardwareSpec, mesh
from .pairing import STATIC_PAIRING_CODE, partner_of

EXHAUSTIVE_MAX_DIES = 8
#: meshes with more dies than this (and more than four per stage) are searched over a corner region
REGION_MAX_DIES = 64


def hop_cost_matrix(hw: HardwareSpec, dies=None) -> np.ndarray:
    """``[D, D]`` route length between ``dies`` (default every die) in standard-link units.

    On a mesh an XY route moves along its row, then its column: ``|dc| + |dr|`` hops, of which the
    row moves that cross a wafer boundary count ``link_bandwidth / cross_wafer_bandwidth`` each.
    """
    dies = np.arange(hw.num_dies) if dies is None else np.asarray(dies)
    if hw.topology == "switch":
        return 1.0 - np.eye(len(dies))
    r, c = np.divmod(dies, hw.grid_cols)
    dc = np.abs(c[:, None] - c[None, :])
    dr = np.abs(r[:, None] - r[None, :])
    crossings = np.abs(c[:, None] // hw.cols - c[None, :] // hw.cols)
    return (dc - crossings) + crossings * (hw.link_bandwidth / hw.cross_wafer_bandwidth) + dr


def search_region(hw: HardwareSpec, n: int) -> np.ndarray:
    """Dies a placement of ``n`` stages is searched over: every die, or on a mesh with more than
    ``REGION_MAX_DIES`` dies and four per stage, the smallest top-left rectangle of at least ``2 n`` dies."""
    if hw.num_dies <= max(REGION_MAX_DIES, 4 * n):
        return np.arange(hw.num_dies)
    rows = min(hw.rows, math.ceil(math.sqrt(2 * n)))
    cols = min(hw.grid_cols, math.ceil(2 * n / rows))
    return np.array([mesh.die_index(hw, r, c) for r in range(rows) for c in range(cols)])


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
    xy = np.stack(np.divmod(pl, hw.grid_cols), axis=1)
    H = np.abs(xy[:, None] - xy[None, :]).sum(-1) if hw.topology == "mesh" else 1 - np.eye(n, dtype=np.int64)
    C = hop_cost_matrix(hw, pl)                                                  # between the stages' dies
    pairs = _pairs(pairing, n)
    pipe = [int(H[s, s + 1]) for s in range(n - 1)]
    pair = [int(H[a, b]) for a, b in pairs]
    cost = handoff_weight * sum(C[s, s + 1] for s in range(n - 1)) + pair_weight * sum(C[a, b] for a, b in pairs)
    routes = [(pl[s], pl[s + 1]) for s in range(n - 1)] + [(pl[a], pl[b]) for a, b in pairs] + \
        [(pl[b], pl[a]) for a, b in pairs]
    loads = mesh.link_loads(hw, routes)
    return PlacementReport(pl, float(cost), sum(pipe), sum(pair), max(pipe, default=0), max(pair, default=0),
                           int(max(loads.values(), default=0)), method)


def _cost(C, pairs, n: int, handoff_weight, pair_weight, perm):
    """Cost of a permutation ``perm [D]`` of region slots (stage s on slot ``perm[s]``)."""
    pl = perm[:n]
    pipe = jnp.sum(C[pl[:-1], pl[1:]])
    pair = jnp.sum(C[pl[pairs[:, 0]], pl[pairs[:, 1]]]) if pairs.shape[0] else 0.0
    return handoff_weight * pipe + pair_weight * pair


@pytree
class PlacementContext:
    """Numbers of a placement search: ``cost [D, D]`` route lengths between region slots, ``pairs
    [P, 2]`` paired stages, and the two weights (scalars)."""

    cost: jax.Array
    pairs: jax.Array
    handoff_weight: jax.Array
    pair_weight: jax.Array


@dataclass(frozen=True)
class PlacementProblem:
    """Annealing over permutations of ``slots`` region slots for ``stages`` stages (hashable).

    A move swaps a stage's slot with any slot (so unused dies come into play)."""

    stages: int
    slots: int

    def initial_aux(self, ctx, chains: int):
        return jnp.zeros((chains,), jnp.int32)

    def propose(self, words, x, ctx):
        a = randint(words[0], 0, self.stages)
        b = randint(words[1], 0, self.slots)
        return x.at[a].set(x[b]).at[b].set(x[a]), a != b

    def evaluate(self, xs, ctx: PlacementContext, aux):
        cost = jax.vmap(lambda p: _cost(ctx.cost, ctx.pairs, self.stages, ctx.handoff_weight, ctx.pair_weight, p))(xs)
        return cost, aux


def exhaustive_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                         handoff_weight: float = 1.0, pair_weight: float = 1.0) -> PlacementReport:
    """Best placement over every ordered choice of dies (meshes of at most 8 dies)."""
    D = hw.num_dies
    n = D if num_stages is None else num_stages
    if D > EXHAUSTIVE_MAX_DIES:
        raise ValueError(f"exhaustive placement enumerates {D}! maps; use it on meshes of <= {EXHAUSTIVE_MAX_DIES} dies")
    perms = np.array(list(itertools.permutations(range(D), n)), dtype=np.int64)
    C = jnp.asarray(hop_cost_matrix(hw))
    pairs = jnp.asarray(_pairs(pairing, n))
    costs = np.asarray(jax.jit(jax.vmap(lambda p: _cost(C, pairs, n, handoff_weight, pair_weight, p)))(perms))
    return evaluate_placement(hw, perms[int(np.argmin(costs))], pairing, handoff_weight, pair_weight, "exhaustive")


def anneal_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                     handoff_weight: float = 1.0, pair_weight: float = 1.0, chains: int = 256, steps: int = 4000,
                     t_start: float = 0.1, t_end: float = 0.001, seed: int = 0) -> PlacementReport:
    """Simulated annealing over permutations of the search region (:func:`search_region`).

    Chains start from the snake layout and from random permutations; temperatures are relative to
    the snake layout's cost.
    """
    n = hw.num_dies if num_stages is None else num_stages
    region = search_region(hw, n)
    D = len(region)
    slot_of = {int(d): i for i, d in enumerate(region)}
    snake = np.array([slot_of[int(d)] for d in mesh.snake_placement(hw, n)] if all(
        int(d) in slot_of for d in mesh.snake_placement(hw, n)) else np.arange(n))
    snake = np.concatenate([snake, np.setdiff1d(np.arange(D), snake)])
    rng = np.random.default_rng(seed)
    starts = np.stack([snake] + [rng.permutation(D) for _ in range(chains - 1)])
    ctx = PlacementContext(cost=np.asarray(hop_cost_matrix(hw, region), np.float32),
                           pairs=np.asarray(_pairs(pairing, n), np.int32),
                           handoff_weight=np.float32(handoff_weight), pair_weight=np.float32(pair_weight))
    reference = float(_cost(ctx.cost, ctx.pairs, n, handoff_weight, pair_weight, snake)) or 1.0
    res = anneal(PlacementProblem(n, D), ctx, starts, seed, steps=steps, t_start=t_start,
                 t_end=t_end, reference=reference, steps_per_call=math.gcd(steps, 200))
    return evaluate_placement(hw, region[np.asarray(res.x)[:n]], pairing, handoff_weight, pair_weight, "annealing")


def search_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                     handoff_weight: float = 1.0, pair_weight: float = 1.0, seed: int = 0, **anneal_args) -> PlacementReport:
    """Exhaustive search on meshes of up to 8 dies, annealing beyond; never worse than snake."""
    n = hw.num_dies if num_stages is None else num_stages
    if hw.num_dies <= EXHAUSTIVE_MAX_DIES:
        rep = exhaustive_placement(hw, n, pairing, handoff_weight, pair_weight)
    else:
        rep = anneal_placement(hw, n, pairing, handoff_weight, pair_weight, seed=seed, **anneal_args)
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
