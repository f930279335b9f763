"""MBKR pairing: which stage hosts which stage's spilled KV, and the routes between them.

Pairing policies (:data:`PAIRINGS`):

* ``cross-half`` (default): with ``h = N // 2`` and ``off = N - h``, stage ``s < h`` pairs with
  ``s + off`` (the middle stage of an odd N is unpaired).  A request reaches stage ``s + off``
  about ``off`` items after stage ``s``, so the two hold a request's KV at different times: the
  stage about to finish a request holds all of it while its partner holds ``off`` chunks less;
* ``head-to-tail``: ``s`` with ``N - 1 - s``;
* ``none``: no partners (MBKR then changes nothing: a stage that would overflow has nowhere to
  spill, exactly as without MBKR);
* ``dynamic``: partners re-matched at every item start, the i-th most loaded stage with the i-th
  least loaded, paying to migrate previously spilled KV (:mod:`mocap_jax.mbkr.spills`).

Thresholds (fractions of a stage's KV budget, its usable HBM minus its weights): below ``p1`` a
stage keeps its KV local and hosts nothing; from ``p1`` up to ``p2`` it is a creditor and may
host its partner's spill while it stays below ``p2``; at ``p2`` and above it is a debtor.  The
default ``p2 = 0.85`` keeps 15% of a creditor's budget for its own KV growth; ``p1 = 0`` lets any
stage below ``p2`` host.  ``read_overlap`` is the share of a debtor item's local attention time
that hides its remote KV read (0.5: the read streams while the first half of the attention runs
on local KV).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..costs import pytree
from ..specs import HardwareSpec, checks
from ..specs import mesh

Array = Any

PAIRINGS = ("cross-half", "none", "head-to-tail", "dynamic")
STATIC_PAIRING_CODE = {"none": 0, "cross-half": 1, "head-to-tail": 2}
SPILL_POLICIES = ("overflow", "eager")
DEFAULT_P1 = 0.0
DEFAULT_P2 = 0.85
DEFAULT_READ_OVERLAP = 0.5


@pytree
class MBKRParams:
    """Traced MBKR numbers of one configuration.

    Fields:
      p1, p2: role thresholds, fractions of a stage's KV budget (0 <= p1 <= p2 <= 1).
      read_overlap: fraction of the debtor's local attention time that hides a remote read.
      pairing: int code of a static pairing (0 none, 1 cross-half, 2 head-to-tail).
      stage_hops: ``[N_pad, N_pad]`` hops between the dies of two stages.
      stage_bandwidth: ``[N_pad, N_pad]`` bytes/s of that route, already divided among the
        transfers that share its busiest link (1 on the diagonal and padding).
    """

    p1: Array
    p2: Array
    read_overlap: Array
    pairing: Array
    stage_hops: Array
    stage_bandwidth: Array


def check_thresholds(p1, p2, read_overlap=DEFAULT_READ_OVERLAP) -> tuple[float, float, float]:
    """Validated ``(p1, p2, read_overlap)``: fractions with ``p1 <= p2``."""
    p1 = checks.fraction("MBKR threshold p1", p1)
    p2 = checks.fraction("MBKR threshold p2", p2)
    read_overlap = checks.fraction("MBKR read_overlap", read_overlap)
    if p1 > p2:
        raise checks.SpecError(f"MBKR thresholds need p1 <= p2 (the creditor band lies below the debtor "
                               f"threshold), got p1={p1}, p2={p2}")
    return p1, p2, read_overlap


def partner_of(pairing, num_stages, n_pad: int, xp=jnp):
    """Static partner of each stage, ``[N_pad]`` int (-1 = unpaired or padding).

    ``pairing`` is the int code (0 none, 1 cross-half, 2 head-to-tail); ``num_stages`` may be traced.
    """
    s = xp.arange(n_pad)
    n = num_stages
    h = n // 2
    off = n - h
    cross = xp.where(s < h, s + off, xp.where((s >= off) & (s < n), s - off, -1))
    tail = xp.where((s < n) & (n - 1 - s != s), n - 1 - s, -1)
    return xp.where(pairing == 1, cross, xp.where(pairing == 2, tail, -1)).astype(np.int32)


def pair_routes(hw: HardwareSpec, placement, partner, n_pad: int, dtype=np.float32):
    """Hop and effective-bandwidth matrices between stages, ``[N_pad, N_pad]`` each, for MBKR
    transfers: links are shared by every pipeline hand-off and, when ``partner`` is given, every
    pair route in both directions (:func:`mocap_jax.specs.mesh.route_matrices`)."""
    pairs = None if partner is None else [(s, int(q)) for s, q in enumerate(np.asarray(partner)) if q >= 0]
    return mesh.route_matrices(hw, placement, pairs, n_pad, dtype)
