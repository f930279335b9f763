"""Static structure of a simulation: bucket sizes and policies (hashable; one compiled program each).

Everything numeric a user might sweep (model and hardware numbers, partitions, batches, MBKR
thresholds) is a traced leaf of a :class:`~mocap_jax.schedule.evaluate.Point`; what changes the
shape or the control flow of the program is here.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Release(str, enum.Enum):
    """When a request group's KV is freed on a stage."""

    #: when the stage finishes the group's last item (no later item needs it)
    STAGE = "stage"
    #: when the group leaves the last stage
    REQUEST = "request"


class Admission(str, enum.Enum):
    """When the next batch may enter stage 0."""

    #: as soon as stage 0 is free
    STREAMING = "streaming"
    #: only after the previous batch has left the last stage
    SYNCHRONOUS = "synchronous"


class Spill(str, enum.Enum):
    """How much KV a debtor moves to its creditor (MBKR)."""

    #: only what cannot stay local: the part of a new item's KV that would overflow the stage
    OVERFLOW = "overflow"
    #: everything above the debtor threshold p2 (the eager reading of the design)
    EAGER = "eager"


class MBKRMode(str, enum.Enum):
    """Which spill program a simulation runs."""

    OFF = "off"
    #: fixed pairs (cross-half, head-to-tail, or none)
    STATIC = "static"
    #: partners re-matched at every item start (most loaded with least loaded)
    DYNAMIC = "dynamic"


class SimShape(NamedTuple):
    """Static structure of a bucket of configurations.

    Attributes:
      items: item slots per batch, K (chunks for chunked schemes, microbatches for GPipe).
      stages: pipeline stages, padded (N_pad).
      batches: consecutive batches in the timeline (each with the same item table).
      groups: request-group slots per batch (1 for chunked schemes, ``items`` for GPipe).
      release, admission: policies.
      mbkr: spill program (off / static pairs / dynamic re-matching).
      spill: how much a debtor moves.
      passes: MBKR spill-decision / timing passes (spills are decided on the previous pass's
        timeline, whose times they then change).
      timeline_points: also return per-stage occupancy at this many event times (0: none).
    """

    items: int
    stages: int
    batches: int = 1
    groups: int = 1
    release: Release = Release.STAGE
    admission: Admission = Admission.STREAMING
    mbkr: MBKRMode = MBKRMode.OFF
    spill: Spill = Spill.OVERFLOW
    passes: int = 3
    timeline_points: int = 0


def bucket(n: int, minimum: int = 4) -> int:
    """Smallest power of two >= n (and >= minimum): the padding bucket for n."""
    b = minimum
    while b < n:
        b *= 2
    return b
