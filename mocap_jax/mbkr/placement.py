"""Stage-to-die placement for MBKR: keep pipeline neighbours and MBKR pairs close on the mesh.

A placement maps pipeline stage s to die ``placement[s]`` (or, with tensor parallelism, to the
``t`` dies of its stage group, ``placement[s, k]`` the die of rank k).  Its cost is the
traffic-weighted route length of the transfers it creates under XY routing:

    cost = handoff_weight * sum_s hop_cost(s, s+1) + pair_weight * sum_pairs hop_cost(s, partner[s])

where ``hop_cost`` counts hops in units of a standard D2D link (a cross-wafer link slower than
the D2D links counts ``link_bandwidth / cross_wafer_bandwidth`` hops); between two stage groups a
transfer runs rank to rank (die k to die k), and ``hop_cost`` is the mean over the ranks.  No stage
order puts every consecutive pair and every cross-half pair on neighbouring dies when N/2 is even
(colour the mesh as a checkerboard: along a path of neighbours stages s and s + N/2 get the same
colour, and same-coloured dies are never neighbours), so the map is searched.

The search (:func:`search_slots`) maps stages onto *slots* given a ``[S, S]`` slot-to-slot cost
matrix: exhaustively over at most 8 slots, otherwise by the package's annealer
(:mod:`mocap_jax.search.anneal`), and never worse than the default order.  A slot is a die
(``t = 1``: every die, or on meshes much larger than the pipeline the smallest corner rectangle
with room for twice the stages) or, for stage groups on a mesh, one ``r x c`` tile of the grid
of group rectangles (:func:`mocap_jax.specs.mesh.group_tiles`).  Every tile lists its dies in the
same ring order, so a rank-to-rank transfer between two tiles moves every rank by the same
vector, ``|d tile-row| r + |d tile-col| c`` hops on one wafer, and the tile-to-tile matrix is the
cost rule itself, not an estimate.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import partial

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


def group_cost_matrix(hw: HardwareSpec, groups) -> np.ndarray:
    """``[N, N]`` route length between stage groups ``[N, t]`` (or dies ``[N]``) in standard-link units:
    the mean over ranks k of the route from die k of one group to die k of the other."""
    groups = np.asarray(groups)
    groups = groups[:, None] if groups.ndim == 1 else groups
    return np.mean([hop_cost_matrix(hw, groups[:, k]) for k in range(groups.shape[1])], axis=0)


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
    """A placement (``[N]`` dies, or ``[N, t]`` dies of stage groups) and what it costs.  Hops are
    plain hop counts (between groups, the longest rank route); ``cost`` is weighted."""

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
    """Hop counts, weighted cost and the worst link sharing of one placement (dies ``[N]`` or groups ``[N, t]``)."""
    pl = np.asarray(placement, dtype=np.int64)
    groups = pl[:, None] if pl.ndim == 1 else pl
    n, t = groups.shape
    if hw.topology == "mesh":
        xy = np.stack(np.divmod(groups, hw.grid_cols), axis=-1)                  # [N, t, 2]
        H = np.abs(xy[:, None] - xy[None, :]).sum(-1).max(-1)
    else:
        H = 1 - np.eye(n, dtype=np.int64)
    C = group_cost_matrix(hw, groups)                                            # between the stages' groups
    pairs = _pairs(pairing, n)
    pipe = [int(H[s, s + 1]) for s in range(n - 1)]
    pair = [int(H[a, b]) for a, b in pairs]
    cost = handoff_weight * sum(C[s, s + 1] for s in range(n - 1)) + pair_weight * sum(C[a, b] for a, b in pairs)
    routes = [(groups[a, k], groups[b, k]) for k in range(t) for a, b in
              [(s, s + 1) for s in range(n - 1)] + [(a, b) for a, b in pairs] + [(b, a) for a, b in pairs]]
    loads = mesh.link_loads(hw, routes)
    return PlacementReport(pl, float(cost), sum(pipe), sum(pair), max(pipe, default=0), max(pair, default=0),
                           int(max(loads.values(), default=0)), method)


def _cost(C, pairs, n: int, handoff_weight, pair_weight, perm):
    """Cost of a permutation ``perm [S]`` of slots (stage s on slot ``perm[s]``)."""
    pl = perm[:n]
    pipe = jnp.sum(C[pl[:-1], pl[1:]])
    pair = jnp.sum(C[pl[pairs[:, 0]], pl[pairs[:, 1]]]) if pairs.shape[0] else 0.0
    return handoff_weight * pipe + pair_weight * pair


@partial(jax.jit, static_argnums=2)
def _costs(C, pairs, n: int, handoff_weight, pair_weight, perms):
    """:func:`_cost` of every permutation ``perms [P, S]``, ``[P]``."""
    return jax.vmap(lambda p: _cost(C, pairs, n, handoff_weight, pair_weight, p))(perms)


@pytree
class PlacementContext:
    """Numbers of a placement search: ``cost [S, S]`` route lengths between slots, ``pairs
    [P, 2]`` paired stages, and the two weights (scalars)."""

    cost: jax.Array
    pairs: jax.Array
    handoff_weight: jax.Array
    pair_weight: jax.Array


@dataclass(frozen=True)
class PlacementProblem:
    """Annealing over permutations of ``slots`` slots for ``stages`` stages (hashable).

    A move swaps a stage's slot with any slot (so unused slots come into play)."""

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


def search_slots(cost, num_stages: int, pairs, default, handoff_weight: float = 1.0, pair_weight: float = 1.0,
                 exhaustive: bool | None = None, chains: int = 256, steps: int = 4000, t_start: float = 0.1,
                 t_end: float = 0.001, seed: int = 0) -> tuple[np.ndarray, str]:
    """Slots ``[N]`` of ``num_stages`` stages minimising the weighted cost, and the method that found them.

    Args:
      cost: ``[S, S]`` route length between slots, standard-link units.
      pairs: ``[P, 2]`` paired stages.
      default: ``[N]`` distinct slots of the default order (the annealer's first chain starts there).
      exhaustive: every ordered choice of slots (default: when ``S <= 8``), else simulated
        annealing; chains start from the default order and from random permutations, with
        temperatures relative to the default order's cost.
    """
    S, n = len(cost), int(num_stages)
    if exhaustive is None:
        exhaustive = S <= EXHAUSTIVE_MAX_DIES
    if exhaustive:
        if S > EXHAUSTIVE_MAX_DIES:
            raise ValueError(f"exhaustive placement enumerates {S}! maps; use it on at most {EXHAUSTIVE_MAX_DIES} "
                             f"dies or tiles")
        perms = np.array(list(itertools.permutations(range(S), n)), dtype=np.int64)
        costs = np.asarray(_costs(np.asarray(cost), np.asarray(pairs), n, float(handoff_weight), float(pair_weight),
                                  perms))
        return perms[int(np.argmin(costs))], "exhaustive"
    default = np.asarray(default, np.int64)
    start = np.concatenate([default, np.setdiff1d(np.arange(S), default)])
    rng = np.random.default_rng(seed)
    starts = np.stack([start] + [rng.permutation(S) for _ in range(chains - 1)])
    ctx = PlacementContext(cost=np.asarray(cost, np.float32), pairs=np.asarray(pairs, np.int32),
                           handoff_weight=np.float32(handoff_weight), pair_weight=np.float32(pair_weight))
    reference = float(_cost(ctx.cost, ctx.pairs, n, handoff_weight, pair_weight, start)) or 1.0
    res = anneal(PlacementProblem(n, S), ctx, starts, seed, steps=steps, t_start=t_start,
                 t_end=t_end, reference=reference, steps_per_call=math.gcd(steps, 200))
    return np.asarray(res.x)[:n], "annealing"


def placement_slots(hw: HardwareSpec, num_stages: int, tp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """What a placement of ``num_stages`` stages of ``tp`` dies is searched over: ``dies [S, tp]`` of
    each slot and the default order ``default [N]`` of slots (the snake order of dies, or of tiles).

    ``tp = 1``: the dies of :func:`search_region`; on a mesh with ``tp > 1``: the group tiles."""
    n = int(num_stages)
    if tp == 1:
        region = search_region(hw, n)
        slot_of = {int(d): i for i, d in enumerate(region)}
        snake = mesh.snake_placement(hw, n)
        default = [slot_of[int(d)] for d in snake] if all(int(d) in slot_of for d in snake) else np.arange(n)
        return region[:, None], np.asarray(default, np.int64)
    dies, snake = mesh.group_tiles(hw, tp)
    return dies, snake[:n]


def _placement(dies, slots, tp: int) -> np.ndarray:
    return dies[np.asarray(slots), 0] if tp == 1 else dies[np.asarray(slots)]


def exhaustive_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                         handoff_weight: float = 1.0, pair_weight: float = 1.0, tp: int = 1) -> PlacementReport:
    """Best placement over every ordered choice of slots (at most 8 dies, or 8 group tiles)."""
    return _searched(hw, num_stages, pairing, handoff_weight, pair_weight, tp, exhaustive=True)


def anneal_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                     handoff_weight: float = 1.0, pair_weight: float = 1.0, tp: int = 1, **anneal_args) -> PlacementReport:
    """Simulated annealing over permutations of the slots (:func:`placement_slots`, :func:`search_slots`)."""
    return _searched(hw, num_stages, pairing, handoff_weight, pair_weight, tp, exhaustive=False, **anneal_args)


def _searched(hw, num_stages, pairing, handoff_weight, pair_weight, tp, **search_args) -> PlacementReport:
    n = hw.num_dies // tp if num_stages is None else int(num_stages)
    dies, default = placement_slots(hw, n, tp)
    slots, method = search_slots(group_cost_matrix(hw, dies), n, _pairs(pairing, n), default, handoff_weight,
                                 pair_weight, **search_args)
    return evaluate_placement(hw, _placement(dies, slots, tp), pairing, handoff_weight, pair_weight, method)


def search_placement(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                     handoff_weight: float = 1.0, pair_weight: float = 1.0, seed: int = 0, tp: int = 1,
                     **anneal_args) -> PlacementReport:
    """The searched placement of ``num_stages`` stages of ``tp`` dies (default ``dies // tp`` stages).

    Exhaustive over at most 8 slots, annealing beyond; never worse than the default (snake) layout.
    With ``tp > 1`` the placement is ``[N, tp]``: which group tile each stage group occupies on a
    mesh.  On a switch (GPU nodes) every group is one hop from every other, so there is nothing to
    search: the consecutive-device groups are kept (a group stays inside a node when ``tp``
    divides the node size).
    """
    n = hw.num_dies // tp if num_stages is None else int(num_stages)
    snake = snake_report(hw, n, pairing, handoff_weight, pair_weight, tp)
    if tp > 1 and hw.topology == "switch":
        return snake
    rep = _searched(hw, n, pairing, handoff_weight, pair_weight, tp, seed=seed, **anneal_args)
    return rep if rep.cost <= snake.cost else snake


def snake_report(hw: HardwareSpec, num_stages: int | None = None, pairing: str = "cross-half",
                 handoff_weight: float = 1.0, pair_weight: float = 1.0, tp: int = 1) -> PlacementReport:
    """The default layout's report: the snake order of dies, or the default stage groups."""
    n = hw.num_dies // tp if num_stages is None else int(num_stages)
    pl = mesh.snake_placement(hw, n) if tp == 1 else mesh.stage_groups(hw, n, tp)
    return evaluate_placement(hw, pl, pairing, handoff_weight, pair_weight, "snake")


def grid_picture(hw: HardwareSpec, placement) -> str:
    """Text picture of the die grid with the stage number on each die of its group ('.' unused)."""
    pl = np.asarray(placement)
    stage_of = {int(d): s for s, group in enumerate(pl.reshape(len(pl), -1)) for d in group}
    width = len(str(len(pl)))
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
