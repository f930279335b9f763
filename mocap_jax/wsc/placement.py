"""Instance placement on the wafer and its KV TransferCost (DESIGN §10).

A :class:`Layout` puts rectangular prefill and decode instances on a ``rows x cols``
mesh without overlap.  Each instance is represented by its *centre die*
``(row + (h - 1) // 2, col + (w - 1) // 2)`` (the geometric centre, rounded up-left).

**TransferCost.**  Every prefill instance sends its KV to its nearest decode
instance (fewest hops centre to centre; ties go to the decode instance listed first)
along the XY route between the two centre dies.  A directed link used by ``u`` such
transfers costs ``alpha ** (u - 1)`` per use, so the total is

    TransferCost = sum over links l of u_l * alpha ** (u_l - 1)

which is the plain sum of hop distances when ``alpha = 1`` (or no link is shared)
and grows with every extra use of a shared link when ``alpha > 1``.

Placements:

* :func:`decode_centred_placement` -- decode instances as close to the wafer centre
  as possible, then each prefill instance where it adds the least TransferCost
  (depth-first with backtracking, then an exact packing if that fails).
* :func:`random_placement` -- uniformly random free positions (with restarts).
* :func:`anneal_placement` -- simulated annealing, many chains as one vmapped JAX
  program.  Moves: relocate one instance (random position and orientation), shift
  one by a die, and *region swap* -- move an instance onto a same-shaped rectangle
  and the instances wholly inside that rectangle into its old place (this keeps a
  fully packed wafer valid, e.g. a 1x2 decode instance trades places with two 1x1
  prefill instances).
* :func:`exhaustive_placement` -- every layout of a small mesh (the true optimum).

:func:`pack_instances` is the exact rectangle packer the partition uses for counts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import SpecError
from .hardware import WaferSpec, hop_matrix, route_incidence

Array = Any
KINDS = ("prefill", "decode")


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Instance:
    """One instance: ``kind`` in (prefill, decode), top-left die ``(row, col)``, size ``rows x cols``."""

    kind: str
    row: int
    col: int
    rows: int
    cols: int

    @property
    def centre(self) -> tuple[int, int]:
        return self.row + (self.rows - 1) // 2, self.col + (self.cols - 1) // 2

    def cells(self) -> list[tuple[int, int]]:
        return [(r, c) for r in range(self.row, self.row + self.rows) for c in range(self.col, self.col + self.cols)]


@dataclass(frozen=True)
class Layout:
    """Instances on a ``grid_rows x grid_cols`` mesh (validated: in bounds, no overlap)."""

    grid_rows: int
    grid_cols: int
    instances: tuple[Instance, ...]

    def __post_init__(self):
        occ = np.full((self.grid_rows, self.grid_cols), -1)
        for i, inst in enumerate(self.instances):
            if inst.kind not in KINDS:
                raise SpecError(f"instance {i}: kind must be 'prefill' or 'decode', got {inst.kind!r}")
            if inst.rows < 1 or inst.cols < 1:
                raise SpecError(f"instance {i}: size must be positive, got {inst.rows}x{inst.cols}")
            if inst.row < 0 or inst.col < 0 or inst.row + inst.rows > self.grid_rows \
                    or inst.col + inst.cols > self.grid_cols:
                raise SpecError(f"instance {i} ({inst.kind} {inst.rows}x{inst.cols} at {inst.row},{inst.col}) leaves "
                                f"the {self.grid_rows}x{self.grid_cols} wafer")
            for r, c in inst.cells():
                if occ[r, c] >= 0:
                    raise SpecError(f"instances {occ[r, c]} and {i} overlap at die ({r}, {c})")
                occ[r, c] = i

    @property
    def prefill(self) -> list[Instance]:
        return [i for i in self.instances if i.kind == "prefill"]

    @property
    def decode(self) -> list[Instance]:
        return [i for i in self.instances if i.kind == "decode"]

    def occupancy(self) -> np.ndarray:
        """``[rows, cols]`` instance index of each die, -1 where free."""
        occ = np.full((self.grid_rows, self.grid_cols), -1)
        for i, inst in enumerate(self.instances):
            for r, c in inst.cells():
                occ[r, c] = i
        return occ

    def centre_dies(self, kind: str) -> np.ndarray:
        return np.asarray([i.centre[0] * self.grid_cols + i.centre[1] for i in self.instances if i.kind == kind],
                          dtype=np.int64)

    def to_dict(self) -> list[dict[str, Any]]:
        return [dict(kind=i.kind, row=i.row, col=i.col, rows=i.rows, cols=i.cols) for i in self.instances]

    def ascii(self) -> str:
        """The wafer as text: ``P3`` / ``D1`` per die (instance index within its kind), ``.`` free."""
        idx = {id(inst): n for kind in KINDS for n, inst in enumerate(i for i in self.instances if i.kind == kind)}
        grid = [["  ." for _ in range(self.grid_cols)] for _ in range(self.grid_rows)]
        for inst in self.instances:
            for r, c in inst.cells():
                grid[r][c] = f"{inst.kind[0].upper()}{idx[id(inst)]}".rjust(3)
        return "\n".join(" ".join(row) for row in grid)


def _check_mesh(wafer: WaferSpec):
    if not wafer.is_mesh:
        raise SpecError(f"placement is defined on a mesh wafer; {wafer.name} is a GPU cluster "
                        f"(every GPU pair is one hop apart there)")


def _check_alpha(alpha):
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha < 1:
        raise SpecError(f"alpha must be a number >= 1 (the cost factor per extra use of a shared link), got {alpha!r}")


def _check_request(wafer: WaferSpec, shapes_counts):
    total = 0
    for (h, w), n in shapes_counts:
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (h, w, n)) or h < 1 or w < 1 or n < 0:
            raise SpecError(f"instance shape and count must be positive integers, got {h}x{w} x {n}")
        fits = (h <= wafer.rows and w <= wafer.cols) or (w <= wafer.rows and h <= wafer.cols)
        if not fits:
            raise SpecError(f"instance {h}x{w} is larger than the {wafer.rows}x{wafer.cols} wafer {wafer.name}; "
                            f"choose a shape with rows <= {wafer.rows} and cols <= {wafer.cols}")
        total += h * w * n
    if total > wafer.num_dies:
        raise SpecError(f"the instances need {total} dies but {wafer.name} has {wafer.num_dies}; use fewer instances")


# --------------------------------------------------------------------------- exact packing


def pack_instances(rows: int, cols: int, items: Sequence[tuple[tuple[int, int], int]], allow_rotation: bool = True,
                   node_budget: int = 200_000):
    """Exact packing of rectangles on a ``rows x cols`` grid (first-free-cell search with memo).

    Args:
      items: ``[((h, w), count), ...]``.
      allow_rotation: also try each rectangle as ``w x h``.
      node_budget: search nodes before giving up (returns None, i.e. treated as not packable).

    Returns:
      ``[(item_index, row, col, h, w), ...]`` for every instance, or None when impossible.
    """
    shapes = [tuple(s) for s, _ in items]
    counts = [int(n) for _, n in items]
    need = sum(h * w * n for (h, w), n in zip(shapes, counts))
    if need > rows * cols:
        return None
    full = (1 << (rows * cols)) - 1
    masks = {}
    for k, (h, w) in enumerate(shapes):
        orients = {(h, w), (w, h)} if allow_rotation else {(h, w)}
        for hh, ww in orients:
            for r in range(rows - hh + 1):
                for c in range(cols - ww + 1):
                    m = 0
                    for rr in range(r, r + hh):
                        for cc in range(c, c + ww):
                            m |= 1 << (rr * cols + cc)
                    masks.setdefault((k, r, c), []).append((m, hh, ww))
    failed = set()
    nodes = [0]

    def dfs(mask, remaining, waste):
        if not any(remaining):
            return []
        key = (mask, remaining)
        if key in failed or nodes[0] > node_budget:
            return None
        nodes[0] += 1
        free = ~mask & full
        cell = (free & -free).bit_length() - 1
        r, c = divmod(cell, cols)
        for k in range(len(shapes)):
            if remaining[k] == 0:
                continue
            for m, hh, ww in masks.get((k, r, c), ()):
                if m & mask:
                    continue
                rem = remaining[:k] + (remaining[k] - 1,) + remaining[k + 1:]
                sub = dfs(mask | m, rem, waste)
                if sub is not None:
                    return [(k, r, c, hh, ww)] + sub
        if waste > 0:
            sub = dfs(mask | (1 << cell), remaining, waste - 1)
            if sub is not None:
                return sub
        failed.add(key)
        return None

    return dfs(0, tuple(counts), rows * cols - need)


def enumerate_layouts(wafer: WaferSpec, prefill_shape, n_prefill, decode_shape, n_decode, max_layouts=200_000):
    """Every distinct layout (instances of a kind are interchangeable), for exhaustive search on small meshes.

    Returns:
      (prefill centre dies ``[M, P]``, decode centre dies ``[M, Q]``, layouts list of tuples
      ``(kind_index, row, col, h, w)``).

    Raises:
      SpecError: more than ``max_layouts`` layouts (use :func:`anneal_placement`).
    """
    rows, cols = wafer.rows, wafer.cols
    shapes = [tuple(prefill_shape), tuple(decode_shape)]
    counts = (n_prefill, n_decode)
    waste0 = rows * cols - sum(h * w * n for (h, w), n in zip(shapes, counts))
    out: list[list[tuple[int, int, int, int, int]]] = []
    occ = np.zeros((rows, cols), bool)

    def orients(k):
        h, w = shapes[k]
        return [(h, w)] if h == w else [(h, w), (w, h)]

    def first_free():
        idx = np.flatnonzero(~occ.ravel())
        return divmod(int(idx[0]), cols) if idx.size else None

    def rec(remaining, waste, acc):
        if len(out) > max_layouts:
            raise SpecError(f"more than {max_layouts} layouts on {rows}x{cols}: exhaustive search is for small meshes; "
                            f"use anneal_placement")
        if not any(remaining):
            out.append(list(acc))
            return
        cell = first_free()
        if cell is None:
            return
        r, c = cell
        for k in (0, 1):
            if remaining[k] == 0:
                continue
            for hh, ww in orients(k):
                if r + hh > rows or c + ww > cols or occ[r:r + hh, c:c + ww].any():
                    continue
                occ[r:r + hh, c:c + ww] = True
                rem = (remaining[0] - (k == 0), remaining[1] - (k == 1))
                rec(rem, waste, acc + [(k, r, c, hh, ww)])
                occ[r:r + hh, c:c + ww] = False
        if waste > 0:
            occ[r, c] = True
            rec(remaining, waste - 1, acc)
            occ[r, c] = False

    if waste0 >= 0:
        rec(counts, waste0, [])
    centre = lambda r, c, h, w: (r + (h - 1) // 2) * cols + (c + (w - 1) // 2)
    pre = np.asarray([[centre(*x[1:]) for x in lay if x[0] == 0] for lay in out], dtype=np.int64).reshape(len(out), n_prefill)
    dec = np.asarray([[centre(*x[1:]) for x in lay if x[0] == 1] for lay in out], dtype=np.int64).reshape(len(out), n_decode)
    return pre, dec, out


# --------------------------------------------------------------------------- TransferCost


def transfer_cost_arrays(prefill_dies, decode_dies, hops, incidence, alpha, xp=jnp):
    """TransferCost from centre dies (the array core, numpy or jax.numpy).

    Args:
      prefill_dies: ``[P]`` centre die of each prefill instance.
      decode_dies: ``[Q]`` centre die of each decode instance (Q >= 1).
      hops: ``[D, D]`` hop matrix.
      incidence: ``[D, D, L]`` XY-route link incidence (:func:`~mocap_jax.wsc.hardware.route_incidence`).
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
    _check_mesh(wafer)
    _check_alpha(alpha)
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
    _check_mesh(wafer)
    _check_alpha(alpha)
    prefill_shape, decode_shape = tuple(prefill_shape), tuple(decode_shape)
    _check_request(wafer, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
    g = _Geometry(wafer)
    cr, cc = (wafer.rows - 1) / 2, (wafer.cols - 1) / 2

    def centre_dist(p):
        r, c, h, w = p
        return abs(r + (h - 1) / 2 - cr) + abs(c + (w - 1) / 2 - cc), (r + (h - 1) / 2 - cr) ** 2 + (c + (w - 1) / 2 - cc) ** 2

    dec_pos = sorted(_positions(wafer, decode_shape), key=lambda p: (centre_dist(p), p))
    pre_pos = _positions(wafer, prefill_shape)
    occ = np.zeros((wafer.rows, wafer.cols), bool)
    nodes = [0]
    cdie = lambda p: (p[0] + (p[2] - 1) // 2) * wafer.cols + (p[1] + (p[3] - 1) // 2)

    def free(p):
        r, c, h, w = p
        return not occ[r:r + h, c:c + w].any()

    def rec(decs, pres):
        nodes[0] += 1
        if nodes[0] > node_budget:
            return None
        if len(decs) == n_decode and len(pres) == n_prefill:
            return decs, pres
        area_left = (n_decode - len(decs)) * decode_shape[0] * decode_shape[1] \
            + (n_prefill - len(pres)) * prefill_shape[0] * prefill_shape[1]
        if area_left > (~occ).sum():
            return None
        if len(decs) < n_decode:
            order = [p for p in dec_pos if free(p)]
            nxt = lambda p: (decs + [p], pres)
        else:
            dec_dies = np.asarray([cdie(p) for p in decs])
            scored = []
            for p in pre_pos:
                if free(p):
                    cost, _, _ = transfer_cost_arrays(np.asarray([cdie(q) for q in pres] + [cdie(p)]), dec_dies,
                                                      g.hops, g.incidence, float(alpha), xp=np)
                    scored.append((float(cost), centre_dist(p), p))
            order = [p for *_, p in sorted(scored)]
            nxt = lambda p: (decs, pres + [p])
        for p in order:
            r, c, h, w = p
            occ[r:r + h, c:c + w] = True
            res = rec(*nxt(p))
            occ[r:r + h, c:c + w] = False
            if res is not None:
                return res
        return None

    res = rec([], [])
    if res is None:
        placed = pack_instances(wafer.rows, wafer.cols, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
        if placed is None:
            raise SpecError(f"cannot pack {n_prefill} x {prefill_shape[0]}x{prefill_shape[1]} prefill and {n_decode} x "
                            f"{decode_shape[0]}x{decode_shape[1]} decode instances on {wafer.name}")
        return _from_packing(wafer, placed, KINDS)
    decs, pres = res
    return Layout(wafer.rows, wafer.cols, tuple(Instance("decode", *p) for p in decs)
                  + tuple(Instance("prefill", *p) for p in pres))


def random_placement(wafer: WaferSpec, prefill_shape, n_prefill: int, decode_shape, n_decode: int,
                     rng: np.random.Generator | int = 0, restarts: int = 500) -> Layout:
    """Instances at uniformly random free positions (random orientation), restarting when stuck.

    Raises:
      SpecError: no random layout found in ``restarts`` tries (the packing is too tight).
    """
    _check_mesh(wafer)
    prefill_shape, decode_shape = tuple(prefill_shape), tuple(decode_shape)
    _check_request(wafer, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
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


# --------------------------------------------------------------------------- annealing


@partial(jax.jit, static_argnames=("rows", "cols", "steps", "rotate"))
def _anneal(pos0, key, base_h, base_w, is_pre, hops, incidence, alpha, temps, rows, cols, steps, rotate):
    """Annealing chains (``pos0`` ``[C, N, 3]``: row, col, rotated; ``alpha`` ``[C]``) -> best positions, costs."""
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

    def cost_at(pos, alpha):
        h, w = dims(pos)
        die = jnp.clip(pos[:, 0] + (h - 1) // 2, 0, rows - 1) * cols + jnp.clip(pos[:, 1] + (w - 1) // 2, 0, cols - 1)
        dist = hops[die][:, die]                                  # [N, N]
        dist = jnp.where(is_pre[None, :], jnp.iinfo(jnp.int32).max, dist)  # targets must be decode instances
        nearest = jnp.argmin(dist, axis=1)
        routes = incidence[die, die[nearest]].astype(alpha.dtype)  # [N, L]
        use = jnp.sum(jnp.where(is_pre[:, None], routes, 0.0), axis=0)
        return jnp.sum(jnp.where(use > 0, use * alpha ** jnp.maximum(use - 1, 0), 0.0))

    def chain(p0, k, alpha):
        cost = partial(cost_at, alpha=alpha)
        c0 = cost(p0)

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
            # region swap: instance i moves to a target rectangle T of its own (oriented) shape,
            # and every instance lying wholly inside T moves by the opposite offset into i's old place.
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
            cp = jnp.where(ok, cost(prop), jnp.inf)
            u = jax.random.uniform(jax.random.fold_in(k, 1))
            accept = ok & ((cp <= c) | (u < jnp.exp(-(cp - c) / temp)))
            pos = jnp.where(accept, prop, pos)
            c = jnp.where(accept, cp, c)
            better = c < best_c
            return (pos, c, jnp.where(better, pos, best_pos), jnp.where(better, c, best_c)), None

        keys = jax.random.split(k, steps)
        (pos, c, best_pos, best_c), _ = jax.lax.scan(step, (p0, c0, p0, c0), (keys, temps))
        return best_pos, best_c

    return jax.vmap(chain)(pos0, jax.random.split(key, pos0.shape[0]), alpha)


@dataclass
class AnnealResult:
    layout: Layout
    cost: float
    chain_costs: list[float]
    runtime_s: float


def anneal_placements(wafer: WaferSpec, starts: Sequence[Layout], alphas: Sequence[float], chains: int = 32,
                      steps: int = 2000, seed: int = 0, t_start: float = 2.0,
                      t_end: float = 0.01) -> list[AnnealResult]:
    """Simulated annealing of TransferCost for several alphas as one vmapped program.

    For each ``alphas[k]``, ``chains`` chains run: one from ``starts[k]``, the others from
    random layouts (shared by all alphas; ``starts[k]`` when none can be drawn).
    Temperature cools geometrically from ``t_start`` to ``t_end`` (hop units).  A fixed
    seed gives the same answer.

    Returns:
      one :class:`AnnealResult` per alpha (its best chain; never worse than its start).
    """
    _check_mesh(wafer)
    if len(starts) != len(alphas) or not alphas:
        raise SpecError("give one start layout per alpha (and at least one alpha)")
    for a in alphas:
        _check_alpha(a)
    for name, v in (("chains", chains), ("steps", steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise SpecError(f"{name} must be a positive integer, got {v!r}")
    if not (t_start > 0 and t_end > 0):
        raise SpecError("annealing temperatures must be positive")
    t0 = time.perf_counter()
    insts = list(starts[0].instances)
    pre = [i for i in insts if i.kind == "prefill"]
    dec = [i for i in insts if i.kind == "decode"]
    if not pre or not dec:
        return [AnnealResult(l, 0.0, [0.0], 0.0) for l in starts]
    base_h = np.asarray([i.rows for i in insts])
    base_w = np.asarray([i.cols for i in insts])
    is_pre = np.asarray([i.kind == "prefill" for i in insts])
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
        return np.asarray(rows_, dtype=np.int32)

    rng = np.random.default_rng(seed)
    p_shape, d_shape = (pre[0].rows, pre[0].cols), (dec[0].rows, dec[0].cols)
    randoms = []
    for _ in range(chains - 1):
        try:
            randoms.append(encode(random_placement(wafer, p_shape, len(pre), d_shape, len(dec), rng, restarts=50)))
        except SpecError:
            randoms.append(None)
    pos0, alpha_c = [], []
    for lay, a in zip(starts, alphas):
        own = encode(lay)
        pos0 += [own] + [own if x is None else x for x in randoms]
        alpha_c += [float(a)] * chains
    g = _Geometry(wafer)
    temps = np.geomspace(t_start, t_end, steps)
    best_pos, best_c = _anneal(jnp.asarray(np.stack(pos0)), jax.random.PRNGKey(seed), jnp.asarray(base_h),
                               jnp.asarray(base_w), jnp.asarray(is_pre), jnp.asarray(g.hops),
                               jnp.asarray(g.incidence), jnp.asarray(alpha_c), jnp.asarray(temps),
                               wafer.rows, wafer.cols, steps, 1)
    best_pos = np.asarray(best_pos).reshape(len(alphas), chains, len(insts), 3)
    best_c = np.asarray(best_c).reshape(len(alphas), chains)
    elapsed = time.perf_counter() - t0
    out = []
    for a_i, a in enumerate(alphas):
        k = int(np.argmin(best_c[a_i]))
        layout = Layout(wafer.rows, wafer.cols, tuple(
            Instance(ref.kind, int(p[0]), int(p[1]), ref.cols if p[2] else ref.rows, ref.rows if p[2] else ref.cols)
            for ref, p in zip(insts, best_pos[a_i, k])))
        cost = transfer_cost(wafer, layout, a).cost
        out.append(AnnealResult(layout, cost, [float(c) for c in best_c[a_i]], elapsed))
    return out


def anneal_placement(wafer: WaferSpec, layout0: Layout, alpha: float = 1.0, chains: int = 32, steps: int = 2000,
                     seed: int = 0, t_start: float = 2.0, t_end: float = 0.01) -> AnnealResult:
    """Simulated annealing of TransferCost from ``layout0`` and ``chains - 1`` random layouts.

    See :func:`anneal_placements` (this is its one-alpha case).
    """
    return anneal_placements(wafer, [layout0], [alpha], chains, steps, seed, t_start, t_end)[0]


def exhaustive_placement(wafer: WaferSpec, prefill_shape, n_prefill: int, decode_shape, n_decode: int,
                         alpha: float = 1.0, max_layouts: int = 200_000) -> tuple[Layout, float, int]:
    """The TransferCost optimum over every layout (small meshes only).

    Returns:
      (best layout, its cost, number of layouts enumerated).
    """
    _check_mesh(wafer)
    _check_alpha(alpha)
    prefill_shape, decode_shape = tuple(prefill_shape), tuple(decode_shape)
    _check_request(wafer, [(prefill_shape, n_prefill), (decode_shape, n_decode)])
    pre, dec, layouts = enumerate_layouts(wafer, prefill_shape, n_prefill, decode_shape, n_decode, max_layouts)
    if not layouts:
        raise SpecError(f"these instances cannot be packed on {wafer.name}")
    g = _Geometry(wafer)
    costs = jax.vmap(lambda p, d: transfer_cost_arrays(p, d, jnp.asarray(g.hops), jnp.asarray(g.incidence),
                                                       jnp.asarray(float(alpha)))[0])(jnp.asarray(pre), jnp.asarray(dec))
    costs = np.asarray(costs)
    k = int(np.argmin(costs))
    layout = _from_packing(wafer, layouts[k], KINDS)
    return layout, float(transfer_cost(wafer, layout, alpha).cost), len(layouts)


# --------------------------------------------------------------------------- comparison


@dataclass
class PlacementComparison:
    alpha: float
    decode_centred: float
    random_mean: float
    random_std: float
    random_min: float
    searched: float
    search_method: str

    def to_dict(self):
        return dict(self.__dict__)


def compare_placements(wafer: WaferSpec, prefill_shape, n_prefill: int, decode_shape, n_decode: int,
                       alphas: Sequence[float] = (1.0, 1.5, 2.0, 3.0), random_samples: int = 100, chains: int = 32,
                       steps: int = 2000, seed: int = 0, exhaustive_limit: int = 20_000):
    """Alpha sensitivity: TransferCost of decode-centred, random and searched placements per alpha.

    The searched optimum is exhaustive when the mesh has at most ``exhaustive_limit``
    layouts, annealing otherwise.

    Returns:
      (rows ``[PlacementComparison]``, best layouts per alpha ``{alpha: Layout}``).
    """
    for a in alphas:
        _check_alpha(a)
    rng = np.random.default_rng(seed)
    randoms = []
    for _ in range(random_samples):
        try:
            randoms.append(random_placement(wafer, prefill_shape, n_prefill, decode_shape, n_decode, rng, restarts=50))
        except SpecError:
            break
    try:
        pre, dec, layouts = enumerate_layouts(wafer, tuple(prefill_shape), n_prefill, tuple(decode_shape), n_decode,
                                              exhaustive_limit)
        exhaustive = True
    except SpecError:
        exhaustive = False
    rows, best = [], {}
    heuristics = [decode_centred_placement(wafer, prefill_shape, n_prefill, decode_shape, n_decode, a) for a in alphas]
    annealed = None if exhaustive else anneal_placements(wafer, heuristics, alphas, chains, steps, seed)
    for k, a in enumerate(alphas):
        dc = heuristics[k]
        c_dc = transfer_cost(wafer, dc, a).cost
        rc = np.asarray([transfer_cost(wafer, l, a).cost for l in randoms]) if randoms else np.asarray([np.nan])
        if exhaustive:
            lay, c_s, _ = exhaustive_placement(wafer, prefill_shape, n_prefill, decode_shape, n_decode, a,
                                               exhaustive_limit)
            method = "exhaustive"
        else:
            lay, c_s, method = annealed[k].layout, annealed[k].cost, "anneal"
        best[a] = lay
        rows.append(PlacementComparison(float(a), c_dc, float(rc.mean()), float(rc.std()), float(rc.min()), c_s,
                                        method))
    return rows, best


# --------------------------------------------------------------------------- figure


def plot_placement(wafer: WaferSpec, layout: Layout, path, alpha: float = 1.0, title: str | None = None):
    """Draw the wafer, its instances and the KV routes (prefill centre -> nearest decode centre).

    Link width grows with the number of transfers sharing it.  Saves to ``path``
    (any format matplotlib knows, from the suffix) and returns the path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from pathlib import Path

    rep = transfer_cost(wafer, layout, alpha)
    fig, ax = plt.subplots(figsize=(0.9 * wafer.cols + 1.5, 0.9 * wafer.rows + 1.2))
    for r in range(wafer.rows):
        for c in range(wafer.cols):
            ax.add_patch(Rectangle((c - 0.45, r - 0.45), 0.9, 0.9, fc="#f2f2f2", ec="#bbbbbb", lw=0.5))
    colours = {"prefill": "#f4a259", "decode": "#5b8e7d"}
    counters = {"prefill": 0, "decode": 0}
    for inst in layout.instances:
        ax.add_patch(Rectangle((inst.col - 0.48, inst.row - 0.48), inst.cols - 0.04, inst.rows - 0.04,
                               fc=colours[inst.kind], ec="black", lw=1.2, alpha=0.75))
        cr, cc = inst.centre
        ax.text(inst.col + (inst.cols - 1) / 2, inst.row + (inst.rows - 1) / 2 + 0.27,
                f"{inst.kind[0].upper()}{counters[inst.kind]}", ha="center", va="center", fontsize=8, weight="bold",
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.6))
        ax.plot(cc, cr, "k.", ms=4)
        counters[inst.kind] += 1
    for (a, b), u in rep.link_use.items():
        ra, ca = divmod(a, wafer.cols)
        rb, cb = divmod(b, wafer.cols)
        off = 0.08 if (b > a) else -0.08  # keep the two directions apart
        dx, dy = (0, off) if ra == rb else (off, 0)
        ax.annotate("", xy=(cb + dx, rb + dy), xytext=(ca + dx, ra + dy),
                    arrowprops=dict(arrowstyle="-|>", color="#c0392b" if u > 1 else "#2c3e50", lw=1.0 + 1.2 * (u - 1),
                                    shrinkA=0, shrinkB=0))
    ax.set_xlim(-0.6, wafer.cols - 0.4)
    ax.set_ylim(wafer.rows - 0.4, -0.6)
    ax.set_aspect("equal")
    ax.set_xticks(range(wafer.cols))
    ax.set_yticks(range(wafer.rows))
    ax.set_xlabel("die column")
    ax.set_ylabel("die row")
    ax.set_title(title or f"{wafer.name}: TransferCost {rep.cost:.1f} (alpha={alpha:g}, hops {rep.hop_sum}, "
                          f"shared links {rep.shared_links})", fontsize=9)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(fc=colours["prefill"], ec="black", label="prefill instance"),
                       Patch(fc=colours["decode"], ec="black", label="decode instance"),
                       Line2D([], [], color="#2c3e50", label="KV route"),
                       Line2D([], [], color="#c0392b", lw=2.2, label="shared link")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


__all__ = [
    "Instance", "Layout", "TransferReport", "AnnealResult", "PlacementComparison", "pack_instances",
    "enumerate_layouts", "transfer_cost_arrays", "transfer_cost", "decode_centred_placement", "random_placement",
    "anneal_placement", "anneal_placements", "exhaustive_placement", "compare_placements", "plot_placement",
]
