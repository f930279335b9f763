"""The numbers the reference simulates with, from the shared per-operation cost formulas.

The only code the reference shares with the array program: the per-operation formulas of
:mod:`mocap_jax.costs.stage` (evaluated here with NumPy in float64) and the mesh routing of
:mod:`mocap_jax.specs.mesh` (XY routes, and the link sharing of routes that run at once).

Shapes: ``[E, N]`` over the items of every batch and the stages; ``[N]`` per stage;
``[N, N]`` between stages.  Units: seconds and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...costs import stage as formulas
from ...costs.params import HardwareParams, ModelParams, StageLayout
from ...specs import HardwareSpec, ModelSpec
from ...specs.mesh import route_matrices
from .items import Item


@dataclass(frozen=True)
class Quantities:
    """Per-item, per-stage costs and per-stage capacities of one configuration.

    Attributes:
      time: ``[E, N]`` seconds of item k on stage s without MBKR (``t[k, s]``).
      handoff: ``[E, N]`` hand-off delay of item k from s to s+1 (0 on the last stage).
      kv: ``[E, N]`` KV bytes item k writes on stage s.
      activation: ``[E, N]`` activation bytes item k holds on stage s while it runs.
      attention: ``[E, N]`` seconds of local attention of item k on stage s (hides remote reads).
      weights: ``[N]`` weight bytes of each stage.
      usable: usable HBM of a die (``hbm_capacity x usable_hbm_fraction``).
      budget: ``[N]`` KV budget of each stage (``usable - weights``).
      pair_hops, pair_bandwidth: ``[N, N]`` hops and shared bandwidth of MBKR routes between stages.
      link_latency_s, eff_link: per-hop latency and link efficiency.
      serve_bandwidth: bytes/s a host's HBM serves remote reads at (``hbm_bandwidth x eff_hbm``).
    """

    time: np.ndarray
    handoff: np.ndarray
    kv: np.ndarray
    activation: np.ndarray
    attention: np.ndarray
    weights: np.ndarray
    usable: float
    budget: np.ndarray
    pair_hops: np.ndarray
    pair_bandwidth: np.ndarray
    link_latency_s: float
    eff_link: float
    serve_bandwidth: float


def quantities(model: ModelSpec, hw: HardwareSpec, items: Sequence[Item], placement: np.ndarray,
               pairs: Sequence[tuple[int, int]] | None) -> Quantities:
    """Evaluate the cost formulas for every item on every stage.

    ``pairs``: the static MBKR pairs whose routes share links with the hand-offs (None: the
    MBKR routes share with the hand-offs only).
    """
    n = len(placement)
    mp = ModelParams.from_spec(model, np.float64)
    hp = HardwareParams.from_spec(hw, np.float64)
    handoff_hops, handoff_bw = route_matrices(hw, placement, None, n, np.float64)
    next_stage = np.arange(n - 1)
    hops = np.zeros(n)
    bandwidth = np.ones(n)
    hops[: n - 1] = handoff_hops[next_stage, next_stage + 1]
    bandwidth[: n - 1] = handoff_bw[next_stage, next_stage + 1]
    layout = StageLayout.single_die(np.asarray(n, np.int32), hops, bandwidth)
    c = np.array([it.tokens for it in items], np.float64)
    p = np.array([it.prefix for it in items], np.float64)
    b = np.array([it.requests for it in items], np.float64)
    last = np.array([it.last for it in items], bool)
    kv_per_token = np.asarray(formulas.stage_kv_bytes_per_token(mp, hp, n, n, xp=np), np.float64)
    weights = np.asarray(formulas.stage_weight_bytes(mp, hp, n, n, xp=np), np.float64)
    usable = float(hw.hbm_capacity * hw.usable_hbm_fraction)
    pair_hops, pair_bw = route_matrices(hw, placement, pairs, n, np.float64)
    return Quantities(
        time=np.asarray(formulas.stage_times(mp, hp, layout, c, p, b, last, n, xp=np), np.float64),
        handoff=np.asarray(formulas.handoff_time(mp, hp, layout, c, b, n, xp=np), np.float64),
        kv=(b * c)[:, None] * kv_per_token[None, :],
        activation=np.asarray(formulas.item_activation_bytes(mp, hp, layout, c, b, last, n, xp=np), np.float64),
        attention=np.asarray(formulas.stage_attention_times(mp, hp, layout, c, p, b, n, xp=np), np.float64),
        weights=weights, usable=usable, budget=usable - weights, pair_hops=np.asarray(pair_hops, np.float64),
        pair_bandwidth=np.asarray(pair_bw, np.float64), link_latency_s=float(hw.link_latency_s),
        eff_link=float(hw.eff_link), serve_bandwidth=float(hw.hbm_bandwidth * hw.eff_hbm))


__all__ = ["Quantities", "quantities"]
