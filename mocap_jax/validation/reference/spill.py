"""MBKR's rules as the reference applies them at an item start: roles, room, the spill rule, pairing.

Budgets are a stage's usable HBM minus its weights; occupancy ``u = local / budget`` with
``local`` the KV on the stage (own, hosted, and what its item in flight is writing).

* roles: ``u < p1`` local-only, ``p1 <= u < p2`` creditor, ``u >= p2`` debtor;
* a creditor's room: ``min(p2 budget - local, budget - local - activation in flight)``;
* the spill rule at the start of an item on stage x: ``need = local + kv + activation``; what
  exceeds x's budget (``over``; with the ``eager`` policy also the new KV above ``p2`` of the
  budget) goes to x's partner up to its room, at most the item's KV; if what stays still exceeds
  x's budget, the configuration is infeasible (by more than :data:`FIT_TOLERANCE` relative when
  something was moved: rounding of the exact excess; a stage no spill or migration touched is
  judged exactly, as without MBKR);
* pairings: ``cross-half``, ``head-to-tail`` (static), ``dynamic`` (re-matched at every start,
  the i-th most loaded with the i-th least loaded, occupancies compared at
  :data:`RANK_RESOLUTION` of the budget, ties to the lower stage index), ``none`` (no MBKR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...specs import checks

PAIRINGS = ("cross-half", "none", "head-to-tail", "dynamic")
SPILL_POLICIES = ("overflow", "eager")
#: what stays on a stage a spill or migration touched may exceed its budget by this relative amount
#: (rounding of the exact excess)
FIT_TOLERANCE = 1e-6
#: dynamic pairing compares occupancies at this resolution of the budget
RANK_RESOLUTION = 2.0 ** -20


@dataclass(frozen=True)
class MBKRSettings:
    """MBKR knobs, validated on construction.

    Attributes:
      pairing: ``cross-half``, ``head-to-tail``, ``dynamic`` or ``none``.
      p1, p2: role thresholds, fractions of a stage's KV budget (``0 <= p1 <= p2 <= 1``).
      read_overlap: share of a debtor item's local attention time that hides its remote read.
      spill: ``overflow`` (what cannot stay local) or ``eager`` (also the new KV above ``p2``).
    """

    pairing: str = "cross-half"
    p1: float = 0.0
    p2: float = 0.85
    read_overlap: float = 0.5
    spill: str = "overflow"

    def __post_init__(self):
        checks.choice("pairing", self.pairing, PAIRINGS)
        checks.choice("spill policy", self.spill, SPILL_POLICIES)
        p1 = checks.fraction("MBKR threshold p1", self.p1)
        p2 = checks.fraction("MBKR threshold p2", self.p2)
        overlap = checks.fraction("MBKR read_overlap", self.read_overlap)
        if p1 > p2:
            raise checks.SpecError(f"MBKR thresholds need p1 <= p2 (the creditor band lies below the debtor "
                                   f"threshold), got p1={p1}, p2={p2}")
        object.__setattr__(self, "p1", p1)
        object.__setattr__(self, "p2", p2)
        object.__setattr__(self, "read_overlap", overlap)


def static_partners(pairing: str, n: int) -> list[int]:
    """Partner of each of ``n`` stages (-1: none) under a static pairing; -1 everywhere otherwise.

    ``cross-half``: with ``h = n // 2`` and ``off = n - h``, stage ``s < h`` pairs with ``s + off``
    (the middle stage of an odd n is unpaired); ``head-to-tail``: ``n - 1 - s``.
    """
    if pairing == "cross-half":
        h, off = n // 2, n - n // 2
        return [s + off if s < h else (s - off if s >= off else -1) for s in range(n)]
    if pairing == "head-to-tail":
        return [n - 1 - s if n - 1 - s != s else -1 for s in range(n)]
    return [-1] * n


def is_creditor(local: float, budget: float, mb: MBKRSettings) -> bool:
    """``p1 <= u < p2``: the stage may host its partner's spill."""
    return mb.p1 * budget <= local < mb.p2 * budget


def room(local: float, budget: float, activation: float, mb: MBKRSettings) -> float:
    """Bytes a creditor can still host: below ``p2`` of its budget and beside its in-flight activation."""
    if not is_creditor(local, budget, mb):
        return 0.0
    return max(min(mb.p2 * budget - local, budget - local - activation), 0.0)


@dataclass(frozen=True)
class Decision:
    """The spill rule's outcome at one item start (bytes)."""

    need: float       # local + kv + activation of the starting item
    over: float       # what should leave the stage
    room: float       # what the partner can host (0 without a creditor partner)
    moved: float      # what is written to the partner
    overflow: bool    # what stays still exceeds the budget


def decide(local: float, kv: float, activation: float, budget: float, partner_room: float,
           mb: MBKRSettings) -> Decision:
    """The spill rule at an item start on a stage whose partner can host ``partner_room`` bytes."""
    need = local + kv + activation
    over = max(need - budget, 0.0)
    if mb.spill == "eager":
        over = max(over, min(kv, local + kv - mb.p2 * budget))
    moved = max(min(over, partner_room, kv), 0.0)
    return Decision(need=need, over=over, room=partner_room, moved=moved,
                    overflow=need - moved > budget * (1 + FIT_TOLERANCE if moved > 0 else 1.0))


def dynamic_matches(levels, budgets) -> list[int]:
    """Match of every stage: the i-th most loaded with the i-th least loaded (-1 for the middle of an odd count)."""
    n = len(levels)
    # a stage without KV budget (weights fill its HBM) is full, whatever it holds
    rank = sorted(range(n), key=lambda s: (round(levels[s] / budgets[s] / RANK_RESOLUTION) if budgets[s] > 0
                                           else math.inf, s))
    mate = [-1] * n
    for pos, s in enumerate(rank):
        if n - 1 - pos != pos:
            mate[s] = rank[n - 1 - pos]
    return mate


__all__ = ["Decision", "FIT_TOLERANCE", "MBKRSettings", "PAIRINGS", "RANK_RESOLUTION", "SPILL_POLICIES", "decide",
           "dynamic_matches", "is_creditor", "room", "static_partners"]
