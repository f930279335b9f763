"""The KV ledger of the reference: what every stage holds, by request group, at the current instant.

Each stage holds its *own* KV (by group) and may *host* the KV its debtors spilled to it.  A
debtor's spilled KV lives on one host at a time (its current partner); a release of a group on
a stage frees the stage's own KV of the group and the KV of the group it spilled, wherever that
is hosted.  Every change is written to an audit log, so tests can check that KV is conserved:
what the stages hold is what was written minus what was released, at every event.

Levels are exact sums (``math.fsum``) over the blocks a stage holds.  Units: bytes, seconds.
"""

from __future__ import annotations

import math

import numpy as np


class KVLedger:
    """Own and hosted KV of ``n`` stages.

    Attributes:
      own: per stage, ``{group: bytes}`` of its own KV held on it.
      spilled: per debtor stage, ``{group: bytes}`` of its KV hosted on ``host[debtor]``.
      host: per stage, the stage hosting its spilled KV (-1 while it has spilled nothing).
      level: per stage, KV on it now (own + hosted), bytes.
      written, released: KV written and freed so far over every stage, bytes.
      audit: rows ``(time, KV on every stage, written, released)`` after every change.
    """

    def __init__(self, n: int):
        self.n = n
        self.own: list[dict[int, float]] = [{} for _ in range(n)]
        self.spilled: list[dict[int, float]] = [{} for _ in range(n)]
        self.host = [-1] * n
        self.level = [0.0] * n
        self.written = 0.0
        self.released = 0.0
        self.audit: list[tuple[float, float, float, float]] = []

    def _refresh(self, s: int) -> None:
        hosted = [b for d in range(self.n) if self.host[d] == s for b in self.spilled[d].values()]
        self.level[s] = math.fsum(list(self.own[s].values()) + hosted)

    def _log(self, now: float) -> None:
        self.audit.append((now, math.fsum(self.level), self.written, self.released))

    def spilled_total(self, s: int) -> float:
        """Bytes of stage ``s``'s KV hosted by its partner."""
        return math.fsum(self.spilled[s].values())

    def spilled_of_group(self, s: int, group: int) -> float:
        """Bytes of ``group``'s KV that stage ``s`` has spilled so far."""
        return self.spilled[s].get(group, 0.0)

    def write(self, now: float, s: int, group: int, kv: float, moved: float, host: int) -> None:
        """Stage ``s`` starts writing ``kv`` bytes of ``group``: ``kv - moved`` locally, ``moved`` on ``host``."""
        self.own[s][group] = self.own[s].get(group, 0.0) + (kv - moved)
        if moved > 0:
            if self.spilled[s] and self.host[s] != host:
                raise RuntimeError(f"stage {s} spills to {host} while its earlier spill is on {self.host[s]}")
            self.host[s] = host
            self.spilled[s][group] = self.spilled[s].get(group, 0.0) + moved
            self._refresh(host)
        self._refresh(s)
        self.written += kv
        self._log(now)

    def release(self, now: float, s: int, group: int) -> None:
        """Free stage ``s``'s own KV of ``group`` and the KV of ``group`` it spilled."""
        freed = self.own[s].pop(group, 0.0)
        spilled = self.spilled[s].pop(group, None)
        if spilled is not None:
            freed += spilled
            self._refresh(self.host[s])
            if not self.spilled[s]:
                self.host[s] = -1
        self._refresh(s)
        self.released += freed
        self._log(now)

    def migrate(self, now: float, s: int, new_host: int) -> float:
        """Move all of stage ``s``'s spilled KV to ``new_host``; returns the bytes moved."""
        old = self.host[s]
        moved = self.spilled_total(s)
        self.host[s] = new_host
        self._refresh(old)
        self._refresh(new_host)
        self._log(now)
        return moved

    def audit_array(self) -> np.ndarray:
        """The audit log as ``[A, 4]`` float64."""
        return np.array(self.audit, np.float64).reshape(-1, 4)


__all__ = ["KVLedger"]
