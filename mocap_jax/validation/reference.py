"""Event-driven reference simulator of prefill pipelining (DESIGN §9, check 1).

An independent statement of ``docs/semantics.md`` as a discrete-event simulation
(SimPy), written without the array kernels (``mocap_jax.pipeline``,
``mocap_jax.schedule``, ``mocap_jax.memory``, ``mocap_jax.simulate``).  It shares
with them only what must be shared: the spec types, mesh routing and the §4
per-operation cost formulas, evaluated with NumPy in float64.  Everything else --
items, admission, the order stages serve items in, hand-offs, KV accounting,
release policies, peaks, feasibility and the summary metrics -- is re-derived here
from first principles:

* every **stage** is a ``simpy.Resource`` of capacity 1 (one item at a time).  An
  item queues at a stage only after its predecessor in item order has queued there,
  so the FIFO queue serves items in item order;
* every **hand-off** s -> s+1 is a pure delay on the XY route between the two dies
  (several hand-offs may share a route); its bandwidth is the route's bottleneck
  ``link_bandwidth / sharers``, where sharers counts the hand-off routes that use the
  link (docs/semantics.md); the simulator records the busy intervals of each directed
  link it crosses;
* every stage's **HBM** is an explicit ledger (:class:`StageHBM`) of KV blocks
  keyed by ``(owner stage, item)``; blocks are deposited when a stage finishes an
  item and withdrawn by the release policy.  The owner key lets a later MBKR model
  (DESIGN §6) keep a debtor's spilled KV in its creditor's ledger.

MBKR (``scheme="mbkr"``) is simulated by
:class:`~mocap_jax.validation.reference_mbkr.MBKRReferenceSimulator`, a subclass with its
own event queue (spill decisions, remote reads and creditor blocking at their instants).

The simulation is slow (Python events) and meant for validation and small studies;
sweeps use :func:`mocap_jax.simulate`.

Units: seconds and bytes throughout.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import simpy

from .. import costs
from ..specs.mesh import link_bandwidth, snake_placement, xy_route
from ..specs import HardwareSpec, ModelSpec, get_hardware, get_model

#: Schemes the reference implements (``mbkr``: :mod:`mocap_jax.validation.reference_mbkr`).
SCHEMES = ("terapipe", "gpipe", "mbkr")
#: Chunked schemes: items are token chunks of every request of the batch.
CHUNKED_SCHEMES = ("terapipe", "mbkr")
RELEASE_POLICIES = ("stage", "request")
ADMISSION_MODES = ("streaming", "synchronous")


# --------------------------------------------------------------------------- items


@dataclass(frozen=True)
class Item:
    """One work item: what flows through the stages (docs/semantics.md, "Items").

    Attributes:
      index: position k in item order over all batches.
      batch: which of the ``num_batches`` batches it belongs to.
      group: global id of its request group (same requests = same group).
      group_last: item index of its group's last item.
      tokens: tokens per request in this item (chunk size, or S for gpipe).
      prefix: tokens per request already processed before this item.
      requests: requests carried.
      last: the item ends its requests (the LM head runs on the last stage).
    """

    index: int
    batch: int
    group: int
    group_last: int
    tokens: int
    prefix: int
    requests: int
    last: bool


def uniform_partition(seq_len: int, chunks: int) -> list[int]:
    """``c_k = S // M + (1 if k < S % M else 0)`` for ``k < M``."""
    return [seq_len // chunks + (1 if k < seq_len % chunks else 0) for k in range(chunks)]


def build_items(scheme: str, seq_len: int, batch: int, chunks: int = 16, partition: Sequence[int] | None = None,
                microbatch: int = 1, num_batches: int = 1) -> list[Item]:
    """The items of ``num_batches`` identical batches, in item order.

    Args:
      scheme: ``"terapipe"`` (chunked) or ``"gpipe"`` (whole-request microbatches).
      seq_len: prompt tokens S per request.
      batch: requests B per batch.
      chunks: M for the uniform partition when ``partition`` is None (chunked only).
      partition: chunk sizes ``[M]`` (positive, summing to S), chunked only.
      microbatch: requests per gpipe microbatch.
      num_batches: batches run back to back.

    Returns:
      ``num_batches x items-per-batch`` :class:`Item` objects.
    """
    per_batch: list[tuple[int, int, int, bool, int]] = []  # tokens, prefix, requests, last, group-in-batch
    if scheme in CHUNKED_SCHEMES:
        sizes = uniform_partition(seq_len, chunks) if partition is None else [int(c) for c in partition]
        prefix = 0
        for k, c in enumerate(sizes):
            per_batch.append((c, prefix, batch, k == len(sizes) - 1, 0))
            prefix += c
        groups_per_batch = 1
    else:
        n_micro = -(-batch // microbatch)
        for j in range(n_micro):
            per_batch.append((seq_len, 0, min(microbatch, batch - j * microbatch), True, j))
        groups_per_batch = n_micro
    items: list[Item] = []
    m = len(per_batch)
    for j in range(num_batches):
        # last item index of each group within the batch
        group_last = {}
        for i, (_, _, _, _, g) in enumerate(per_batch):
            group_last[g] = i
        for i, (c, p, b, last, g) in enumerate(per_batch):
            items.append(Item(index=j * m + i, batch=j, group=j * groups_per_batch + g,
                              group_last=j * m + group_last[g], tokens=c, prefix=p, requests=b, last=last))
    return items


# --------------------------------------------------------------------------- HBM ledger


class StageHBM:
    """HBM of one stage as an event-driven ledger of KV blocks.

    Blocks are keyed by ``(owner_stage, item)``: the stage whose layers produced the
    KV and the item that produced it.  Without MBKR every block sits on its owner;
    MBKR will deposit a debtor's spill in its creditor's ledger under the debtor's
    key.  The ledger keeps a time series of its KV level with one sample per event
    time (the level after everything that happens at that time, so a block deposited
    and withdrawn at the same instant never counts), and reports every change to a
    shared audit callback.

    Attributes:
      stage: stage index.
      weight_bytes: weights of the stage's layers (bytes).
      capacity_bytes: usable HBM (``hbm_capacity x usable_hbm_fraction``, bytes).
      held: ``{(owner_stage, item): bytes}`` blocks held now.
      produced_bytes, freed_bytes: cumulative KV deposited / withdrawn (bytes).
      timeline: list of ``(time_s, kv_bytes)`` samples.
    """

    def __init__(self, env: simpy.Environment, stage: int, weight_bytes: float, capacity_bytes: float, audit=None):
        self.env = env
        self.stage = stage
        self.weight_bytes = float(weight_bytes)
        self.capacity_bytes = float(capacity_bytes)
        self.held: dict[tuple[int, int], float] = {}
        self.produced_bytes = 0.0
        self.freed_bytes = 0.0
        self.timeline: list[tuple[float, float]] = [(0.0, 0.0)]
        self._audit = audit

    @property
    def level(self) -> float:
        """KV bytes held now (exact sum over the held blocks)."""
        return math.fsum(self.held.values())

    def deposit(self, key: tuple[int, int], nbytes: float) -> None:
        """Add a KV block (bytes) under ``key`` at the current time."""
        if key in self.held:
            raise RuntimeError(f"stage {self.stage}: KV block {key} deposited twice")
        self.held[key] = float(nbytes)
        self.produced_bytes += float(nbytes)
        self._record(key, float(nbytes))

    def withdraw(self, key: tuple[int, int]) -> float:
        """Free the block under ``key`` now; returns its bytes."""
        nbytes = self.held.pop(key)
        self.freed_bytes += nbytes
        self._record(key, -nbytes)
        return nbytes

    def move(self, key: tuple[int, int], other: "StageHBM") -> float:
        """Move the block under ``key`` to ``other`` (an MBKR migration); returns its bytes.

        Neither ledger counts the move as KV produced or freed.
        """
        nbytes = self.held.pop(key)
        self._record(key, -nbytes)
        if key in other.held:
            raise RuntimeError(f"stage {other.stage}: KV block {key} moved in twice")
        other.held[key] = nbytes
        other._record(key, nbytes)
        return nbytes

    def withdraw_items(self, owner: int, items: Sequence[int]) -> float:
        """Free every block of ``owner`` produced by ``items`` that is held here; returns bytes freed."""
        return sum(self.withdraw((owner, k)) for k in items if (owner, k) in self.held)

    def _record(self, key, delta: float) -> None:
        now = float(self.env.now)
        level = self.level
        if self.timeline and self.timeline[-1][0] == now:
            self.timeline[-1] = (now, level)
        else:
            self.timeline.append((now, level))
        if self._audit is not None:
            self._audit(now, self.stage, key, delta)

    @property
    def peak_bytes(self) -> float:
        """Largest KV level over the run (0 if nothing was ever held)."""
        return max(level for _, level in self.timeline)


# --------------------------------------------------------------------------- links


class RouteLinks:
    """Directed mesh links and the hand-off routes over them.

    A hand-off is a pure delay (docs/semantics.md): routes are not exclusive, several
    hand-offs may be in flight on one link.  A link's bandwidth is divided among the
    hand-off routes that use it (in a full pipeline they all run concurrently), and a
    route runs at its bottleneck share.  Each transfer is recorded as a busy interval
    on every directed link of its XY route.

    Attributes:
      routes: per hand-off s -> s+1, the directed links ``(from_die, to_die)`` of its XY route.
      sharers: per directed link, how many hand-off routes use it.
    """

    def __init__(self, env: simpy.Environment, hw: HardwareSpec, placement: np.ndarray):
        self.env = env
        self.hw = hw
        n = len(placement)
        self.routes: list[list[tuple[int, int]]] = [
            xy_route(hw, int(placement[s]), int(placement[s + 1])) for s in range(n - 1)]
        self.sharers: dict[tuple[int, int], int] = {}
        for route in self.routes:
            for link in set(route):
                self.sharers[link] = self.sharers.get(link, 0) + 1
        self.intervals: dict[tuple[int, int], list[tuple[float, float]]] = {}

    def shared_bandwidth(self) -> np.ndarray:
        """``[N]`` bytes/s each hand-off route gets: min over its links of raw bandwidth / sharers.

        Entry ``N-1`` (no hand-off after the last stage) is 1, as in :class:`costs.StageLayout`.
        """
        bw = np.ones(len(self.routes) + 1)
        for s, route in enumerate(self.routes):
            bw[s] = min(link_bandwidth(self.hw, l) / self.sharers[l] for l in route)
        return bw

    def handoff(self, stage: int, delay: float):
        """SimPy process body: carry one hand-off from ``stage`` to ``stage + 1``."""
        start = float(self.env.now)
        yield self.env.timeout(delay)
        end = float(self.env.now)
        for link in self.routes[stage]:
            self.intervals.setdefault(link, []).append((start, end))

    def busy_seconds(self) -> dict[tuple[int, int], float]:
        """Per directed link, the length of the union of its busy intervals (s)."""
        out = {}
        for link, iv in self.intervals.items():
            total, cur_start, cur_end = 0.0, None, None
            for a, b in sorted(iv):
                if cur_end is None or a > cur_end:
                    if cur_end is not None:
                        total += cur_end - cur_start
                    cur_start, cur_end = a, b
                else:
                    cur_end = max(cur_end, b)
            if cur_end is not None:
                total += cur_end - cur_start
            out[link] = total
        return out

    def peak_concurrency(self) -> dict[tuple[int, int], int]:
        """Per directed link, the most hand-offs in flight on it at once."""
        out = {}
        for link, iv in self.intervals.items():
            events = sorted([(a, 1) for a, _ in iv] + [(b, -1) for _, b in iv], key=lambda e: (e[0], e[1]))
            cur = best = 0
            for _, step in events:
                cur += step
                best = max(best, cur)
            out[link] = best
        return out


# --------------------------------------------------------------------------- stages


class StageServer:
    """A pipeline stage: one item at a time, FIFO in item order."""

    def __init__(self, env: simpy.Environment, stage: int, num_items: int):
        self.stage = stage
        self.resource = simpy.Resource(env, capacity=1)
        # _queued[k] fires when item k has joined this stage's queue.
        self._queued = [env.event() for _ in range(num_items)]

    def turn(self, k: int):
        """Event: item k may queue here (item k-1 already has)."""
        return self._queued[k - 1] if k > 0 else None

    def join(self, k: int):
        """Queue item k; returns the request event (granted when the stage is free)."""
        req = self.resource.request()
        self._queued[k].succeed()
        return req


# --------------------------------------------------------------------------- result


@dataclass
class ReferenceResult:
    """Outcome of one reference run.

    Attributes:
      finish_times: ``[K, N]`` s, when stage s finishes item k (K = items of all batches, item order).
      start_times: ``[K, N]`` s, when stage s starts item k.
      stage_times: ``[K, N]`` s, time t[k, s] of item k on stage s (§4).
      handoff_times: ``[K, N]`` s, hand-off delay s -> s+1 (0 on the last stage).
      kv_bytes: ``[K, N]`` bytes of KV item k adds to stage s.
      kv_peak_bytes_per_stage: ``[N]`` bytes, peak KV held by each stage.
      workspace_bytes_per_stage: ``[N]`` bytes, largest in-flight item workspace.
      weight_bytes_per_stage: ``[N]`` bytes.
      peak_mem_bytes_per_stage: ``[N]`` bytes, weights + workspace + peak KV.
      usable_hbm_bytes: HBM a stage may fill (bytes).
      kv_timeline: per stage, an array ``[T_s, 2]`` of (time s, KV bytes) samples, one per
        event time, the level after everything at that time.
      kv_audit: ``[E, 4]`` one row per ledger event: (time s, KV bytes held over all
        stages, cumulative KV produced, cumulative KV freed), after the event.
      link_busy_s: per directed link ``(from_die, to_die)``, seconds it carried at least one hand-off.
      link_peak_concurrency: per directed link, the most hand-offs in flight at once.
      prefill_latency_s: finish of batch 0's last item on the last stage (inf if infeasible).
      batch_latency_s: the same time even when infeasible.
      throughput_rps: saturation throughput, requests/s (0 if infeasible).
      bubble_fraction: idle share of the N stages over batch 0's latency.
      feasible: every stage's peak memory fits its usable HBM.
      batch: requests per batch.
      items_per_batch: items per batch.
      num_batches: batches simulated.
      placement: ``[N]`` die of each stage.
    """

    finish_times: np.ndarray
    start_times: np.ndarray
    stage_times: np.ndarray
    handoff_times: np.ndarray
    kv_bytes: np.ndarray
    kv_peak_bytes_per_stage: np.ndarray
    workspace_bytes_per_stage: np.ndarray
    weight_bytes_per_stage: np.ndarray
    peak_mem_bytes_per_stage: np.ndarray
    usable_hbm_bytes: float
    kv_timeline: list[np.ndarray]
    kv_audit: np.ndarray
    link_busy_s: dict[tuple[int, int], float]
    link_peak_concurrency: dict[tuple[int, int], int]
    prefill_latency_s: float
    batch_latency_s: float
    throughput_rps: float
    bubble_fraction: float
    feasible: bool
    batch: int
    items_per_batch: int
    num_batches: int
    placement: np.ndarray
    items: list[Item] = field(default_factory=list, repr=False)


# --------------------------------------------------------------------------- simulator


class ReferenceSimulator:
    """The discrete-event simulation of one configuration.

    Build it with the resolved inputs, call :meth:`run` once.  Subclasses (MBKR) can
    override :meth:`on_finish` (KV placement and release) and :meth:`stage_work`
    (extra blocking on a stage) without touching the item flow.
    """

    def __init__(self, model: ModelSpec, hw: HardwareSpec, items: list[Item], placement: np.ndarray,
                 release: str, admission: str):
        self.model, self.hw, self.items = model, hw, items
        self.placement = np.asarray(placement, dtype=np.int64)
        self.release, self.admission = release, admission
        self.N = n = len(self.placement)
        self.K = k_count = len(items)
        self.num_batches = max(it.batch for it in items) + 1
        self.env = simpy.Environment()
        self.links = RouteLinks(self.env, hw, self.placement)

        # §4 costs, per operation, float64 NumPy; hand-offs at their shared route bandwidth.
        mp = costs.ModelParams.from_spec(model, np.float64)
        hp = costs.HardwareParams.from_spec(hw, np.float64)
        layout = costs.StageLayout.from_placement(hw, self.placement, dtype=np.float64)
        layout = dataclasses.replace(layout, handoff_bandwidth=self.links.shared_bandwidth())
        self.model_params, self.hw_params, self.layout = mp, hp, layout
        c = np.array([it.tokens for it in items], np.float64)
        p = np.array([it.prefix for it in items], np.float64)
        b = np.array([it.requests for it in items], np.float64)
        last = np.array([it.last for it in items], bool)
        self.t = np.asarray(costs.stage_times(mp, hp, layout, c, p, b, last, n, xp=np), np.float64)
        self.d = np.asarray(costs.handoff_time(mp, hp, layout, c, b, n, xp=np), np.float64)
        kv_per_token = np.asarray(costs.stage_kv_bytes_per_token(mp, hp, n, n, xp=np), np.float64)
        self.kv = np.array([[it.requests * it.tokens * kv_per_token[s] for s in range(n)] for it in items])
        self.workspace = np.asarray(costs.item_workspace_bytes(mp, hp, kv_per_token, c, b), np.float64).max(axis=0)
        self.weights = np.asarray(costs.stage_weight_bytes(mp, hp, n, n, xp=np), np.float64)
        self.usable_hbm = float(hw.hbm_capacity * hw.usable_hbm_fraction)

        self.audit: list[tuple[float, float, float, float]] = []
        self.hbm = [StageHBM(self.env, s, self.weights[s], self.usable_hbm, self._audit) for s in range(n)]
        self.stages = [StageServer(self.env, s, k_count) for s in range(n)]
        self.start = np.full((k_count, n), np.nan)
        self.finish = np.full((k_count, n), np.nan)
        # batch_done[j] fires when batch j's last item leaves the last stage.
        self.batch_done = [self.env.event() for _ in range(self.num_batches)]
        self.batch_last = {j: max(it.index for it in items if it.batch == j) for j in range(self.num_batches)}
        self.group_items: dict[int, list[int]] = {}
        for it in items:
            self.group_items.setdefault(it.group, []).append(it.index)

    # ---- ledger audit
    def _audit(self, now, stage, key, delta):
        held = math.fsum(h.level for h in self.hbm)
        produced = math.fsum(h.produced_bytes for h in self.hbm)
        freed = math.fsum(h.freed_bytes for h in self.hbm)
        self.audit.append((now, held, produced, freed))

    # ---- hooks
    def stage_work(self, k: int, s: int):
        """SimPy process body: the work of item k on stage s (a delay of t[k, s])."""
        yield self.env.timeout(self.t[k, s])

    def on_finish(self, k: int, s: int) -> None:
        """KV bookkeeping when stage s finishes item k (deposit, then release policy)."""
        it = self.items[k]
        self.hbm[s].deposit((s, k), self.kv[k, s])
        if k != it.group_last:
            return
        group = self.group_items[it.group]
        if self.release == "stage":
            self.hbm[s].withdraw_items(s, group)
        elif s == self.N - 1:  # "request": the group leaves the last stage
            for owner in range(self.N):
                for h in self.hbm:
                    h.withdraw_items(owner, group)

    # ---- item flow
    def _item(self, k: int):
        env = self.env
        it = self.items[k]
        if self.admission == "synchronous" and it.batch > 0:
            yield self.batch_done[it.batch - 1]
        for s in range(self.N):
            stage = self.stages[s]
            turn = stage.turn(k)
            if turn is not None:
                yield turn
            req = stage.join(k)
            yield req
            self.start[k, s] = env.now
            yield from self.stage_work(k, s)
            self.finish[k, s] = env.now
            stage.resource.release(req)
            self.on_finish(k, s)
            if s < self.N - 1:
                yield from self.links.handoff(s, self.d[k, s])
        if k == self.batch_last[it.batch]:
            self.batch_done[it.batch].succeed()

    def run(self) -> ReferenceResult:
        """Run the simulation to completion and summarise it."""
        for k in range(self.K):
            self.env.process(self._item(k))
        self.env.run()
        if np.isnan(self.finish).any():
            raise RuntimeError("reference simulation ended with unfinished items (deadlock)")
        n = self.N
        kv_peak = np.array([h.peak_bytes for h in self.hbm])
        peak_mem = self.weights + self.workspace + kv_peak
        feasible = bool(np.all(peak_mem <= self.usable_hbm))
        batch0 = [it.index for it in self.items if it.batch == 0]
        latency = float(self.finish[self.batch_last[0], n - 1])
        batch = sum(self.items[k].requests for k in batch0 if self.items[k].group_last == k)
        work0 = self.t[batch0]
        if self.admission == "streaming":
            period = float(work0.sum(axis=0).max())
        else:
            period = latency
        bubble = 1.0 - float(work0.sum()) / (n * latency)
        return ReferenceResult(
            finish_times=self.finish.copy(), start_times=self.start.copy(), stage_times=self.t.copy(),
            handoff_times=self.d.copy(), kv_bytes=self.kv.copy(), kv_peak_bytes_per_stage=kv_peak,
            workspace_bytes_per_stage=self.workspace.copy(), weight_bytes_per_stage=self.weights.copy(),
            peak_mem_bytes_per_stage=peak_mem, usable_hbm_bytes=self.usable_hbm,
            kv_timeline=[np.array(h.timeline, np.float64).reshape(-1, 2) for h in self.hbm],
            kv_audit=np.array(self.audit, np.float64).reshape(-1, 4),
            link_busy_s=self.links.busy_seconds(), link_peak_concurrency=self.links.peak_concurrency(),
            prefill_latency_s=latency if feasible else math.inf, batch_latency_s=latency,
            throughput_rps=batch / period if feasible else 0.0, bubble_fraction=bubble, feasible=feasible,
            batch=batch, items_per_batch=len(batch0), num_batches=self.num_batches,
            placement=self.placement.copy(), items=list(self.items))


# --------------------------------------------------------------------------- entry point


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) <= 0:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def reference_simulate(model, hardware, seq_len, scheme: str = "terapipe", chunks: int = 16, batch: int = 1,
                       partition=None, release: str = "stage", admission: str = "streaming", num_batches: int = 1,
                       microbatch: int = 1, placement=None, pairing: str = "cross-half", p1: float = 0.0,
                       p2: float = 0.85, read_overlap: float = 0.5) -> ReferenceResult:
    """Simulate one configuration event by event (docs/semantics.md).

    Args:
      model: preset name, spec file path or :class:`ModelSpec`.
      hardware: preset name (any ``mocap-RxC``), spec file path or :class:`HardwareSpec`.
      seq_len: prompt tokens S per request.
      scheme: ``"terapipe"`` (chunked), ``"gpipe"`` or ``"mbkr"`` (chunked with memory-balanced KV
        reallocation, :mod:`mocap_jax.validation.reference_mbkr`).
      chunks: M, chunks of the uniform partition when ``partition`` is None.
      batch: requests B per batch.
      partition: chunk sizes ``[M]`` (positive ints summing to S); chunked schemes only.
      release: KV release policy, ``"stage"`` or ``"request"``.
      admission: ``"streaming"`` or ``"synchronous"``.
      num_batches: identical batches run back to back.
      microbatch: requests per gpipe microbatch.
      placement: ``[N]`` die of each stage (distinct); default the snake order over every die (also
        for ``mbkr``: the reference searches no placement; pass the array side's searched one to compare).
      pairing: MBKR pairing policy, ``"cross-half"``, ``"none"``, ``"head-to-tail"`` or ``"dynamic"``
        (``mbkr`` only, like ``p1``, ``p2`` and ``read_overlap``).
      p1, p2: MBKR role thresholds, fractions of a stage's KV budget (``0 <= p1 <= p2 <= 1``).
      read_overlap: fraction of a debtor item's local attention time that hides its remote read.

    Returns:
      A :class:`ReferenceResult` (an :class:`~mocap_jax.validation.reference_mbkr.MBKRReferenceResult`
      for ``mbkr``).

    Raises:
      ValueError: on any bad argument (before anything is simulated).
    """
    m = get_model(model)
    hw = get_hardware(hardware)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not in the reference simulator; choose one of {SCHEMES}")
    if release not in RELEASE_POLICIES:
        raise ValueError(f"release must be one of {RELEASE_POLICIES}, got {release!r}")
    if admission not in ADMISSION_MODES:
        raise ValueError(f"admission must be one of {ADMISSION_MODES}, got {admission!r}")
    seq_len = _positive_int("seq_len", seq_len)
    batch = _positive_int("batch", batch)
    num_batches = _positive_int("num_batches", num_batches)
    microbatch = _positive_int("microbatch", microbatch)
    if scheme in CHUNKED_SCHEMES:
        if partition is None:
            chunks = _positive_int("chunks", chunks)
            if chunks > seq_len:
                raise ValueError(f"chunks ({chunks}) must not exceed seq_len ({seq_len}): every chunk needs a token")
        else:
            part = np.asarray(partition)
            if part.ndim != 1 or part.size == 0 or not np.issubdtype(part.dtype, np.integer) or (part <= 0).any():
                raise ValueError(f"partition must be a non-empty 1-D list of positive integers, got {partition!r}")
            if int(part.sum()) != seq_len:
                raise ValueError(f"partition sums to {int(part.sum())} tokens, but seq_len is {seq_len}")
            partition = [int(c) for c in part]
    elif partition is not None:
        raise ValueError("partition applies to chunked schemes only, not gpipe")
    if placement is None:
        placement = snake_placement(hw)
    placement = np.asarray(placement)
    if placement.ndim != 1 or placement.size == 0 or not np.issubdtype(placement.dtype, np.integer):
        raise ValueError(f"placement must be a 1-D list of die indices, got {placement!r}")
    if len(set(placement.tolist())) != placement.size or placement.min() < 0 or placement.max() >= hw.num_dies:
        raise ValueError(f"placement must list distinct dies in [0, {hw.num_dies}), got {placement.tolist()}")
    items = build_items(scheme, seq_len, batch, chunks, partition, microbatch, num_batches)
    if scheme == "mbkr":
        from .reference_mbkr import MBKRReferenceSimulator, check_mbkr_settings

        check_mbkr_settings(pairing, p1, p2, read_overlap)
        return MBKRReferenceSimulator(m, hw, items, placement, release, admission, pairing=pairing, p1=float(p1),
                                      p2=float(p2), read_overlap=float(read_overlap)).run()
    return ReferenceSimulator(m, hw, items, placement, release, admission).run()


__all__ = ["Item", "ReferenceResult", "ReferenceSimulator", "RouteLinks", "StageHBM", "StageServer",
           "build_items", "reference_simulate", "uniform_partition", "SCHEMES", "RELEASE_POLICIES",
           "ADMISSION_MODES"]
