"""Building configurations on the host: from specs and user settings to a :class:`Point`.

The public point builders: :class:`MBKRSettings` (validated MBKR knobs), :func:`build_point`
(one configuration's pytree of numbers) and :func:`stack_points` (many, for batched
evaluation).  Everything here is NumPy; nothing is traced.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import numpy as np

from ..costs import HardwareParams, ModelParams, StageLayout
from ..mbkr.pairing import (DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS, SPILL_POLICIES,
                            STATIC_PAIRING_CODE, MBKRParams, check_thresholds, pair_routes, partner_of)
from ..schedule.items import Chunks, ItemTable
from ..schedule.shape import MBKRMode, Spill
from ..specs import HardwareSpec, ModelSpec, checks
from ..specs.mesh import group_routes
from .evaluate import Point


@dataclass(frozen=True)
class MBKRSettings:
    """MBKR knobs (validated on construction; see :mod:`mocap_jax.mbkr.pairing`).

    Attributes:
      pairing: ``cross-half``, ``head-to-tail``, ``none`` or ``dynamic``.
      p1, p2: role thresholds, fractions of a stage's KV budget.
      read_overlap: share of local attention time that hides a remote read.
      spill: ``overflow`` (move only what cannot stay local) or ``eager`` (also what lies above p2).
    """

    pairing: str = "cross-half"
    p1: float = DEFAULT_P1
    p2: float = DEFAULT_P2
    read_overlap: float = DEFAULT_READ_OVERLAP
    spill: str = "overflow"

    def __post_init__(self):
        checks.choice("pairing", self.pairing, PAIRINGS)
        checks.choice("spill policy", self.spill, SPILL_POLICIES)
        p1, p2, overlap = check_thresholds(self.p1, self.p2, self.read_overlap)
        object.__setattr__(self, "p1", p1)
        object.__setattr__(self, "p2", p2)
        object.__setattr__(self, "read_overlap", overlap)

    @property
    def mode(self) -> MBKRMode:
        """The spill program: none pairs nothing (a stage that would overflow has nowhere to go,
        exactly as without MBKR), dynamic re-matches, the rest are static pairs."""
        return {"dynamic": MBKRMode.DYNAMIC, "none": MBKRMode.OFF}.get(self.pairing, MBKRMode.STATIC)

    @property
    def spill_policy(self) -> Spill:
        return Spill(self.spill)


def mbkr_params(hw: HardwareSpec, placement, n_pad: int, settings: MBKRSettings, dtype) -> MBKRParams:
    """MBKR numbers of a configuration; pair routes share links with the hand-offs and each other.

    ``placement`` is ``[N]`` dies or ``[N, t]`` stage groups.  Partners are stage groups: a
    group's spill runs rank to rank (die k of the debtor group to die k of its partner, every
    die moving its own share of the KV), so ``stage_hops`` is the longest rank route and
    ``stage_bandwidth`` one rank route's share of its bottleneck link, with every rank route of
    every hand-off and pair sharing the links (:func:`mocap_jax.specs.mesh.group_routes`).
    """
    placement = np.asarray(placement)
    n = len(placement)
    code = STATIC_PAIRING_CODE.get(settings.pairing, 0)
    partner = partner_of(code, n, n, xp=np) if settings.mode == MBKRMode.STATIC else None
    if placement.ndim == 2:
        group_hops, group_bw = group_routes(hw, placement, partner)
        hops, bw = np.zeros((n_pad, n_pad), dtype), np.ones((n_pad, n_pad), dtype)
        hops[:n, :n] = group_hops
        bw[:n, :n] = group_bw / placement.shape[1]      # the routes' aggregate over t ranks, per rank
    else:
        hops, bw = pair_routes(hw, placement, partner, n_pad, dtype)
    return MBKRParams(p1=np.asarray(settings.p1, dtype), p2=np.asarray(settings.p2, dtype),
                      read_overlap=np.asarray(settings.read_overlap, dtype), pairing=np.asarray(code, np.int32),
                      stage_hops=hops, stage_bandwidth=bw)


def stage_layout(hw: HardwareSpec, placement, n_pad: int, dtype) -> StageLayout:
    """Layout of stages on ``placement``: ``[N]`` one die per stage, or ``[N, t]`` stage groups."""
    placement = np.asarray(placement)
    return (StageLayout.from_groups if placement.ndim == 2 else StageLayout.from_placement)(hw, placement, n_pad, dtype)


def stage_routes(hw: HardwareSpec, placement, n_pad: int, settings: MBKRSettings, dtype) -> tuple[StageLayout, MBKRParams]:
    """The layout and MBKR routes of a placement (``[N]`` dies or ``[N, t]`` stage groups).

    Cached (every call of a sweep or search over one placement asks for the same routes, whose XY
    walks cost more host time than a thousand-configuration evaluation); the arrays returned are
    read-only, shared between callers."""
    placement = np.asarray(placement, np.int64)
    return _stage_routes(hw, placement.tobytes(), placement.shape, n_pad, settings, np.dtype(dtype).name)


@functools.lru_cache(maxsize=256)
def _stage_routes(hw: HardwareSpec, placement: bytes, placement_shape: tuple, n_pad: int, settings: MBKRSettings,
                  dtype: str) -> tuple[StageLayout, MBKRParams]:
    pl = np.frombuffer(placement, np.int64).reshape(placement_shape)
    routes = stage_layout(hw, pl, n_pad, dtype), mbkr_params(hw, pl, n_pad, settings, dtype)
    for leaf in jax.tree_util.tree_leaves(routes):
        if isinstance(leaf, np.ndarray):
            leaf.flags.writeable = False
    return routes


def build_point(model: ModelSpec, hw: HardwareSpec, items: ItemTable, placement, n_pad: int, dtype,
                settings: MBKRSettings | None = None) -> Point:
    """One configuration as a pytree of NumPy numbers (``items`` already padded to the bucket).

    ``placement`` is the die of each stage ``[N]``, or the dies of each tensor-parallel stage group
    ``[N, t]`` (MBKR partners are then groups, their routes rank to rank).
    """
    layout, mbkr = stage_routes(hw, placement, n_pad, settings or MBKRSettings(), dtype)
    return Point(items=items, model=ModelParams.from_spec(model, dtype), hardware=HardwareParams.from_spec(hw, dtype),
                 layout=layout, mbkr=mbkr)


def stack_points(points: list[Point]) -> Point:
    """Points of one bucket stacked along a new leading axis (for ``vmap``)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *points)


def replace_items(point: Point, items: ItemTable | Chunks) -> Point:
    """The same configuration with another item table."""
    return Point(items=items, model=point.model, hardware=point.hardware, layout=point.layout, mbkr=point.mbkr)


def batched_items(point: Point, items: ItemTable | Chunks) -> tuple[Point, Point]:
    """``(points, axes)``: ``point`` with stacked ``items`` (a leading axis on every leaf), and the
    ``in_axes`` that vmap over the items only."""
    none = lambda tree: jax.tree_util.tree_map(lambda _: None, tree)
    axes = Point(items=jax.tree_util.tree_map(lambda _: 0, items), model=none(point.model),
                 hardware=none(point.hardware), layout=none(point.layout), mbkr=none(point.mbkr))
    return replace_items(point, items), axes
