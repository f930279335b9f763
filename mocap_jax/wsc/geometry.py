"""Die geometry of a WSC-LLM hardware point: hops, XY routes and the link resources traffic shares.

Dies are numbered row-major (``die = row x cols + col``; on a cluster ``node x gpus + gpu``).

Two views of the links:

* :func:`directed_links` / :func:`route_incidence` -- every directed neighbour link of a mesh
  in a fixed order, and which of them each XY route uses (the placement's TransferCost);
* *link resources* -- what concurrent traffic shares in the serving simulation, indexed
  ``kind x D + die`` for ``kind`` in :data:`LINK_KINDS` (``L = 4 D`` entries, some unused):
  on a mesh the link leaving a die to its east, west, south or north neighbour; on a cluster
  each GPU's NVLink egress and ingress port and its network egress and ingress port.  A route
  from die ``a`` to die ``b`` is the list of resources it crosses (:func:`route_resources`):
  the XY route on a mesh (columns first, then rows), ``a``'s egress and ``b``'s ingress port
  on a cluster (NVLink inside a node, the network between nodes).

Host-side NumPy only; the serving simulation receives the tables built here as arrays.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from ..specs import SpecError
from ..specs import mesh as _mesh
from .hardware import WaferSpec

#: Link resources per die, in index order (mesh names; cluster: NVLink out, NVLink in, network out, network in).
LINK_KINDS = ("east", "west", "south", "north")


def die_coords(w: WaferSpec) -> np.ndarray:
    """(row, col) of every die, row-major numbering, shape ``[D, 2]``."""
    idx = np.arange(w.num_dies)
    return np.stack([idx // w.cols, idx % w.cols], axis=1)


def hop_matrix(w: WaferSpec) -> np.ndarray:
    """Hop count between every pair of dies, ``[D, D]`` int.

    Mesh: Manhattan distance (XY routing, :func:`mocap_jax.specs.mesh.hop_matrix`).
    Cluster: 0 on the diagonal, 1 elsewhere (one NVLink hop inside a node, one network
    hop between nodes; see :func:`crosses_nodes` for which).
    """
    if w.is_mesh:
        return _mesh.hop_matrix(w.mesh_spec())
    return 1 - np.eye(w.num_dies, dtype=np.int64)


def crosses_nodes(w: WaferSpec) -> np.ndarray:
    """``[D, D]`` bool: the route between the two dies leaves a node (always False on a mesh)."""
    if w.is_mesh:
        return np.zeros((w.num_dies, w.num_dies), dtype=bool)
    node = np.arange(w.num_dies) // w.cols
    return node[:, None] != node[None, :]


def directed_links(w: WaferSpec) -> list[tuple[int, int]]:
    """Every directed neighbour link of a mesh, in a fixed order (``[(from_die, to_die), ...]``)."""
    if not w.is_mesh:
        raise SpecError(f"{w.name}: directed_links applies to mesh wafers, not to a GPU cluster")
    links = []
    for r in range(w.rows):
        for c in range(w.cols):
            d = r * w.cols + c
            if c + 1 < w.cols:
                links += [(d, d + 1), (d + 1, d)]
            if r + 1 < w.rows:
                links += [(d, d + w.cols), (d + w.cols, d)]
    return links


def route_incidence(w: WaferSpec) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """XY-route incidence of every die pair: ``inc[src, dst, l] = 1`` when link ``l`` is on the route.

    Returns:
      (incidence ``[D, D, L]`` uint8, links ``[(from, to)] * L``).
    """
    links = directed_links(w)
    index = {l: i for i, l in enumerate(links)}
    spec = w.mesh_spec()
    d = w.num_dies
    inc = np.zeros((d, d, len(links)), dtype=np.uint8)
    for a in range(d):
        for b in range(d):
            for l in _mesh.xy_route(spec, a, b):
                inc[a, b, index[l]] = 1
    return inc, links


# --------------------------------------------------------------------------- link resources


def resource_incidence(w: WaferSpec) -> np.ndarray:
    """``[D, D, 4 D]`` uint8: 1 where the route from die ``a`` to die ``b`` crosses resource ``l``.

    Computed once per grid and topology (the bandwidths do not matter); treat it as read-only.
    """
    return _incidence(w.rows, w.cols, w.is_mesh)


@functools.lru_cache(maxsize=64)
def _incidence(rows: int, cols: int, is_mesh: bool) -> np.ndarray:
    d = rows * cols
    inc = np.zeros((d, d, 4 * d), dtype=np.uint8)
    a, b = np.divmod(np.arange(d * d), d)
    if not is_mesh:
        same = a // cols == b // cols
        off = a != b
        inc[a[off & same], b[off & same], a[off & same]] = 1
        inc[a[off & same], b[off & same], d + b[off & same]] = 1
        inc[a[off & ~same], b[off & ~same], 2 * d + a[off & ~same]] = 1
        inc[a[off & ~same], b[off & ~same], 3 * d + b[off & ~same]] = 1
        inc.setflags(write=False)
        return inc
    for src in range(d):
        r0, c0 = divmod(src, cols)
        for dst in range(d):
            r1, c1 = divmod(dst, cols)
            row = inc[src, dst]
            if c1 > c0:    # east along row r0, columns c0 .. c1 - 1
                row[0 * d + r0 * cols + c0:0 * d + r0 * cols + c1] = 1
            elif c1 < c0:  # west along row r0, from columns c0 down to c1 + 1
                row[1 * d + r0 * cols + c1 + 1:1 * d + r0 * cols + c0 + 1] = 1
            if r1 > r0:    # south along column c1
                row[2 * d + np.arange(r0, r1) * cols + c1] = 1
            elif r1 < r0:  # north along column c1
                row[3 * d + np.arange(r1 + 1, r0 + 1) * cols + c1] = 1
    inc.setflags(write=False)
    return inc


def route_resources(w: WaferSpec, a: int, b: int) -> list[int]:
    """Link resources the route from die ``a`` to die ``b`` crosses (empty when ``a == b``)."""
    return [int(l) for l in np.flatnonzero(resource_incidence(w)[a, b])]


def link_capacity(w: WaferSpec) -> np.ndarray:
    """Raw bandwidth (bytes/s) of every link resource ``[4 D]``; 0 where the link does not exist.

    Mesh: ``link_bandwidth`` for each neighbour link.  Cluster: ``link_bandwidth`` for the
    NVLink ports, ``node_bandwidth`` for the network ports (a single node has none).
    """
    d = w.num_dies
    cap = np.zeros(4 * d)
    if not w.is_mesh:
        cap[:2 * d] = w.link_bandwidth
        if w.rows > 1:
            cap[2 * d:] = w.node_bandwidth
        return cap
    rr, cc = np.divmod(np.arange(d), w.cols)
    cap[0 * d:1 * d] = np.where(cc + 1 < w.cols, w.link_bandwidth, 0.0)
    cap[1 * d:2 * d] = np.where(cc > 0, w.link_bandwidth, 0.0)
    cap[2 * d:3 * d] = np.where(rr + 1 < w.rows, w.link_bandwidth, 0.0)
    cap[3 * d:4 * d] = np.where(rr > 0, w.link_bandwidth, 0.0)
    return cap


def ring_resource_uses(w: WaferSpec, ring_dies: Sequence[Sequence[int]]) -> np.ndarray:
    """How many ring steps cross each link resource ``[4 D]`` (concurrent rings of one collective).

    ``ring_dies``: each ring's dies in ring order; step ``k`` goes from member ``k`` to member
    ``k + 1`` (the last back to the first).
    """
    inc = resource_incidence(w)
    uses = np.zeros(4 * w.num_dies, dtype=np.int64)
    for ring in ring_dies:
        if len(ring) < 2:
            continue
        ring = np.asarray(ring, dtype=np.int64)
        uses += inc[ring, np.roll(ring, -1)].sum(axis=0, dtype=np.int64)
    return uses


def transfer_resource_counts(w: WaferSpec, sources: Sequence[int]) -> np.ndarray:
    """``[D, 4 D]`` int: for each target die, how many source dies' routes to it cross each resource.

    A KV transfer from an instance whose dies are ``sources`` moves ``1 / len(sources)`` of the
    bytes bound for die ``d`` from every source die, so the bytes on resource ``l`` are
    ``sum_d bytes_d x counts[d, l] / len(sources)``.
    """
    return resource_incidence(w)[np.asarray(sources, dtype=np.int64)].sum(axis=0, dtype=np.int64)


def nearest_die(w: WaferSpec, dies: Sequence[int]) -> np.ndarray:
    """``[D]``: for every die, the die of ``dies`` fewest hops away (ties: the first listed)."""
    hm = hop_matrix(w)
    dies = np.asarray(dies, dtype=np.int64)
    return dies[np.argmin(hm[:, dies], axis=1)]


def read_resource_table(w: WaferSpec, dies: Sequence[int]) -> np.ndarray:
    """``[D, 4 D]`` 0/1: the resources on the route from each die to the nearest die of ``dies``.

    The route remote KV reads of an instance on ``dies`` take (rows of its own dies are zero).
    """
    return resource_incidence(w)[np.arange(w.num_dies), nearest_die(w, dies)].astype(np.int64)


__all__ = [
    "LINK_KINDS", "die_coords", "hop_matrix", "crosses_nodes", "directed_links", "route_incidence",
    "resource_incidence", "route_resources",
    "link_capacity", "ring_resource_uses", "transfer_resource_counts", "nearest_die", "read_resource_table",
]
