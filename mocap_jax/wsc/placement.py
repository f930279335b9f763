"""Placement of prefill and decode instances on the wafer and its KV TransferCost.

**TransferCost.**  Every prefill instance sends its KV to its nearest decode instance (fewest
hops centre to centre; ties go to the decode instance listed first) along the XY route between
the two centre dies.  A directed link used by ``u`` such transfers costs ``alpha ** (u - 1)``
per use, so the total is

    TransferCost = sum over links l of u_l * alpha ** (u_l - 1)

which is the plain sum of hop distances when ``alpha = 1`` (or no link is shared) and grows
with every extra use of a shared link when ``alpha > 1``.

Placements:

* :func:`decode_centred_placement` -- decode instances as close to the wafer centre as
  possible, then each prefill instance where it adds the least TransferCost (depth-first with
  backtracking, then an exact packing if that fails).
* :func:`random_placement` -- uniformly random free positions (with restarts).
* :func:`anneal_placements` -- TransferCost minimised by the package's annealer
  (:mod:`mocap_jax.search.anneal`; the moves are :class:`~mocap_jax.wsc.placement_search.LayoutProblem`'s).
* :func:`exhaustive_placement` -- every layout of a small mesh (the true optimum).

Their side-by-side comparison over alpha is :mod:`mocap_jax.wsc.placement_compare`.

Layouts and packing are in :mod:`mocap_jax.wsc.layout`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..search.anneal import anneal
from ..specs import LIMITS, SpecError, checks
from .geometry import hop_matrix, route_incidence
from .hardware import WaferSpec
from .layout import KINDS, Instance, Layout, check_alpha, check_mesh, check_request, enumerate_layouts, pack_instances
from .placement_search import LayoutContext, LayoutProblem, transfer_cost_arrays


# --------------------------------------------------------------------------- TransferCost


@dataclass
class TransferReport:
    """TransferCost of a layout with its parts."""

    cost: float
    hop_sum: int
    max_link_use: int
    shared_links: int
    nearest: list[int]              # decode index (within decode instances) per prefill instance
    routes: list[list[tuple[int, int]]]  # directed links of each prefill's route
    link_use: dict[tuple[int, int], int]


class _Geometry:
    """Cached hop matrix and route incidence of a wafer."""

    _cache: dict = {}

    def __init__(self, wafer: WaferSpec):
        key = (wafer.rows, wafer.cols)
        if key not in _Geometry._cache:
            inc, links = route_incidence(wafer)
            _Geometry._cache[key] = (hop_matrix(wafer), inc, links)
        self.hops, self.incidence, self.links = _Geometry._cache[key]


def transfer_cost(wafer: WaferSpec, layout: Layout, alpha: float = 1.0) -> TransferReport:
    """TransferCost of ``layout`` (see the module docstring)."""
    check_mesh(wafer)
    check_alpha(alpha)
    if (layout.grid_rows, layout.grid_cols) != (wafer.rows, wafer.cols):
        raise SpecError(f"layout is {layout.grid_rows}x{layout.grid_cols} but {wafer.name} is {wafer.rows}x{wafer.cols}")
    pre, dec = layout.centre_dies("prefill"), layout.centre_dies("decode")
    if len(dec) == 0 or len(pre) == 0:
        return TransferReport(0.0, 0, 0, 0, [], [], {})
    g = _Geometry(wafer)
    cost, use, nearest = transfer_cost_arrays(pre, dec, g.hops, g.incidence, float(alpha), xp=np)
    routes = [[g.links[l] for l in np.flatnonzero(g.incidence[p, dec[n]])] for p, n in zip(pre, nearest)]
    link_use = {g.links[l]: int(u) for l, u in enumerate(use) if u > 0}
    return TransferReport(cost=float(cost), hop_sum=int(use.sum()), max_link_use=int(use.max(initial=0)),
                          shared_links=int((use > 1).sum()), nearest=[int(n) for n in nearest], routes=routes,
                          link_use=link_use)


# --------------------------------------------------------------------------- heuristics


def _positions(wafer: WaferSpec, shape):
    h, w = shape
    out = []
    for hh, ww in ([(h, w)] if h == w else [(h, w), (w, h)]):
        for r in range(wafer.rows - hh + 1):
            for c in range(wafer.cols - ww + 1):
                out.append((r, c, hh, ww))
    return out


def _from_packing(wafer, placed, shapes_kinds):
    return Layout(wafer.rows, wafer.cols, tuple(Instance(shapes_kinds[k], r, c, h, w) for k, r, c, h, w in placed))


def decode_centred_placement(wafer: WaferSpec, prefill_shape, n_prefill: int, decode_shape, n_decode: int,
                             alpha: float = 1.0, node_budget: int = 20_000) -> Layout:
    """Decode instances in the middle of the wafer, prefill instances around them.

    Decode positions are tried in order of their centre's distance to the wafer centre;
    each prefill instance then takes the free position that adds the least TransferCost
    (ties: nearer the wafer centre, then row-major).  Depth-first with backtracking up
    to ``node_budget`` nodes; if that fails, an exact packing is returned instead.
    """
    check_mesh(wafer)
    check_alpha(alpha)
    prefill_shape, decode_shape = tuple(prefill_shape), tuple(decode_shape)
    check_request(wafer, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
    g = _Geometry(wafer)
    cr, cc = (wafer.rows - 1) / 2, (wafer.cols - 1) / 2

    def centre_dist(p):
        r, c, h, w = p
        return abs(r + (h - 1) / 2 - cr) + abs(c + (w - 1) / 2 - cc), (r + (h - 1) / 2 - cr) ** 2 + (c + (w - 1) / 2 - cc) ** 2

    dec_pos = sorted(_positions(wafer, decode_shape), key=lambda p: (centre_dist(p), p))
    pre_pos = _positions(wafer, prefill_shape)
    cdie = lambda p: (p[0] + (p[2] - 1) // 2) * wafer.cols + (p[1] + (p[3] - 1) // 2)
    bits = lambda p: sum(1 << ((rr * wafer.cols) + cc) for rr in range(p[0], p[0] + p[2]) for cc in range(p[1], p[1] + p[3]))
    dec_bits = [bits(p) for p in dec_pos]
    pre_bits = [bits(p) for p in pre_pos]
    pre_dies = np.asarray([cdie(p) for p in pre_pos])
    pre_dist = [centre_dist(p) for p in pre_pos]
    need = lambda nd, np_: (n_decode - nd) * decode_shape[0] * decode_shape[1] \
        + (n_prefill - np_) * prefill_shape[0] * prefill_shape[1]
    nodes = [0]
    routes: dict = {}
    failed: dict = {}   # (occupancy, decode and prefill placed) -> nodes its exhausted subtree took

    def prefill_routes(decs):
        """Route link rows ``[positions, L]`` of every prefill position to its nearest decode centre."""
        key = tuple(decs)
        if key not in routes:
            dec_dies = np.asarray([cdie(dec_pos[k]) for k in decs])
            nearest = dec_dies[np.argmin(g.hops[pre_dies][:, dec_dies], axis=1)]
            routes[key] = g.incidence[pre_dies, nearest].astype(np.float64)
        return routes[key]

    def rec(occ, decs, pres, use):
        key = (occ, len(decs), len(pres))
        if key in failed:  # no completion from here (the search of a subtree is exhaustive): charge its nodes
            nodes[0] += failed[key]
            return None
        start = nodes[0]
        res = _rec(occ, decs, pres, use)
        if res is None and nodes[0] <= node_budget:
            failed[key] = nodes[0] - start
        return res

    def _rec(occ, decs, pres, use):
        nodes[0] += 1
        if nodes[0] > node_budget:
            return None
        if len(decs) == n_decode and len(pres) == n_prefill:
            return decs, pres
        if need(len(decs), len(pres)) > wafer.num_dies - bin(occ).count("1"):
            return None
        if len(decs) < n_decode:
            for k, m in enumerate(dec_bits):
                if not m & occ:
                    res = rec(occ | m, decs + [k], pres, use)
                    if res is not None:
                        return res
            return None
        rows = prefill_routes(decs)
        free = [k for k, m in enumerate(pre_bits) if not m & occ]
        after = use[None, :] + rows[free]                      # link uses with each free position added
        cost = np.sum(np.where(after > 0, after * np.power(float(alpha), np.maximum(after - 1, 0)), 0.0), axis=1)
        for _, _, k in sorted(zip(cost.tolist(), [pre_dist[k] for k in free], free),
                              key=lambda x: (x[0], x[1], pre_pos[x[2]])):
            res = rec(occ | pre_bits[k], decs, pres + [k], use + rows[k])
            if res is not None:
                return res
        return None

    res = rec(0, [], [], np.zeros(g.incidence.shape[-1]))
    if res is None:
        placed = pack_instances(wafer.rows, wafer.cols, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
        if placed is None:
            raise SpecError(f"cannot pack {n_prefill} x {prefill_shape[0]}x{prefill_shape[1]} prefill and {n_decode} x "
                            f"{decode_shape[0]}x{decode_shape[1]} decode instances on {wafer.name}")
        return _from_packing(wafer, placed, KINDS)
    decs, pres = res
    return Layout(wafer.rows, wafer.cols, tuple(Instance("decode", *dec_pos[k]) for k in decs)
                  + tuple(Instance("prefill", *pre_pos[k]) for k in pres))


def random_placement(wafer: WaferSpec, prefill_shape, n_prefill: int, decode_shape, n_decode: int,
                     rng: np.random.Generator | int = 0, restarts: int = 500) -> Layout:
    """Instances at uniformly random free positions (random orientation), restarting when stuck.

    Raises:
      SpecError: no random layout found in ``restarts`` tries (the packing is too tight).
    """
    check_mesh(wafer)
    prefill_shape, decode_shape = tuple(prefill_shape), tuple(decode_shape)
    check_request(wafer, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
    rng = np.random.default_rng(rng)
    kinds = ["decode"] * n_decode + ["prefill"] * n_prefill
    pos, cover = {}, {}
    for kind, shape in (("decode", decode_shape), ("prefill", prefill_shape)):
        pos[kind] = _positions(wafer, shape)
        m = np.zeros((len(pos[kind]), wafer.num_dies), np.int32)  # [positions, dies] cells each position covers
        for k, (r, c, h, w) in enumerate(pos[kind]):
            for rr in range(r, r + h):
                m[k, rr * wafer.cols + c: rr * wafer.cols + c + w] = 1
        cover[kind] = m
    for _ in range(restarts):
        occ = np.zeros(wafer.num_dies, np.int32)
        out = []
        for kind in [kinds[i] for i in rng.permutation(len(kinds))]:
            cand = np.flatnonzero(cover[kind] @ occ == 0)
            if cand.size == 0:
                break
            k = int(cand[rng.integers(cand.size)])
            occ += cover[kind][k]
            out.append(Instance(kind, *pos[kind][k]))
        if len(out) == len(kinds):
            return Layout(wafer.rows, wafer.cols, tuple(sorted(out, key=lambda i: KINDS.index(i.kind), reverse=True)))
    raise SpecError(f"no random layout of these instances found on {wafer.name} in {restarts} tries")


@dataclass
class AnnealResult:
    """Best layout of an annealing run, its TransferCost, each chain's best cost and the runtime."""

    layout: Layout
    cost: float
    chain_costs: list[float]
    runtime_s: float


def anneal_placements(wafer: WaferSpec, starts: Sequence[Layout], alphas: Sequence[float], chains: int = 32,
                      steps: int = 2000, seed: int = 0, t_start: float = 2.0, t_end: float = 0.01,
                      devices: int | None = None) -> list[AnnealResult]:
    """Simulated annealing of TransferCost for several alphas in one run of the package's annealer.

    For each ``alphas[k]``, ``chains`` chains run: one from ``starts[k]``, the others from
    random layouts (shared by all alphas; ``starts[k]`` when none can be drawn).  Moves are
    :class:`~mocap_jax.wsc.placement_search.LayoutProblem`'s.  Temperature cools geometrically
    from ``t_start`` to ``t_end`` (hop units).  A fixed seed gives the same answer, however the
    chains are split over ``devices`` (default: every local CPU device that divides them).

    Returns:
      one :class:`AnnealResult` per alpha (its best chain; never worse than its start).
    """
    check_mesh(wafer)
    if len(starts) != len(alphas) or not alphas:
        raise SpecError("give one start layout per alpha (and at least one alpha)")
    for a in alphas:
        check_alpha(a)
    chains = checks.integer("chains", chains, 1, LIMITS["chains"])
    steps = checks.integer("steps", steps, 1, LIMITS["steps"])
    if not (t_start > 0 and t_end > 0):
        raise SpecError(f"annealing temperatures must be positive, got {t_start:g} and {t_end:g}")
    t0 = time.perf_counter()
    insts = list(starts[0].instances)
    pre = [i for i in insts if i.kind == "prefill"]
    dec = [i for i in insts if i.kind == "decode"]
    if not pre or not dec:
        return [AnnealResult(l, 0.0, [0.0], 0.0) for l in starts]
    sig = lambda i: (i.kind, frozenset([(i.rows, i.cols), (i.cols, i.rows)]))

    def encode(layout: Layout):
        # match instances of the same kind and shape (up to rotation) to the reference order
        pools: dict = {}
        for inst in layout.instances:
            pools.setdefault(sig(inst), []).append(inst)
        rows_ = []
        for ref in insts:
            pool = pools.get(sig(ref))
            if not pool:
                raise SpecError("all start layouts must hold the same instances")
            inst = pool.pop(0)
            rows_.append((inst.row, inst.col, int((inst.rows, inst.cols) != (ref.rows, ref.cols))))
        return np.asarray(rows_, dtype=np.int32).reshape(-1)

    def decode(x) -> Layout:
        return Layout(wafer.rows, wafer.cols, tuple(
            Instance(ref.kind, int(p[0]), int(p[1]), ref.cols if p[2] else ref.rows, ref.rows if p[2] else ref.cols)
            for ref, p in zip(insts, np.asarray(x).reshape(-1, 3))))

    rng = np.random.default_rng(seed)
    p_shape, d_shape = (pre[0].rows, pre[0].cols), (dec[0].rows, dec[0].cols)
    randoms = []
    for _ in range(chains - 1):
        try:
            randoms.append(encode(random_placement(wafer, p_shape, len(pre), d_shape, len(dec), rng, restarts=50)))
        except SpecError:
            randoms.append(None)
    x0 = []
    for lay in starts:
        own = encode(lay)
        x0 += [own] + [own if x is None else x for x in randoms]
    g = _Geometry(wafer)
    problem = LayoutProblem(tuple(i.rows for i in insts), tuple(i.cols for i in insts),
                            tuple(i.kind == "prefill" for i in insts), wafer.rows, wafer.cols)
    ctx = LayoutContext(hops=np.asarray(g.hops, np.int32), incidence=g.incidence,
                        alpha=np.asarray(alphas, np.float32))
    start_costs = [transfer_cost(wafer, lay, a).cost for lay, a in zip(starts, alphas)]
    # the annealer's temperatures are relative to its reference objective: divided by it, they stay in hop units
    reference = min(start_costs) if min(start_costs) > 0 else 1.0
    res = anneal(problem, ctx, np.stack(x0), seed, steps=steps, t_start=t_start / reference,
                 t_end=t_end / reference, reference=reference, devices=devices,
                 steps_per_call=math.gcd(steps, 200))
    elapsed = time.perf_counter() - t0
    out = []
    for k, (a, start, start_cost) in enumerate(zip(alphas, starts, start_costs)):
        layouts = [decode(x) for x in res.chain_states[k * chains:(k + 1) * chains]]
        costs = [transfer_cost(wafer, lay, a).cost for lay in layouts]
        best = int(np.argmin(costs))
        # float32 objectives on the device: the exact float64 cost decides against the start
        layout, cost = (layouts[best], costs[best]) if costs[best] <= start_cost else (start, start_cost)
        out.append(AnnealResult(layout, cost, costs, elapsed))
    return out


def anneal_placement(wafer: WaferSpec, layout0: Layout, alpha: float = 1.0, chains: int = 32, steps: int = 2000,
                     seed: int = 0, t_start: float = 2.0, t_end: float = 0.01,
                     devices: int | None = None) -> AnnealResult:
    """Simulated annealing of TransferCost from ``layout0`` and ``chains - 1`` random layouts.

    See :func:`anneal_placements` (this is its one-alpha case).
    """
    return anneal_placements(wafer, [layout0], [alpha], chains, steps, seed, t_start, t_end, devices)[0]


@jax.jit
def _layout_costs(prefill_dies, decode_dies, hops, incidence, alpha):
    """TransferCost of every enumerated layout, ``[K]`` from centre dies ``[K, P]`` and ``[K, Q]``."""
    return jax.vmap(lambda p, d: transfer_cost_arrays(p, d, hops, incidence, alpha)[0])(prefill_dies, decode_dies)


def exhaustive_placement(wafer: WaferSpec, prefill_shape, n_prefill: int, decode_shape, n_decode: int,
                         alpha: float = 1.0, max_layouts: int = 200_000) -> tuple[Layout, float, int]:
    """The TransferCost optimum over every layout (small meshes only).

    Returns:
      (best layout, its cost, number of layouts enumerated).
    """
    check_mesh(wafer)
    check_alpha(alpha)
    prefill_shape, decode_shape = tuple(prefill_shape), tuple(decode_shape)
    check_request(wafer, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
    pre, dec, layouts = enumerate_layouts(wafer, prefill_shape, n_prefill, decode_shape, n_decode, max_layouts)
    if not layouts:
        raise SpecError(f"these instances cannot be packed on {wafer.name}")
    g = _Geometry(wafer)
    costs = np.asarray(_layout_costs(pre, dec, g.hops, g.incidence, np.asarray(float(alpha), jnp.result_type(float))))
    k = int(np.argmin(costs))
    layout = _from_packing(wafer, layouts[k], KINDS)
    return layout, float(transfer_cost(wafer, layout, alpha).cost), len(layouts)


__all__ = [
    "TransferReport", "AnnealResult", "transfer_cost_arrays", "transfer_cost",
    "decode_centred_placement", "random_placement", "anneal_placement", "anneal_placements", "exhaustive_placement",
]
