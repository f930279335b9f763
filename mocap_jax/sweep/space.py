"""The point space of a sweep: every point addressed by a dense id, nothing per point stored.

Points are numbered grids first (in file order, the last key of a grid varying fastest), then the
explicit ``[[points]]`` rows.  Each key's distinct values are kept once in a value table; a point
is a code (an index into that table) per key, computed for any ids by mixed-radix decoding, so a
grid of 1.6e11 points costs no more memory than its axes.

:meth:`Space.boxes` covers the first ``size`` ids by rectangular pieces (a grid, a grid's prefix
split into sub-grids, the explicit rows), which is what lets the planner count a grid's points
per shape bucket arithmetically instead of enumerating them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..specs import SpecError
from .config import KEYS, SweepConfig

#: point ids are int64; a sweep above this many points is refused
MAX_POINTS = 2 ** 62


@dataclass(frozen=True)
class Box:
    """A rectangle of point ids: ``offset + sum(index[key] * stride[key])`` for every ``index[key]``
    in ``[lo, hi)`` of its axis (a grid or part of one), or an explicit list of ids (rows)."""

    offset: int                   # id of the grid's first point (index 0 on every axis)
    axes: tuple                   # ((key, codes int32[len], stride, lo, hi), ...) in grid order
    ids: np.ndarray | None = None  # explicit ids (the [[points]] rows), int64

    @property
    def size(self) -> int:
        if self.ids is not None:
            return len(self.ids)
        return math.prod(hi - lo for _, _, _, lo, hi in self.axes)


class Space:
    """Value tables, the id -> code mapping and the boxes of a sweep."""

    def __init__(self, cfg: SweepConfig):
        self.cfg = cfg
        self.tables: dict[str, list] = {k: [] for k in KEYS}
        self._index: dict[str, dict] = {k: {} for k in KEYS}
        defaults = {k: (cfg.settings["seed"] if k == "seed" else s.default) for k, s in KEYS.items()}
        self.base_code = {k: self._code(k, cfg.fixed.get(k, defaults[k])) for k in KEYS}
        self.grids = []    # (offset, size, keys, codes per axis, strides)
        off = 0
        for g in cfg.grids:
            keys = list(g)
            axes = [np.array([self._code(k, v) for v in g[k]], np.int32) for k in keys]
            lengths = [len(a) for a in axes]
            size = math.prod(lengths)
            strides = [math.prod(lengths[j + 1:]) for j in range(len(axes))]
            self.grids.append((off, size, keys, axes, strides))
            off += size
        self.rows_offset = off
        self.row_codes = {}
        if cfg.rows:
            keys = sorted({k for r in cfg.rows for k in r})
            self.row_codes = {k: np.array([self._code(k, r[k]) if k in r else self.base_code[k] for r in cfg.rows],
                                          np.int32) for k in keys}
            off += len(cfg.rows)
        self.total = off
        if self.total > MAX_POINTS:
            raise SpecError(f"{cfg.origin}: the sweep has {self.total:.3g} points, more than the {MAX_POINTS:.3g} "
                            f"a point id can address; split it into smaller sweeps")
        self.size = off if cfg.max_points is None else min(off, cfg.max_points)

    def _code(self, k: str, v) -> int:
        idx = self._index[k]
        key = (type(v).__name__, v)
        if key not in idx:
            idx[key] = len(self.tables[k])
            self.tables[k].append(v)
        return idx[key]

    def codes(self, ids: np.ndarray, keys=None) -> dict[str, np.ndarray]:
        """``{key: int32[len(ids)]}`` value-table index of every key (or of ``keys``) at every id."""
        ids = np.asarray(ids, np.int64)
        out = {k: np.full(len(ids), self.base_code[k], np.int32) for k in (KEYS if keys is None else keys)}
        for off, size, grid_keys, axes, strides in self.grids:
            sel = (ids >= off) & (ids < off + size)
            if not sel.any():
                continue
            local = ids[sel] - off
            for k, a, st in zip(grid_keys, axes, strides):
                if k in out:
                    out[k][sel] = a[(local // st) % len(a)]
        if self.row_codes:
            sel = ids >= self.rows_offset
            if sel.any():
                local = ids[sel] - self.rows_offset
                for k, col in self.row_codes.items():
                    if k in out:
                        out[k][sel] = col[local]
        return out

    def values(self, key: str, codes: np.ndarray, fill=np.nan, dtype=np.float64) -> np.ndarray:
        """Numeric values of a key (``fill`` where the value is None or not numeric)."""
        t = np.array([fill if (v is None or isinstance(v, str)) else v for v in self.tables[key]], dtype=dtype)
        return t[codes]

    def objects(self, key: str, codes: np.ndarray) -> np.ndarray:
        """The values of a key as an object array (None where unset)."""
        t = np.empty(len(self.tables[key]), dtype=object)
        t[:] = self.tables[key]
        return t[codes]

    def point(self, i: int) -> dict:
        """The input values of point ``i`` (a dict; None = inherited from the hardware)."""
        c = self.codes(np.array([i]))
        return {k: self.tables[k][int(c[k][0])] for k in KEYS}

    def boxes(self) -> list[Box]:
        """Boxes covering ids ``[0, size)`` exactly, in increasing id order.

        A grid cut by ``max_points`` is split by the digits of the cut (mixed radix): with
        digits ``d0 d1 ...`` of the number of points kept, piece ``i`` fixes axes ``< i`` to
        ``d0 .. d(i-1)`` and takes axis ``i`` in ``[0, d_i)``, every later axis whole.
        """
        out = []
        for off, size, keys, axes, strides in self.grids:
            keep = min(size, self.size - off)
            if keep <= 0:
                break
            full = [(k, a, st, 0, len(a)) for k, a, st in zip(keys, axes, strides)]
            if keep == size:
                out.append(Box(off, tuple(full)))
                continue
            rest = keep
            digits = []
            for st in strides:
                digits.append(rest // st)
                rest %= st
            for i, d in enumerate(digits):
                if d == 0:
                    continue
                ax = [(k, a, st, digits[j], digits[j] + 1) for j, (k, a, st, _, _) in enumerate(full[:i])]
                ax.append(full[i][:3] + (0, d))
                ax.extend(full[i + 1:])
                out.append(Box(off, tuple(ax)))
        if self.size > self.rows_offset:     # rows, even ones that only restate the defaults
            out.append(Box(self.rows_offset, (), ids=np.arange(self.rows_offset, self.size, dtype=np.int64)))
        return out
