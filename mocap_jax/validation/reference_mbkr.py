"""MBKR in the event-driven reference simulator (DESIGN §6, §9; docs/semantics.md "MBKR").

:class:`MBKRReferenceSimulator` extends :class:`~mocap_jax.validation.reference.ReferenceSimulator`
(the same items, §4 costs, hand-offs, release policies and HBM ledgers) with memory-balanced
KV reallocation, simulated from first principles: every decision is taken at the instant it
happens in the timeline that MBKR itself shapes.  It shares with the array program
(:mod:`mocap_jax.mbkr`, :func:`mocap_jax.schedule.evaluate`) only the host-side route helper
:func:`mocap_jax.mbkr.pair_routes` and the §4 formulas of :mod:`mocap_jax.costs`.

What happens, event by event:

* **KV budget** of stage s: ``cap[s] = usable_hbm - weights[s] - workspace[s]``.
* **Add.**  When stage a ends the computation of item k (its KV is complete) the item's KV
  ``x`` is added to a's ledger: ``keep = clip(p2 cap[a] - local[a], 0, x)``; the excess
  goes to a's partner b if b is a creditor (``p1 cap[b] <= local[b] < p2 cap[b]``), up to
  b's room ``p2 cap[b] - local[b]``; the spilled block is held in b's ledger under a's key
  ``(a, k)``; the rest stays on a.  A stage whose ledger then exceeds its budget makes the
  configuration infeasible.
* **Spill write** (and, for dynamic pairing, **migration**) follow on the debtor: the item
  holds its stage for ``hops x link_latency + bytes / (pair_bandwidth x eff_link)`` more,
  and finishes (hands off, frees the stage) when the transfer ends.  So an item's KV event
  happens when its computation ends, which is its finish time whenever it moves nothing.
  docs/semantics.md places the add at the finish; that is circular once the add decides
  how long the write takes, and the causal order is this one (the split is known before
  the write starts).  The two differ by the transfer time of the items that move KV
  (milliseconds), which can reorder near-simultaneous KV events of different stages.
* **Release.**  The KV of a request group (own blocks and spilled blocks, wherever they
  are hosted) is freed at the KV event of the group's last item on the stage (``stage``
  policy) or on the last stage (``request`` policy); such a last item never holds KV.
* **Event order at one instant**: releases before adds, adds in stage order.
* **Dynamic pairing.**  At every add on stage a the stages are ranked by ``local / cap``
  (compared at a resolution of :data:`RANK_RESOLUTION`, ties by stage index: loads that are
  equal in exact arithmetic must not be ordered by rounding noise); the i-th most loaded is
  matched with the i-th least loaded
  (the middle one of an odd count with nobody), and a's partner becomes its match.  If
  that changes a's partner while a has spilled KV, all of it migrates to the new partner
  first (the migration is added to a's item); with no new partner it stays where it is.
* **Remote read.**  When item k starts on stage s, the KV its group already spilled from s
  (``R`` bytes, items before k of the same requests) is read back from its host:
  ``read = hops x link_latency + R / (pair_bandwidth x eff_link)``, of which
  ``max(read - read_overlap x attention[k, s], 0)`` lengthens the item.
* **Creditor blocking.**  At the same instant the host starts spending
  ``R / (hbm_bandwidth x eff_hbm)`` serving the read: the item it is working on (any phase)
  is delayed by that much; an idle host is occupied that long, and an item that arrives
  meanwhile waits.  An item that finishes at that very instant is not delayed; one that
  starts at that instant is.

The result adds MBKR totals (spilled bytes, read, write, blocking, migration seconds),
per-item cost parts and a log of every KV decision (:class:`MBKRReferenceResult`).

Units: seconds and bytes throughout.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from .. import costs
from ..mbkr import pair_routes
from ..specs import HardwareSpec, ModelSpec
from .reference import Item, ReferenceResult, ReferenceSimulator, StageHBM

#: Pairing policies (docs/semantics.md).
PAIRINGS = ("cross-half", "none", "head-to-tail", "dynamic")
#: Dynamic pairing ranks stages by ``local / cap`` rounded to this resolution, so that loads equal in
#: exact arithmetic (sums of the same blocks in another order) tie, and ties go to the lower stage index.
RANK_RESOLUTION = 2.0 ** -20


def check_mbkr_settings(pairing: str, p1: float, p2: float, read_overlap: float) -> None:
    """Raise ``ValueError`` for an unknown pairing or thresholds outside ``0 <= p1 <= p2 <= 1``."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    for name, v in (("p1", p1), ("p2", p2), ("read_overlap", read_overlap)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"MBKR {name} must be a fraction in [0, 1], got {v!r}")
    if float(p1) > float(p2):
        raise ValueError(f"MBKR thresholds need p1 <= p2, got p1={p1}, p2={p2}")


def static_partners(pairing: str, n: int) -> list[int]:
    """Partner of each of ``n`` stages under a static pairing (-1: unpaired).

    ``cross-half``: with ``h = n // 2`` and ``off = n - h``, stage ``s < h`` pairs with
    ``s + off`` (the middle stage of an odd n is unpaired); ``head-to-tail``: ``n-1-s``;
    ``none`` and ``dynamic`` (no fixed partner): -1 everywhere.
    """
    if pairing == "cross-half":
        h, off = n // 2, n - n // 2
        return [s + off if s < h else (s - off if s >= off else -1) for s in range(n)]
    if pairing == "head-to-tail":
        return [n - 1 - s if n - 1 - s != s else -1 for s in range(n)]
    return [-1] * n


# --------------------------------------------------------------------------- result


@dataclass
class MBKRReferenceResult(ReferenceResult):
    """A reference run with MBKR (all fields of :class:`ReferenceResult`, plus the following).

    ``kv_peak_bytes_per_stage`` is the peak of a stage's *local* KV (own + hosted), and
    ``kv_timeline`` its time series.  ``kv_audit`` rows are (time s, KV held over all
    ledgers, KV added so far, KV released so far) after every add, release and migration.

    Attributes:
      pairing, p1, p2, read_overlap: the MBKR settings.
      kv_budget_bytes_per_stage: ``[N]`` bytes, ``usable_hbm - weights - workspace``.
      partner: ``[N]`` static partner (-1 none); for dynamic pairing, each stage's partner at the end.
      spilled_bytes: total bytes spilled (excluding migrations).
      spilled_bytes_per_stage: ``[N]`` bytes spilled from each stage (as debtor).
      remote_read_s: total read time (before overlap).
      remote_read_unhidden_s: total read time not hidden by local attention.
      spill_write_s, migrate_s: total spill-write and migration time.
      blocking_s: total time creditors spent serving reads.
      blocking_s_per_stage: ``[N]`` seconds each stage spent serving reads.
      kv_event_times: ``[K, N]`` s, when stage s added item k's KV (the end of its computation).
      read_bytes: ``[K, N]`` bytes item k on stage s read remotely.
      write_s, read_s, read_extra_s, migrate_s_items: ``[K, N]`` cost parts of each item.
      blocked_s: ``[K, N]`` serving time that landed on item k of stage s (as creditor).
      idle_blocking_s: ``[N]`` serving time that occupied an idle stage.
      overflow: some stage's ledger exceeded its KV budget at an event.
      decisions: one dict per add: time, stage, item, bytes, kept, moved, partner, room,
        local before (of the stage and its partner), migrated bytes.
      transfers: one dict per spill write or migration: time, kind, from/to stage, bytes, seconds.
    """

    pairing: str = "cross-half"
    p1: float = 0.0
    p2: float = 0.85
    read_overlap: float = 0.5
    kv_budget_bytes_per_stage: np.ndarray = None
    partner: np.ndarray = None
    spilled_bytes: float = 0.0
    spilled_bytes_per_stage: np.ndarray = None
    remote_read_s: float = 0.0
    remote_read_unhidden_s: float = 0.0
    spill_write_s: float = 0.0
    migrate_s: float = 0.0
    blocking_s: float = 0.0
    blocking_s_per_stage: np.ndarray = None
    kv_event_times: np.ndarray = None
    read_bytes: np.ndarray = None
    write_s: np.ndarray = None
    read_s: np.ndarray = None
    read_extra_s: np.ndarray = None
    migrate_s_items: np.ndarray = None
    blocked_s: np.ndarray = None
    idle_blocking_s: np.ndarray = None
    overflow: bool = False
    decisions: list = field(default_factory=list, repr=False)
    transfers: list = field(default_factory=list, repr=False)


# --------------------------------------------------------------------------- simulator


class _Clock:
    """The simulation time the HBM ledgers stamp their samples with (``now``, seconds)."""

    def __init__(self):
        self.now = 0.0


@dataclass
class _StageState:
    """One stage during the run.

    Attributes:
      next_item: the next item (in item order) the stage will serve.
      item: the item in progress, or None when idle.
      phase: ``"compute"`` (its §4 work plus the unhidden read), ``"decide"`` (computation ended,
        its KV event is being processed) or ``"transfer"`` (spill write and migration).
      phase_end: when the current phase ends (moves later when a read is served meanwhile).
      blocked_until: an idle stage serving reads is occupied until then.
    """

    next_item: int = 0
    item: int | None = None
    phase: str = "idle"
    phase_end: float = 0.0
    blocked_until: float = 0.0


class MBKRReferenceSimulator(ReferenceSimulator):
    """The event-driven simulation of one MBKR configuration (see the module docstring).

    The item flow is the base class's (stages serve items in item order, hand-offs are
    pure delays, admission as in docs/semantics.md) run by an explicit event queue, so
    that everything happening at one instant is processed in a fixed order: phase ends,
    then the KV events (releases, then adds in stage order), then item starts, then the
    reads those starts issue.
    """

    def __init__(self, model: ModelSpec, hw: HardwareSpec, items: list[Item], placement, release: str,
                 admission: str, pairing: str = "cross-half", p1: float = 0.0, p2: float = 0.85,
                 read_overlap: float = 0.5):
        super().__init__(model, hw, items, placement, release, admission)
        check_mbkr_settings(pairing, p1, p2, read_overlap)
        self.pairing, self.p1, self.p2, self.read_overlap = pairing, float(p1), float(p2), float(read_overlap)
        n, K = self.N, self.K
        self.cap = self.usable_hbm - self.weights - self.workspace
        self.static_partner = static_partners(pairing, n)
        # routes of pair transfers: links shared with every hand-off and (static pairs) every pair route
        route_partner = None if pairing == "dynamic" else np.asarray(self.static_partner)
        hops, bw = pair_routes(hw, self.placement, route_partner, n, np.float64)
        self.pair_hops = np.asarray(hops, np.float64)
        self.pair_bw = np.asarray(bw, np.float64)
        c = np.array([it.tokens for it in items], np.float64)
        p = np.array([it.prefix for it in items], np.float64)
        b = np.array([it.requests for it in items], np.float64)
        self.attention = np.asarray(costs.stage_attention_times(self.model_params, self.hw_params, self.layout,
                                                                c, p, b, n, xp=np), np.float64)
        self.lat = float(hw.link_latency_s)
        self.eff_link = float(hw.eff_link)
        self.serve_bw = float(hw.hbm_bandwidth * hw.eff_hbm)

        # ledgers stamped by the event loop's clock; KV audit after every KV event
        self.clock = _Clock()
        self.hbm = [StageHBM(self.clock, s, self.weights[s], self.usable_hbm) for s in range(n)]
        self.kv_added = 0.0
        self.kv_released = 0.0
        self.kv_audit: list[tuple[float, float, float, float]] = []
        # MBKR state: where each spilled block lives, each stage's current partner
        self.spill_host: dict[tuple[int, int], int] = {}
        self.partner = list(self.static_partner)
        self.overflow = False
        # per item, per stage cost parts
        z = lambda: np.zeros((K, n))
        self.read_bytes, self.read_s, self.read_extra_s = z(), z(), z()
        self.write_s, self.migrate_s_items, self.blocked_s, self.moved = z(), z(), z(), z()
        self.kv_event_time = np.full((K, n), np.nan)
        self.idle_blocking_s = np.zeros(n)
        self.blocking_s_per_stage = np.zeros(n)
        self.work_batch0 = np.zeros(n)
        self.decisions: list[dict] = []
        self.transfers: list[dict] = []
        # item flow
        self.state = [_StageState() for _ in range(n)]
        self.arrival = np.full((K, n), np.nan)
        for it in items:
            if admission == "streaming" or it.batch == 0:
                self.arrival[it.index, 0] = 0.0
        self._heap: list[float] = []
        self._link_intervals: list[tuple[int, float, float]] = []

    # ------------------------------------------------------------------ KV bookkeeping

    def _holds(self, k: int, s: int) -> bool:
        """Whether item k's KV outlives its own KV event on stage s (else it is freed at once)."""
        it = self.items[k]
        if k != it.group_last:
            return True
        return self.release == "request" and s != self.N - 1

    def _audit_kv(self) -> None:
        held = math.fsum(h.level for h in self.hbm)
        self.kv_audit.append((self.clock.now, held, self.kv_added, self.kv_released))

    def _check_budget(self, s: int) -> None:
        if self.hbm[s].level > self.cap[s]:
            self.overflow = True

    def _release_group(self, owner: int, group: int) -> None:
        """Free the KV of ``owner``'s items of ``group``: own blocks and spilled ones, wherever hosted."""
        for q in self.group_items[group]:
            key = (owner, q)
            freed = 0.0
            if key in self.hbm[owner].held:
                freed += self.hbm[owner].withdraw(key)
            host = self.spill_host.pop(key, None)
            if host is not None:
                freed += self.hbm[host].withdraw(key)
            if freed:
                self.kv_released += freed
                self._audit_kv()

    def _rematch(self) -> list[int]:
        """Dynamic pairing: the i-th most loaded stage (by local / cap) with the i-th least loaded."""
        n = self.N
        u = [round(self.hbm[s].level / self.cap[s] / RANK_RESOLUTION) for s in range(n)]
        order = sorted(range(n), key=lambda s: (u[s], s))
        mate = [-1] * n
        for pos, s in enumerate(order):
            if n - 1 - pos != pos:
                mate[s] = order[n - 1 - pos]
        return mate

    def _transfer_s(self, a: int, b: int, nbytes: float) -> float:
        return self.pair_hops[a, b] * self.lat + nbytes / (self.pair_bw[a, b] * self.eff_link)

    def _add(self, s: int, k: int, now: float) -> float:
        """The KV event of item k on stage s; returns the transfer time (spill write + migration)."""
        x = float(self.kv[k, s]) if self._holds(k, s) else 0.0
        migrate = 0.0
        migrated = 0.0
        if self.pairing == "dynamic":
            new_p = self._rematch()[s]
            old_p = self.partner[s]
            mine = [key for key, host in self.spill_host.items() if key[0] == s]
            if new_p != old_p and mine:
                if new_p < 0:
                    new_p = old_p            # nowhere to go: the spilled KV stays where it is
                else:
                    for key in mine:
                        migrated += self.hbm[old_p].move(key, self.hbm[new_p])
                        self.spill_host[key] = new_p
                    migrate = self._transfer_s(old_p, new_p, migrated)
                    self.transfers.append(dict(time=now, kind="migrate", stage=s, item=k, src=old_p, dst=new_p,
                                               bytes=migrated, seconds=migrate))
                    self._check_budget(new_p)
                    self._audit_kv()
            self.partner[s] = new_p
        b = self.partner[s]
        local_a = self.hbm[s].level
        cap_a = self.cap[s]
        keep = min(max(self.p2 * cap_a - local_a, 0.0), x)
        excess = x - keep
        room = 0.0
        local_b = math.nan
        if b >= 0:
            local_b = self.hbm[b].level
            if self.p1 * self.cap[b] <= local_b < self.p2 * self.cap[b]:
                room = self.p2 * self.cap[b] - local_b
        moved = min(excess, room)
        own = x - moved
        if own > 0:
            self.hbm[s].deposit((s, k), own)
        if moved > 0:
            self.hbm[b].deposit((s, k), moved)
            self.spill_host[(s, k)] = b
        self.kv_added += x
        self.moved[k, s] = moved
        self.kv_event_time[k, s] = now
        write = self._transfer_s(s, b, moved) if moved > 0 else 0.0
        if moved > 0:
            self.transfers.append(dict(time=now, kind="write", stage=s, item=k, src=s, dst=b, bytes=moved,
                                       seconds=write))
        self.write_s[k, s] = write
        self.migrate_s_items[k, s] = migrate
        self.decisions.append(dict(time=now, stage=s, item=k, bytes=x, kept=own, moved=moved, partner=b, room=room,
                                   local_before=local_a, partner_local_before=local_b, migrated=migrated))
        self._check_budget(s)
        self._audit_kv()
        return write + migrate

    def _remote(self, s: int, k: int) -> tuple[float, int]:
        """Bytes item k on stage s reads remotely (its group's earlier spills from s) and their host."""
        it = self.items[k]
        total, host = [], -1
        for q in self.group_items[it.group]:
            if q >= k:
                break
            h = self.spill_host.get((s, q))
            if h is not None:
                if host >= 0 and h != host:
                    raise RuntimeError(f"stage {s}: spilled KV of one group on two hosts ({host}, {h})")
                host = h
                total.append(self.hbm[h].held[(s, q)])
        return math.fsum(total), host

    # ------------------------------------------------------------------ item flow

    def _push(self, t: float) -> None:
        heapq.heappush(self._heap, t)

    def _finish(self, s: int, now: float) -> None:
        st = self.state[s]
        k = st.item
        self.finish[k, s] = now
        if self.items[k].batch == 0:
            self.work_batch0[s] += self.t[k, s] + self.read_extra_s[k, s] + self.write_s[k, s] + \
                self.migrate_s_items[k, s]
        st.item, st.phase = None, "idle"
        st.next_item += 1
        if s < self.N - 1:
            arrive = now + self.d[k, s]
            self.arrival[k, s + 1] = arrive
            self._link_intervals.append((s, now, arrive))
            if arrive > now:
                self._push(arrive)
        else:
            j = self.items[k].batch
            if k == self.batch_last[j] and self.admission == "synchronous" and j + 1 < self.num_batches:
                for it in self.items:
                    if it.batch == j + 1:
                        self.arrival[it.index, 0] = now

    def _start(self, s: int, k: int, now: float, serves: list) -> None:
        st = self.state[s]
        self.start[k, s] = now
        R, host = self._remote(s, k)
        extra = 0.0
        if R > 0:
            read = self._transfer_s(s, host, R)
            extra = max(read - self.read_overlap * self.attention[k, s], 0.0)
            self.read_bytes[k, s], self.read_s[k, s], self.read_extra_s[k, s] = R, read, extra
            serves.append((host, R / self.serve_bw, k))
        st.item, st.phase = k, "compute"
        st.phase_end = now + (self.t[k, s] + extra)
        self._push(st.phase_end)

    def _serve(self, c: int, seconds: float, k: int, now: float) -> None:
        """Stage c serves a read of ``seconds``: delays its item in progress, or occupies it if idle."""
        st = self.state[c]
        self.blocking_s_per_stage[c] += seconds
        if self.items[k].batch == 0:
            self.work_batch0[c] += seconds
        if st.item is not None:
            st.phase_end += seconds
            self.blocked_s[st.item, c] += seconds
            self._push(st.phase_end)
        else:
            st.blocked_until = max(st.blocked_until, now) + seconds
            self.idle_blocking_s[c] += seconds
            self._push(st.blocked_until)

    def _instant(self, now: float) -> None:
        """Everything that happens at time ``now``, in the fixed order, until nothing more does."""
        n = self.N
        while True:
            progressed = False
            # 1. phases that end now
            kv_events = []
            for s in range(n):
                st = self.state[s]
                if st.item is None or st.phase_end > now:
                    continue
                if st.phase == "compute":
                    st.phase = "decide"
                    kv_events.append(s)
                elif st.phase == "transfer":
                    self._finish(s, now)
                    progressed = True
            # 2. KV events: every release of the instant, then the adds in stage order
            if kv_events:
                progressed = True
                for s in kv_events:
                    k = self.state[s].item
                    it = self.items[k]
                    if k != it.group_last:
                        continue
                    if self.release == "stage":
                        self._release_group(s, it.group)
                    elif s == n - 1:
                        for owner in range(n):
                            self._release_group(owner, it.group)
                for s in kv_events:
                    st = self.state[s]
                    w = self._add(s, st.item, now)
                    if w > 0:
                        st.phase, st.phase_end = "transfer", now + w
                        self._push(st.phase_end)
                    else:
                        self._finish(s, now)
            # 3. item starts, then the reads they issue
            serves: list = []
            for s in range(n):
                st = self.state[s]
                if st.item is not None or st.next_item >= self.K or st.blocked_until > now:
                    continue
                k = st.next_item
                if not self.arrival[k, s] <= now:
                    continue
                self._start(s, k, now, serves)
                progressed = True
            for c, seconds, k in serves:
                self._serve(c, seconds, k, now)
            if not progressed:
                return

    def run(self) -> MBKRReferenceResult:
        """Run the simulation to completion and summarise it."""
        self._push(0.0)
        while self._heap:
            now = heapq.heappop(self._heap)
            while self._heap and self._heap[0] == now:
                heapq.heappop(self._heap)
            self.clock.now = now
            self._instant(now)
        if np.isnan(self.finish).any():
            raise RuntimeError("MBKR reference simulation ended with unfinished items (deadlock)")
        for s, t0, t1 in self._link_intervals:
            for link in self.links.routes[s]:
                self.links.intervals.setdefault(link, []).append((t0, t1))
        return self._summary()

    def _summary(self) -> MBKRReferenceResult:
        n = self.N
        kv_peak = np.array([h.peak_bytes for h in self.hbm])
        peak_mem = self.weights + self.workspace + kv_peak
        feasible = bool(np.all(peak_mem <= self.usable_hbm)) and not self.overflow
        batch0 = [it.index for it in self.items if it.batch == 0]
        latency = float(self.finish[self.batch_last[0], n - 1])
        batch = sum(self.items[k].requests for k in batch0 if self.items[k].group_last == k)
        period = float(self.work_batch0.max()) if self.admission == "streaming" else latency
        bubble = 1.0 - float(self.work_batch0.sum()) / (n * latency)
        return MBKRReferenceResult(
            finish_times=self.finish.copy(), start_times=self.start.copy(), stage_times=self.t.copy(),
            handoff_times=self.d.copy(), kv_bytes=self.kv.copy(), kv_peak_bytes_per_stage=kv_peak,
            workspace_bytes_per_stage=self.workspace.copy(), weight_bytes_per_stage=self.weights.copy(),
            peak_mem_bytes_per_stage=peak_mem, usable_hbm_bytes=self.usable_hbm,
            kv_timeline=[np.array(h.timeline, np.float64).reshape(-1, 2) for h in self.hbm],
            kv_audit=np.array(self.kv_audit, np.float64).reshape(-1, 4),
            link_busy_s=self.links.busy_seconds(), link_peak_concurrency=self.links.peak_concurrency(),
            prefill_latency_s=latency if feasible else math.inf, batch_latency_s=latency,
            throughput_rps=batch / period if feasible else 0.0, bubble_fraction=bubble, feasible=feasible,
            batch=batch, items_per_batch=len(batch0), num_batches=self.num_batches,
            placement=self.placement.copy(), items=list(self.items),
            pairing=self.pairing, p1=self.p1, p2=self.p2, read_overlap=self.read_overlap,
            kv_budget_bytes_per_stage=self.cap.copy(), partner=np.asarray(self.partner, np.int64),
            spilled_bytes=float(self.moved.sum()), spilled_bytes_per_stage=self.moved.sum(axis=0),
            remote_read_s=float(self.read_s.sum()), remote_read_unhidden_s=float(self.read_extra_s.sum()),
            spill_write_s=float(self.write_s.sum()), migrate_s=float(self.migrate_s_items.sum()),
            blocking_s=float(self.blocking_s_per_stage.sum()), blocking_s_per_stage=self.blocking_s_per_stage.copy(),
            kv_event_times=self.kv_event_time.copy(), read_bytes=self.read_bytes.copy(), write_s=self.write_s.copy(), read_s=self.read_s.copy(),
            read_extra_s=self.read_extra_s.copy(), migrate_s_items=self.migrate_s_items.copy(),
            blocked_s=self.blocked_s.copy(), idle_blocking_s=self.idle_blocking_s.copy(), overflow=self.overflow,
            decisions=list(self.decisions), transfers=list(self.transfers))


__all__ = ["MBKRReferenceResult", "MBKRReferenceSimulator", "PAIRINGS", "RANK_RESOLUTION", "check_mbkr_settings",
           "static_partners"]
