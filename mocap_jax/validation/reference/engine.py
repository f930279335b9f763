"""The event loop of the reference: stages, hand-offs, admission, KV and MBKR, instant by instant.

Each stage serves items in item order, one at a time.  Item k may start on stage s once the stage
has finished item k-1 and the item has arrived (for s = 0: it is admitted; otherwise its
hand-off from s-1, a pure delay ``d[k, s-1]``, has ended).  Streaming admission admits every
item at time 0; synchronous admission admits batch j when batch j-1's last item leaves the last
stage.

Everything that happens at one instant is processed in a fixed order: the finishes of the
instant (first every group release they cause, then the end of each item's activation buffers,
its hand-off and any admission), then the starts of the instant in stage order; repeated while
something still happens at that instant.  At a start the item's workspace appears: the KV it
writes (from now until its group's release) and its activation buffers (until it finishes).

With MBKR a start also (dynamic pairing) re-matches the stage's partner, migrating its spilled
KV when the partner changes; reads back the KV its group spilled earlier (the unhidden part of
the read lengthens the item, and the host spends the serving time: its item in progress is
delayed by it, or an idle host stays busy serving and the part that overlaps its next item's
start delays that item); and applies the spill rule to the new KV, whose moved part is written
to the partner (the write lengthens the item).  Memory is recorded after every start, on the
starting stage and on a stage that receives KV.

Units: seconds and bytes.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from .items import Item
from .ledger import KVLedger
from .quantities import Quantities
from .spill import MBKRSettings, decide, dynamic_matches, room, static_partners


class Engine:
    """One configuration's event-driven simulation; :meth:`run` once, then read the attributes.

    Args:
      q: the configuration's numbers.
      items: every item, in item order.
      release: ``stage`` or ``request``.
      admission: ``streaming`` or ``synchronous``.
      mbkr: MBKR settings, or None (no MBKR; also for pairing ``none``).
    """

    def __init__(self, q: Quantities, items: Sequence[Item], release: str, admission: str,
                 mbkr: MBKRSettings | None):
        self.q, self.items, self.release, self.admission = q, list(items), release, admission
        self.mbkr = mbkr if mbkr is not None and mbkr.pairing != "none" else None
        E, N = q.time.shape
        self.E, self.N = E, N
        self.t, self.d = q.time.tolist(), q.handoff.tolist()
        self.kv, self.act, self.att = q.kv.tolist(), q.activation.tolist(), q.attention.tolist()
        self.weights, self.budget = q.weights.tolist(), q.budget.tolist()
        self.hops, self.bandwidth = q.pair_hops.tolist(), q.pair_bandwidth.tolist()
        self.ledger = KVLedger(N)
        self.partner = static_partners(self.mbkr.pairing, N) if self.mbkr else [-1] * N
        self.batch_last = {}
        for it in self.items:
            self.batch_last[it.batch] = it.index
        # stage state
        self.next_item = [0] * N
        self.running: list[int | None] = [None] * N
        self.running_act = [0.0] * N
        self.busy_until = [0.0] * N
        self.serving_until = [0.0] * N
        # item state, [E][N]
        nan = float("nan")
        self.arrival: list[list[float | None]] = [[None] * N for _ in range(E)]
        self.start = [[nan] * N for _ in range(E)]
        self.finish = [[nan] * N for _ in range(E)]
        self.duration = [[0.0] * N for _ in range(E)]
        self.moved, self.host = [[0.0] * N for _ in range(E)], [[-1] * N for _ in range(E)]
        self.read_bytes, self.read_s = [[0.0] * N for _ in range(E)], [[0.0] * N for _ in range(E)]
        self.read_extra_s, self.write_s = [[0.0] * N for _ in range(E)], [[0.0] * N for _ in range(E)]
        self.migrated, self.migrate_s = [[0.0] * N for _ in range(E)], [[0.0] * N for _ in range(E)]
        self.block_s = [[0.0] * N for _ in range(E)]
        # memory
        self.peak = list(self.weights)
        self.kv_peak = [0.0] * N
        self.overflow = False
        self.touched = [False] * N   # stages whose memory a spill or migration changed
        self.decisions: list[dict] = []
        self.timeline: list[tuple[float, list[float], list[float]]] = []
        self._heap: list[float] = []
        for it in self.items:
            if admission == "streaming" or it.batch == 0:
                self.arrival[it.index][0] = 0.0
        self._push(0.0)

    # ------------------------------------------------------------------ the loop

    def _push(self, time: float) -> None:
        heapq.heappush(self._heap, time)

    def run(self) -> "Engine":
        while self._heap:
            now = heapq.heappop(self._heap)
            while self._heap and self._heap[0] == now:
                heapq.heappop(self._heap)
            self._instant(now)
        if any(x != self.E for x in self.next_item) or any(r is not None for r in self.running):
            raise RuntimeError("reference simulation ended with unfinished items")
        return self

    def _instant(self, now: float) -> None:
        while True:
            done = [s for s in range(self.N) if self.running[s] is not None and self.busy_until[s] <= now]
            for s in done:
                self._release(now, s, self.running[s])
            for s in done:
                self._finish(now, s)
            started = False
            for s in range(self.N):
                k = self.next_item[s]
                if self.running[s] is None and k < self.E:
                    arrival = self.arrival[k][s]
                    if arrival is not None and arrival <= now:
                        self._start(now, s, k)
                        started = True
            if not done and not started:
                break
        memory = [w + kv + a for w, kv, a in zip(self.weights, self.ledger.level, self.running_act)]
        self.timeline.append((now, list(self.ledger.level), memory))

    def _release(self, now: float, s: int, k: int) -> None:
        """Group releases caused by stage ``s`` finishing item ``k``."""
        it = self.items[k]
        if k != it.group_last:
            return
        if self.release == "stage":
            self.ledger.release(now, s, it.group)
        elif s == self.N - 1:
            for stage in range(self.N):
                self.ledger.release(now, stage, it.group)

    def _finish(self, now: float, s: int) -> None:
        k = self.running[s]
        self.finish[k][s] = now
        self.running[s] = None
        self.running_act[s] = 0.0
        if s < self.N - 1:
            self.arrival[k][s + 1] = now + self.d[k][s]
            if self.arrival[k][s + 1] > now:
                self._push(self.arrival[k][s + 1])
            return
        batch = self.items[k].batch
        if self.admission == "synchronous" and k == self.batch_last[batch]:
            for it in self.items:
                if it.batch == batch + 1:
                    self.arrival[it.index][0] = now

    # ------------------------------------------------------------------ a start

    def _transfer(self, a: int, b: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over the MBKR route from stage ``a`` to stage ``b``."""
        return self.hops[a][b] * self.q.link_latency_s + nbytes / (self.bandwidth[a][b] * self.q.eff_link)

    def _room(self, y: int) -> float:
        return room(self.ledger.level[y], self.budget[y], self.running_act[y], self.mbkr) if y >= 0 else 0.0

    def _start(self, now: float, s: int, k: int) -> None:
        self.start[k][s] = now
        self.next_item[s] += 1
        block = max(self.serving_until[s] - now, 0.0)
        if self.mbkr is None:
            self.ledger.write(now, s, self.items[k].group, self.kv[k][s], 0.0, -1)
            extra, receivers = 0.0, []
        else:
            extra, receivers = self._spill(now, s, k)
        self.running[s] = k
        self.running_act[s] = self.act[k][s]
        self.block_s[k][s] += block
        self.duration[k][s] = self.t[k][s] + (extra + block)
        self.busy_until[s] = now + self.duration[k][s]
        self._push(self.busy_until[s])
        for stage in [s] + receivers:
            self._record(stage)

    def _spill(self, now: float, s: int, k: int) -> tuple[float, list[int]]:
        """MBKR at the start of item k on stage s: re-matching, the remote read, the spill rule and the
        write.  Returns the seconds they add to the item and the stages whose KV rose."""
        kv, act = self.kv[k][s], self.act[k][s]
        receivers = self._rematch(now, s, k)
        host = self.partner[s]
        self.host[k][s] = host
        serve = self._remote_read(s, k, host)
        local = self.ledger.level[s]
        partner_local = self.ledger.level[host] if host >= 0 else 0.0
        partner_act = self.running_act[host] if host >= 0 else 0.0
        partner_room = self._room(host)
        decision = decide(local, kv, act, self.budget[s], partner_room, self.mbkr)
        self.overflow |= decision.overflow
        moved = decision.moved
        self.ledger.write(now, s, self.items[k].group, kv, moved, host)
        if moved > 0:
            self.touched[s] = self.touched[host] = True
            self.moved[k][s] = moved
            self.write_s[k][s] = self._transfer(s, host, moved)
            receivers.append(host)
        self.decisions.append(dict(time=now, stage=s, item=k, partner=host, local=local, partner_local=partner_local,
                                   partner_activation=partner_act, need=decision.need, over=decision.over,
                                   room=partner_room, moved=moved, overflow=decision.overflow,
                                   read_bytes=self.read_bytes[k][s], migrated=self.migrated[k][s]))
        if serve > 0:
            self._serve(now, host, serve)
        return self.write_s[k][s] + self.read_extra_s[k][s] + self.migrate_s[k][s], receivers

    def _record(self, s: int) -> None:
        level = self.ledger.level[s]
        self.kv_peak[s] = max(self.kv_peak[s], level)
        self.peak[s] = max(self.peak[s], self.weights[s] + level + self.running_act[s])

    def _rematch(self, now: float, s: int, k: int) -> list[int]:
        """Dynamic pairing at a start on ``s``: its partner becomes its match; spilled KV migrates
        to a new partner that is a creditor with room for all of it (else ``s`` keeps its partner).
        Returns the stages whose KV changed."""
        if self.mbkr.pairing != "dynamic":
            return []
        new = dynamic_matches(self.ledger.level, self.budget)[s]
        old = self.partner[s]
        if new == old:
            return []
        mine = self.ledger.spilled_total(s)
        if mine == 0:
            self.partner[s] = new
            return []
        if new < 0 or self._room(new) < mine:
            return []
        self.migrated[k][s] = self.ledger.migrate(now, s, new)
        self.touched[old] = self.touched[new] = True
        self.migrate_s[k][s] = self._transfer(old, new, self.migrated[k][s])
        self.partner[s] = new
        return [old, new]

    def _remote_read(self, s: int, k: int, host: int) -> float:
        """Read back the KV item k's group spilled from ``s`` before it; returns the host's serving seconds."""
        nbytes = self.ledger.spilled_of_group(s, self.items[k].group)
        if nbytes <= 0:
            return 0.0
        read = self._transfer(s, host, nbytes)
        self.read_bytes[k][s] = nbytes
        self.read_s[k][s] = read
        self.read_extra_s[k][s] = max(read - self.mbkr.read_overlap * self.att[k][s], 0.0)
        return nbytes / self.q.serve_bandwidth

    def _serve(self, now: float, host: int, seconds: float) -> None:
        """The host's HBM serves a read: its item in progress waits, or an idle host stays busy."""
        k = self.running[host]
        if k is None:
            self.serving_until[host] = max(self.serving_until[host], now) + seconds
            return
        self.block_s[k][host] += seconds
        self.duration[k][host] += seconds
        self.busy_until[host] += seconds
        self._push(self.busy_until[host])

    # ------------------------------------------------------------------ outputs

    def array(self, name: str) -> np.ndarray:
        """An ``[E, N]`` per-item record as float64 (``host`` as int64)."""
        return np.asarray(getattr(self, name), np.int64 if name == "host" else np.float64).reshape(self.E, self.N)


__all__ = ["Engine"]
