"""Exact sharing of link and DRAM bandwidth among streams, for the event-driven reference.

A :class:`FlowNetwork` holds the streams in flight with their demand on every resource (link
resources ``[L]`` and die DRAM ``[D]``, bytes/s).  :meth:`FlowNetwork.shares` gives every
stream the fraction of its demand it receives on each resource under a rule:

* ``max-min``: water-filling on each resource -- streams demanding less than the water level
  get their demand, the others the level, with the level set so the capacity is used up (or
  every demand met);
* ``proportional``: every stream gets ``min(1, capacity / total demand)`` of its demand.

Plain NumPy, written independently of the array program's approximation
(:mod:`mocap_jax.wsc.traffic`), which sees only per-resource totals.
"""

from __future__ import annotations

import numpy as np

from ..specs import checks

RULES = ("max-min", "proportional")


def water_level(demands: np.ndarray, capacity: float) -> float:
    """Max-min water level of ``demands`` on one resource of ``capacity`` (inf when all demands fit)."""
    d = np.sort(demands[demands > 0])
    if d.size == 0 or d.sum() <= capacity:
        return np.inf
    used = 0.0
    for k, x in enumerate(d):
        left = d.size - k
        if used + x * left >= capacity:   # the level lies below this demand: the rest share what is left
            return (capacity - used) / left
        used += x
    return np.inf


class FlowNetwork:
    """Streams in flight and their demand on ``L`` link resources and ``D`` DRAMs."""

    def __init__(self, link_capacity: np.ndarray, dram_capacity: np.ndarray, rule: str):
        self.rule = checks.choice("contention rule", rule, RULES)
        self.link_capacity = np.asarray(link_capacity, float)
        self.dram_capacity = np.asarray(dram_capacity, float)
        self.streams: dict = {}

    def add(self, key, link_demand: np.ndarray, dram_demand: np.ndarray) -> None:
        self.streams[key] = (np.asarray(link_demand, float), np.asarray(dram_demand, float))

    def remove(self, key) -> None:
        self.streams.pop(key, None)

    def _resource_shares(self, demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """``[S, R]`` share of every stream on every resource, from the demands ``[S, R]``."""
        total = demand.sum(axis=0)
        if self.rule == "proportional":
            per = np.minimum(1.0, capacity / np.maximum(total, 1e-300))
            return np.where(demand > 0, np.broadcast_to(per, demand.shape), 1.0)
        out = np.ones_like(demand)
        for r in np.flatnonzero(total > capacity):
            level = water_level(demand[:, r], capacity[r])
            col = demand[:, r]
            got = col > level
            out[got, r] = level / col[got]
        return out

    def shares(self) -> dict:
        """``{key: (link share [L], DRAM share [D])}`` for every stream in flight."""
        if not self.streams:
            return {}
        keys = list(self.streams)
        links = np.stack([self.streams[k][0] for k in keys])
        drams = np.stack([self.streams[k][1] for k in keys])
        ls = self._resource_shares(links, self.link_capacity)
        ds = self._resource_shares(drams, self.dram_capacity)
        return {k: (ls[i], ds[i]) for i, k in enumerate(keys)}


__all__ = ["RULES", "water_level", "FlowNetwork"]
