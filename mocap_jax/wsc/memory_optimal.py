"""The LP optimum of KV placement for a snapshot of resident requests, and the snapshot comparison.

:func:`optimal_allocation` first places as many bytes as possible anywhere on the wafer and
then minimises the decode read traffic ``sum bytes x hops(die, decode instance)`` ("KV
hop-bytes"), solved with ``scipy.optimize.linprog``; :func:`compare_snapshot` sets it beside
the greedy and local-only policies of :mod:`mocap_jax.wsc.memory` on the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from .hardware import WaferSpec
from .layout import Layout
from .memory import POLICIES, decode_hops, greedy_schedule, priority_table

@dataclass
class SnapshotResult:
    """Allocation of a set of simultaneously resident requests under one policy."""

    policy: str
    alloc: np.ndarray          # [R, D] bytes
    placed_bytes: float
    demand_bytes: float
    requests_placed: int       # requests placed in full
    requests: int
    hop_bytes: float           # sum bytes x hops(die, decode instance)
    remote_bytes: float        # bytes not on the request's decode instance
    die_kv: np.ndarray         # [D] KV bytes per die

    def row(self) -> dict[str, Any]:
        return {"policy": self.policy, "requests_placed": self.requests_placed, "requests": self.requests,
                "placed_gb": self.placed_bytes / 1e9, "demand_gb": self.demand_bytes / 1e9,
                "remote_gb": self.remote_bytes / 1e9, "kv_hop_gb": self.hop_bytes / 1e9}


def optimal_allocation(free, need, cost, allowed=None):
    """LP optimum: place as many bytes as possible, then minimise ``sum cost x bytes``.

    Variables ``x[r, d] >= 0`` (bytes of request r on die d);
    ``sum_d x[r, d] <= need[r]``, ``sum_r x[r, d] <= free[d]``.  Phase 1 maximises the
    placed bytes; phase 2 keeps that total and minimises ``sum cost[r, d] x[r, d]``.
    Requests may be split over dies and placed in part (the LP relaxation).

    Requests with identical cost and admissibility rows (e.g. the same decode
    instance) are interchangeable, so the LP is solved over those groups and each
    group's allocation is split back over its requests in proportion to their bytes;
    this is exact (same placed bytes and cost) and keeps the LP at ``groups x D``
    variables.  Solved with ``scipy.optimize.linprog`` (HiGHS).

    Args:
      free: ``[D]`` bytes; need: ``[R]`` bytes; cost: ``[R, D]`` per-byte cost.
      allowed: optional ``[R, D]`` bool mask of admissible dies.

    Returns:
      x ``[R, D]`` in bytes.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, vstack

    free = np.asarray(free, float)
    need = np.asarray(need, float)
    cost = np.asarray(cost, float)
    r, d = cost.shape
    allowed = np.ones((r, d), bool) if allowed is None else np.asarray(allowed, bool)
    if r == 0 or need.sum() <= 0 or not allowed.any():
        return np.zeros((r, d))
    keys = np.concatenate([cost, allowed.astype(float)], axis=1)
    groups, group_of = np.unique(keys, axis=0, return_inverse=True)
    group_of = group_of.ravel()
    g = len(groups)
    g_need = np.bincount(group_of, weights=need, minlength=g)
    g_cost, g_allowed = groups[:, :d], groups[:, d:] > 0.5
    idx = np.flatnonzero(g_allowed.ravel())
    scale = max(g_need.max(), 1.0)  # work in units of the largest group for conditioning
    gi, di = np.divmod(idx, d)
    n = idx.size
    a_req = coo_matrix((np.ones(n), (gi, np.arange(n))), shape=(g, n))
    a_die = coo_matrix((np.ones(n), (di, np.arange(n))), shape=(d, n))
    a_ub = vstack([a_req, a_die]).tocsr()
    b_ub = np.concatenate([g_need, free]) / scale
    res = linprog(-np.ones(n), A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"linprog (phase 1) failed: {res.message}")
    placed = -res.fun
    a2 = vstack([a_ub, coo_matrix(-np.ones((1, n)))]).tocsr()
    b2 = np.concatenate([b_ub, [-placed * (1 - 1e-9)]])
    res2 = linprog(g_cost.ravel()[idx], A_ub=a2, b_ub=b2, bounds=(0, None), method="highs")
    if res2.status != 0:
        raise RuntimeError(f"linprog (phase 2) failed: {res2.message}")
    y = np.zeros(g * d)
    y[idx] = np.maximum(res2.x, 0.0) * scale
    y = y.reshape(g, d)
    share = np.where(g_need[group_of] > 0, need / np.where(g_need[group_of] > 0, g_need[group_of], 1.0), 0.0)
    return y[group_of] * share[:, None]


def _snapshot_result(policy, alloc, need, q_of, dhops):
    placed_r = alloc.sum(axis=1)
    hop = float((alloc * dhops[q_of]).sum())
    remote = float((alloc * (dhops[q_of] > 0)).sum())
    full = int(np.sum(placed_r >= need * (1 - 1e-3)))
    return SnapshotResult(policy, alloc, float(placed_r.sum()), float(need.sum()), full, len(need), hop, remote,
                          alloc.sum(axis=0))


def compare_snapshot(wafer: WaferSpec, layout: Layout, free, prefill_idx, decode_idx, need) -> list[SnapshotResult]:
    """Greedy vs local-only vs LP optimum for requests resident at once (placed in the given order)."""
    free = np.asarray(free, float)
    prefill_idx = np.asarray(prefill_idx, np.int32)
    decode_idx = np.asarray(decode_idx, np.int32)
    need = np.asarray(need, float)
    dhops = decode_hops(wafer, layout)
    out = []
    for policy in POLICIES:
        table = priority_table(wafer, layout, policy)
        alloc, placed, paused, _ = greedy_schedule(jnp.asarray(free), jnp.asarray(prefill_idx),
                                                   jnp.asarray(decode_idx), jnp.asarray(need), jnp.asarray(table))
        out.append(_snapshot_result(policy, np.asarray(alloc, float), need, decode_idx, dhops))
    x = optimal_allocation(free, need, dhops[decode_idx].astype(float))
    out.append(_snapshot_result("optimal-lp", x, need, decode_idx, dhops))
    return out


__all__ = ["SnapshotResult", "optimal_allocation", "compare_snapshot"]
