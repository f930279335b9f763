"""Die grid geometry and dimension-order (XY) routing.

Host-side NumPy helpers: they turn a :class:`~mocap_jax.specs.HardwareSpec` and a
stage-to-die map into the small arrays the jitted kernels consume (hop counts and
bottleneck bandwidths of each route).

Dies are numbered row-major over the global grid of ``rows x (cols * wafers)``
dies; wafers sit side by side along the column axis.  A directed link is the pair
``(from_die, to_die)`` of two neighbours.  XY routing moves along the row (column
index changes) first, then along the column.  On a ``switch`` topology (a GPU node)
every pair of distinct devices is one hop apart over its own NVLink port (or, between
two nodes, over the nodes' network).
"""

from __future__ import annotations

import functools

import numpy as np

from .hardware import HardwareSpec


def die_coords(hw: HardwareSpec) -> np.ndarray:
    """(row, col) of every die on the global grid, shape ``[num_dies, 2]``."""
    idx = np.arange(hw.num_dies)
    return np.stack([idx // hw.grid_cols, idx % hw.grid_cols], axis=1)


def die_index(hw: HardwareSpec, row: int, col: int) -> int:
    return int(row) * hw.grid_cols + int(col)


def xy_route(hw: HardwareSpec, src: int, dst: int) -> list[tuple[int, int]]:
    """Directed links of the XY route from die ``src`` to die ``dst`` (empty if equal)."""
    if src == dst:
        return []
    if hw.topology == "switch":
        return [(int(src), int(dst))]
    r0, c0 = divmod(int(src), hw.grid_cols)
    r1, c1 = divmod(int(dst), hw.grid_cols)
    links = []
    r, c = r0, c0
    step = 1 if c1 > c else -1
    while c != c1:
        links.append((die_index(hw, r, c), die_index(hw, r, c + step)))
        c += step
    step = 1 if r1 > r else -1
    while r != r1:
        links.append((die_index(hw, r, c), die_index(hw, r + step, c)))
        r += step
    return links


def link_bandwidth(hw: HardwareSpec, link: tuple[int, int]) -> float:
    """Raw bandwidth (bytes/s, one direction) of one directed link (on a switch: of the
    sender's port, NVLink inside a node, the network between nodes)."""
    ca = link[0] % hw.grid_cols
    cb = link[1] % hw.grid_cols
    crosses = (ca // hw.cols) != (cb // hw.cols)
    return hw.cross_wafer_bandwidth if crosses else hw.link_bandwidth


def hop_matrix(hw: HardwareSpec) -> np.ndarray:
    """Hop count between every pair of dies, shape ``[D, D]`` (Manhattan distance on a mesh)."""
    if hw.topology == "switch":
        return 1 - np.eye(hw.num_dies, dtype=np.int64)
    xy = die_coords(hw)
    return np.abs(xy[:, None, :] - xy[None, :, :]).sum(-1)


def route_bandwidth(hw: HardwareSpec, src: int, dst: int) -> float:
    """Bottleneck raw bandwidth along the XY route (``inf`` for src == dst)."""
    links = xy_route(hw, src, dst)
    if not links:
        return float("inf")
    return min(link_bandwidth(hw, l) for l in links)


def snake_placement(hw: HardwareSpec, num_stages: int | None = None) -> np.ndarray:
    """Boustrophedon stage-to-die map: row 0 left to right, row 1 right to left, ...

    Returns ``die[s]`` for ``s < num_stages`` (default: every die), shape ``[N]``.
    """
    n = hw.num_dies if num_stages is None else int(num_stages)
    if n > hw.num_dies:
        raise ValueError(f"{n} stages do not fit {hw.num_dies} dies of {hw.name}")
    order = []
    for r in range(hw.rows):
        cols = range(hw.grid_cols) if r % 2 == 0 else range(hw.grid_cols - 1, -1, -1)
        order.extend(die_index(hw, r, c) for c in cols)
    return np.asarray(order[:n], dtype=np.int64)


def handoff_routes(hw: HardwareSpec, placement: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hops and bottleneck raw bandwidth of each hand-off stage s -> s+1.

    Returns:
      hops: ``[N]`` int, entry N-1 is 0 (no hand-off after the last stage).
      bandwidth: ``[N]`` float bytes/s, entry N-1 is ``inf``.
    """
    placement = np.asarray(placement)
    n = len(placement)
    hops = np.zeros(n, dtype=np.int64)
    bw = np.full(n, np.inf)
    hm = hop_matrix(hw)
    for s in range(n - 1):
        a, b = int(placement[s]), int(placement[s + 1])
        hops[s] = hm[a, b]
        bw[s] = route_bandwidth(hw, a, b)
    return hops, bw


def link_loads(hw: HardwareSpec, transfers: list[tuple[int, int]], weights=None) -> dict[tuple[int, int], float]:
    """Sum of transfer weights crossing each directed link under XY routing."""
    loads: dict[tuple[int, int], float] = {}
    weights = [1.0] * len(transfers) if weights is None else weights
    for (a, b), w in zip(transfers, weights):
        for l in xy_route(hw, a, b):
            loads[l] = loads.get(l, 0.0) + float(w)
    return loads


def route_matrices(hw: HardwareSpec, placement, pairs=None, n_pad: int | None = None, dtype=np.float32):
    """Hops and bandwidth of the route between every two stages when transfers share links,
    ``([N_pad, N_pad], [N_pad, N_pad])``.

    The transfers that run at once are every pipeline hand-off (stage s -> s+1) and the given
    stage ``pairs`` (both directions, each pair once); a route's bandwidth is the smallest over
    its links of ``link bandwidth / transfers using the link``.  Padding and the diagonal hold 0
    hops and bandwidth 1.  Memoised; callers get fresh copies.
    """
    placement = tuple(int(d) for d in np.asarray(placement))
    n_pad = len(placement) if n_pad is None else int(n_pad)
    key = None if pairs is None else tuple(sorted({tuple(sorted((int(a), int(b)))) for a, b in pairs}))
    hops, bw = _route_matrices(hw, placement, key, n_pad, np.dtype(dtype).str)
    return hops.copy(), bw.copy()


@functools.lru_cache(maxsize=256)
def _route_matrices(hw: HardwareSpec, placement: tuple, pairs: tuple | None, n_pad: int, dtype: str):
    n = len(placement)
    routes = [(placement[s], placement[s + 1]) for s in range(n - 1)]
    for a, b in pairs or ():
        if a != b and 0 <= a < n and 0 <= b < n:
            routes += [(placement[a], placement[b]), (placement[b], placement[a])]
    share: dict = {}
    for a, b in routes:
        for link in xy_route(hw, a, b):
            share[link] = share.get(link, 0) + 1
    hops = np.zeros((n_pad, n_pad))
    bw = np.ones((n_pad, n_pad))
    hm = hop_matrix(hw)
    for i in range(n):
        for j in range(n):
            if i != j:
                a, b = placement[i], placement[j]
                hops[i, j] = hm[a, b]
                bw[i, j] = min(link_bandwidth(hw, link) / max(share.get(link, 0), 1) for link in xy_route(hw, a, b))
    return hops.astype(dtype), bw.astype(dtype)


def shared_handoff_bandwidth(hw: HardwareSpec, placement, n_pad: int | None = None, dtype=np.float32) -> np.ndarray:
    """``[N_pad]`` bytes/s of each hand-off route s -> s+1 while every hand-off runs at once (links
    shared among the hand-off routes that use them); 1 where there is no hand-off."""
    n = len(placement)
    _, bw = route_matrices(hw, placement, None, n_pad, dtype)
    out = np.ones(bw.shape[0], dtype)
    out[: n - 1] = bw[np.arange(n - 1), np.arange(1, n)]
    return out
# --------------------------------------------------------------------------- stage groups (tensor parallelism)


def ring_order(rows: int, cols: int) -> list[tuple[int, int]]:
    """Cells of a ``rows x cols`` rectangle in ring order.

    A Hamiltonian cycle of neighbours when one side is even and both are >= 2 (every
    ring step is one hop); otherwise a boustrophedon path whose closing step is longer.
    """
    if rows == 1 or cols == 1:
        return [(r, c) for r in range(rows) for c in range(cols)]
    if rows % 2 and not cols % 2:
        return [(r, c) for c, r in ring_order(cols, rows)]
    if rows % 2 == 0:
        cells = [(0, c) for c in range(cols)]
        for r in range(1, rows):
            cells += [(r, c) for c in (range(cols - 1, 0, -1) if r % 2 else range(1, cols))]
        return cells + [(r, 0) for r in range(rows - 1, 0, -1)]
    return [(r, c) for r in range(rows) for c in (range(cols) if r % 2 == 0 else range(cols - 1, -1, -1))]


def _group_shape(hw: HardwareSpec, tp: int) -> tuple[int, int]:
    """The ``r x c`` rectangle (``r * c = tp``) that tiles the grid with the cheapest ring.

    Preference: every ring step one hop (a Hamiltonian ring), then the squarest shape.
    """
    shapes = [(r, tp // r) for r in range(1, tp + 1)
              if tp % r == 0 and hw.rows % r == 0 and hw.grid_cols % (tp // r) == 0]
    if not shapes:
        raise ValueError(f"no rectangle of {tp} dies tiles the {hw.rows}x{hw.grid_cols} grid of {hw.name}; "
                         f"choose a tensor-parallel degree that is a product of divisors of the rows and columns")

    def cost(shape):
        r, c = shape
        ring = ring_order(r, c)
        longest = max(abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in zip(ring, ring[1:] + ring[:1])) if tp > 1 else 0
        return longest, abs(r - c), r
    return min(shapes, key=cost)


def group_tiles(hw: HardwareSpec, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """The tiles stage groups of ``tp`` dies occupy on a mesh, and their default order.

    The grid is cut into ``r x c`` rectangles (:func:`_group_shape`), numbered row-major over
    the ``rows / r x grid_cols / c`` grid of tiles.  Returns ``dies [T, tp]`` (each tile's dies
    in ring order, so rank ``k`` sits at the same offset in every tile) and ``snake [T]`` (tile
    numbers in boustrophedon order, consecutive tiles neighbours).
    """
    r, c = _group_shape(hw, int(tp))
    ring = ring_order(r, c)
    tile_rows, tile_cols = hw.rows // r, hw.grid_cols // c
    dies = [[die_index(hw, tr * r + dr, tc * c + dc) for dr, dc in ring]
            for tr in range(tile_rows) for tc in range(tile_cols)]
    snake = [tr * tile_cols + (tc if tr % 2 == 0 else tile_cols - 1 - tc)
             for tr in range(tile_rows) for tc in range(tile_cols)]
    return np.asarray(dies, dtype=np.int64), np.asarray(snake, dtype=np.int64)


def stage_groups(hw: HardwareSpec, num_stages: int, tp: int) -> np.ndarray:
    """Default dies of each stage group, ``[N, tp]`` die indices, each row in ring order.

    On a switch: consecutive devices (a group stays inside a node when ``tp`` divides the
    node size).  On a mesh: ``r x c`` rectangles (:func:`group_tiles`) visited in
    boustrophedon order over the grid of rectangles, so consecutive stage groups are
    neighbours.  ``tp = 1`` gives :func:`snake_placement` as a column.
    """
    n, tp = int(num_stages), int(tp)
    if n * tp > hw.num_dies:
        raise ValueError(f"{n} stages of {tp} dies need {n * tp} dies but {hw.name} has {hw.num_dies}; "
                         f"use fewer stages or a smaller tensor-parallel degree")
    if hw.topology == "switch":
        return np.arange(n * tp, dtype=np.int64).reshape(n, tp)
    if tp == 1:
        return snake_placement(hw, n)[:, None]
    dies, snake = group_tiles(hw, tp)
    return dies[snake[:n]]


def _shared_bandwidth(hw: HardwareSpec, route: list[tuple[int, int]], loads: dict) -> float:
    return min(link_bandwidth(hw, l) / max(loads.get(l, 0.0), 1.0) for l in route)


def group_rings(hw: HardwareSpec, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ring profile of every stage group, for its collectives.

    The ring visits a group's dies in the order listed and closes back to the first; all
    groups' rings run at once.  Returns ``hops [N]`` (longest ring step, 0 for one die) and
    ``bandwidth [N]`` (bytes/s: the slowest ring step's bottleneck link bandwidth divided
    by the ring steps sharing that link; 1 for one die).
    """
    groups = np.asarray(groups)
    steps = [[(int(g[i]), int(g[(i + 1) % len(g)])) for i in range(len(g))] if len(g) > 1 else [] for g in groups]
    loads = link_loads(hw, [s for ring in steps for s in ring])
    hm = hop_matrix(hw)
    hops = np.array([max((hm[a, b] for a, b in ring), default=0) for ring in steps], dtype=np.float64)
    bw = np.array([min((_shared_bandwidth(hw, xy_route(hw, a, b), loads) for a, b in ring), default=1.0)
                   for ring in steps])
    return hops, bw


def group_routes(hw: HardwareSpec, groups: np.ndarray, partner=None) -> tuple[np.ndarray, np.ndarray]:
    """Hop and bandwidth matrices between stage groups, ``[N, N]`` each.

    A transfer from group ``i`` to group ``j`` runs rank to rank (die ``k`` of ``i`` to die
    ``k`` of ``j``), each rank carrying ``1/t`` of the data, all ranks at once.  Links are
    shared among the concurrent transfers: every hand-off ``s -> s+1`` and, if ``partner``
    (``[N]``, -1 for none) is given, every pair route ``s -> partner[s]``.  Entry ``[i, j]``
    holds the longest rank route in hops and the aggregate bandwidth, ``t x`` the slowest
    rank route's share of its bottleneck link.  With one die per group these are the
    hop counts and shared route bandwidths of single-die stages.
    """
    groups = np.asarray(groups)
    n, t = groups.shape
    pairs = [(s, s + 1) for s in range(n - 1)]
    if partner is not None:
        pairs += [(s, int(q)) for s, q in enumerate(np.asarray(partner)) if 0 <= int(q) < n and int(q) != s]
    loads = link_loads(hw, [(int(groups[a, k]), int(groups[b, k])) for a, b in pairs for k in range(t)])
    hm = hop_matrix(hw)
    hops = np.zeros((n, n))
    bw = np.ones((n, n))
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            ranks = [(int(groups[i, k]), int(groups[j, k])) for k in range(t)]
            hops[i, j] = max(hm[a, b] for a, b in ranks)
            bw[i, j] = t * min(_shared_bandwidth(hw, xy_route(hw, a, b), loads) for a, b in ranks)
    return hops, bw
