"""Instance layouts on a mesh wafer: instances, validated layouts, exact rectangle packing.

A :class:`Layout` puts rectangular prefill and decode instances on a ``rows x cols`` mesh
without overlap.  Each instance is represented by its *centre die*
``(row + (h - 1) // 2, col + (w - 1) // 2)`` (the geometric centre, rounded up-left).
:func:`pack_instances` is the exact rectangle packer the partition uses for counts;
:func:`enumerate_layouts` lists every layout of a small mesh for exhaustive search.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..specs import SpecError, checks
from .hardware import WaferSpec

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


def check_mesh(wafer: WaferSpec):
    if not wafer.is_mesh:
        raise SpecError(f"placement is defined on a mesh wafer; {wafer.name} is a GPU cluster "
                        f"(every GPU pair is one hop apart there)")


#: the largest shared-link factor accepted.  The study's factors are 1-3 (``robustness.ALPHAS``); up to
#: 100 the placement search's float32 cost ``u * alpha ** (u - 1)`` stays finite on links shared by up to
#: 19 transfers, while at 1e20 that search overflowed on the 6x9 wafer and returned a placement worse
#: than the best of 50 random ones.
ALPHA_MAX = 100.0


def check_alpha(alpha, name: str = "alpha") -> float:
    """The TransferCost factor per extra use of a shared link, in ``[1, ALPHA_MAX]``."""
    return checks.number(name, alpha, 1.0, ALPHA_MAX, hint=" alpha is the cost factor per extra use of a shared "
                                                          "link (1: plain hop counts).")


def check_request(wafer: WaferSpec, shapes_counts):
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
    key = tuple((tuple(int(v) for v in s), int(n)) for s, n in items)
    placed = _pack(int(rows), int(cols), key, bool(allow_rotation), int(node_budget))
    return None if placed is None else list(placed)


@functools.lru_cache(maxsize=8192)
def _pack(rows: int, cols: int, items: tuple, allow_rotation: bool, node_budget: int):
    """:func:`pack_instances` on hashable arguments (the partition asks for the same packings many times)."""
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

    found = dfs(0, tuple(counts), rows * cols - need)
    return None if found is None else tuple(found)


def enumerate_layouts(wafer: WaferSpec, prefill_shape, n_prefill, decode_shape, n_decode, max_layouts=200_000):
    """Every distinct layout (instances of a kind are interchangeable), for exhaustive search on small meshes.

    Returns:
      (prefill centre dies ``[M, P]``, decode centre dies ``[M, Q]``, layouts list of tuples
      ``(kind_index, row, col, h, w)``).

    Raises:
      SpecError: more than ``max_layouts`` layouts (use :func:`~mocap_jax.wsc.placement.anneal_placement`).
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
                            f"use annealing")
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




__all__ = ["KINDS", "Instance", "Layout", "check_mesh", "check_alpha", "check_request", "pack_instances",
           "enumerate_layouts"]
