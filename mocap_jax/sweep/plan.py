"""The plan of a sweep: its shape buckets, counted arithmetically, and the deterministic block sequence.

Counting.  A point's bucket and impossibility reason depend only on the keys in
:data:`~.resolver.PLAN_KEYS` (and on a few of them only through one property,
:data:`~.resolver.PLAN_FEATURES`).  In a box of the point space every other axis only multiplies
the count, and the values of a featured axis with the same property are interchangeable, so the
planner resolves one representative point per distinct combination of what matters -- the one
with the smallest id -- and weights it by the number of points it stands for.  A 1.6e11-point
grid whose bucket-deciding axes have 20,000 combinations is planned by resolving 20,000 points.

Blocks.  Each bucket's points, in id order, are cut into blocks of ``block_size`` points
(``serial_block_size`` for the one-at-a-time schemes; the last block of a bucket is shorter).
:meth:`Plan.blocks` streams them by scanning ids in windows, so a run that stops early (``limit``)
never enumerates more of the sweep than the blocks it evaluates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..specs import SpecError
from .config import SweepConfig
from .resolver import PLAN_FEATURES, PLAN_KEYS, Resolver
from .space import Box, Space

#: ids resolved per step, host side
WINDOW = 1 << 16
#: representative points the planner resolves up front (about a second per million on one core)
MAX_REPRESENTATIVES = 1 << 23


@dataclass
class Bucket:
    """One shape bucket: ``index`` in order of its first point, its key and point count."""

    index: int
    key: tuple
    points: int = 0
    first_id: int = 0

    @property
    def kind(self) -> str:
        return self.key[0]

    def label(self) -> str:
        if self.kind != "fast":
            return self.kind
        _, kind, kp, npad, nb, mode, R, sync, request = self.key
        s = f"{kind} K{kp} N{npad} nb{nb} mbkr={mode}" + (" sync" if sync else "") + (" request-release" if request else "")
        return s + (f" serving R{R}" if R else "")


def _axis_classes(space: Space, key: str, codes: np.ndarray, lo: int, hi: int):
    """Representative indices of an axis range and how many indices each stands for."""
    if key not in PLAN_KEYS:
        return np.array([lo]), np.array([hi - lo])
    feature = PLAN_FEATURES.get(key)
    if feature is None:
        return np.arange(lo, hi), np.ones(hi - lo, np.int64)
    first, count = {}, {}
    for i in range(lo, hi):
        f = feature(space.tables[key][codes[i]])
        first.setdefault(f, i)
        count[f] = count.get(f, 0) + 1
    reps = sorted(first.values())
    by_rep = {first[f]: count[f] for f in first}
    return np.array(reps), np.array([by_rep[i] for i in reps], np.int64)


def box_representatives(space: Space, box: Box) -> tuple[int, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """``(count, windows)``: the representatives of a box and an iterator over ``(ids, weights)``
    windows of them in increasing id order (``weights[i]`` points share the bucket and reason of
    ``ids[i]``, which is the smallest of them)."""
    if box.ids is not None:
        ids = box.ids
        return len(ids), ((ids[lo:lo + WINDOW], np.ones(len(ids[lo:lo + WINDOW]), np.int64))
                          for lo in range(0, len(ids), WINDOW))
    classes = [_axis_classes(space, k, a, lo, hi) for k, a, _, lo, hi in box.axes]
    strides = [st for _, _, st, _, _ in box.axes]
    sizes = [len(r) for r, _ in classes]
    count = math.prod(sizes)

    def windows():
        for start in range(0, count, WINDOW):
            flat = np.arange(start, min(start + WINDOW, count), dtype=np.int64)
            ids = np.full(len(flat), box.offset, np.int64)
            weights = np.ones(len(flat), np.int64)
            rest = flat
            for (reps, mult), st, n in reversed(list(zip(classes, strides, sizes))):
                j = rest % n
                rest = rest // n
                ids += reps[j] * st
                weights *= mult[j]
            yield ids, weights

    return count, windows()


class Plan:
    """Validated points grouped into buckets, and the deterministic sequence of blocks.

    Raises ``SpecError`` for the first impossible combination (unless the sweep records them as
    rows) and for a sweep whose buckets cannot be counted up front.
    """

    def __init__(self, cfg: SweepConfig, block_size: int, serial_block_size: int):
        self.cfg = cfg
        self.space = Space(cfg)
        self.resolver = Resolver(self.space)
        self.block_size = block_size
        self.serial_block_size = serial_block_size
        self.buckets: dict[tuple, Bucket] = {}
        boxes = [(box, *box_representatives(self.space, box)) for box in self.space.boxes()]
        self.representatives = sum(n for _, n, _ in boxes)
        if self.representatives > MAX_REPRESENTATIVES:
            deciding = sorted(PLAN_KEYS & {k for g in cfg.grids for k in g})
            raise SpecError(f"{cfg.origin}: the sweep's {self.space.size:,} points fall into shape buckets decided "
                            f"by {self.representatives:,} distinct combinations of {', '.join(deciding)}, more than "
                            f"the {MAX_REPRESENTATIVES:,} planned up front; split it into smaller sweeps "
                            f"(max_points, or fewer values of those keys per file)")
        for _, _, windows in boxes:
            for ids, weights in windows:
                self._count(ids, weights)

    def _count(self, ids: np.ndarray, weights: np.ndarray) -> None:
        r = self.resolver.resolve(ids)
        bad = np.nonzero(r.reason > 0)[0]
        if self.cfg.settings["impossible"] == "error" and len(bad):
            j = int(bad[0])
            cfg = self.cfg
            given = set(cfg.fixed).union(*[set(g) for g in cfg.grids], *[set(row) for row in cfg.rows])
            shown = ", ".join(f"{k}={v}" for k, v in r.point(j).items() if k in given)
            raise SpecError(f"{cfg.origin}: impossible combination at point {int(ids[j])} ({shown}): "
                            f"{self.resolver.explain(r, j)}. (Or set impossible = \"infeasible\" in [sweep] to "
                            f"record such points as infeasible rows.)")
        keys, inv = self.resolver.bucket_keys(r)
        counts = np.zeros(len(keys), np.int64)
        np.add.at(counts, inv, weights)
        first = [int(np.argmax(inv == q)) for q in range(len(keys))]
        for q in np.argsort(first, kind="stable"):   # buckets are numbered in order of their first point
            b = self.buckets.get(keys[q])
            if b is None:
                b = self.buckets[keys[q]] = Bucket(len(self.buckets), keys[q], first_id=int(ids[first[q]]))
            b.points += int(counts[q])

    @property
    def points(self) -> int:
        return self.space.size

    def ordered(self) -> list[Bucket]:
        return sorted(self.buckets.values(), key=lambda b: b.index)

    def block_cap(self, b: Bucket) -> int:
        return self.serial_block_size if b.kind == "serial" else self.block_size

    def bucket_blocks(self, b: Bucket) -> int:
        return -(-b.points // self.block_cap(b))

    def block_points(self, b: Bucket, k: int) -> int:
        """Points in block ``k`` of bucket ``b``."""
        cap = self.block_cap(b)
        return min(cap, b.points - k * cap)

    def num_blocks(self) -> int:
        return sum(self.bucket_blocks(b) for b in self.buckets.values())

    def blocks(self) -> Iterator[tuple[Bucket, int, np.ndarray]]:
        """Yield ``(bucket, block number, ids)`` in a fixed order (ids ascending inside a block).

        A block is yielded as soon as its bucket has ``block_cap`` points; the last, shorter
        block of every bucket comes at the end.
        """
        by_index = self.ordered()
        pending: dict[int, list] = {b.index: [] for b in by_index}
        counts = {b.index: 0 for b in by_index}
        done = {b.index: 0 for b in by_index}
        for lo in range(0, self.space.size, WINDOW):
            ids = np.arange(lo, min(lo + WINDOW, self.space.size), dtype=np.int64)
            keys, inv = self.resolver.bucket_keys(self.resolver.resolve(ids))
            bidx = np.array([self.buckets[k].index for k in keys], np.int64)[inv]
            for b in by_index:
                sel = ids[bidx == b.index]
                if not len(sel):
                    continue
                pending[b.index].append(sel)
                counts[b.index] += len(sel)
                cap = self.block_cap(b)
                while counts[b.index] >= cap:
                    allids = np.concatenate(pending[b.index])
                    yield b, done[b.index], allids[:cap]
                    done[b.index] += 1
                    pending[b.index] = [allids[cap:]]
                    counts[b.index] -= cap
        for b in by_index:
            if counts[b.index]:
                yield b, done[b.index], np.concatenate(pending[b.index])
                done[b.index] += 1
