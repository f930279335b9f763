"""What a reference run reports: the timeline, memory resolved in time, feasibility and the summary metrics.

* ``prefill_latency_s``: batch 0's last item leaving the last stage (``inf`` if infeasible);
  ``raw_latency_s`` the same time, feasible or not;
* ``period_s``: the bottleneck stage's work on batch 0 (streaming; item times with MBKR costs) or
  batch 0's latency (synchronous); ``throughput_rps = B / period`` (0 if infeasible);
* ``bubble_fraction = 1 - sum of batch 0's item times / (N x latency)``;
* feasible: every stage's peak memory fits the usable HBM (with MBKR also: no stage overflowed,
  and peaks may exceed the usable HBM by the spill rule's rounding tolerance).

Field names match :class:`mocap_jax.api.SimResult` where the quantity is the same.  Shapes:
``[E, N]`` every item of every batch on every stage; ``[N]`` per stage; ``[T]`` the instants
at which something happened.  Units: seconds, bytes, requests/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .engine import Engine
from .items import Item
from .quantities import Quantities
from .spill import FIT_TOLERANCE, MBKRSettings


@dataclass
class ReferenceResult:
    """One reference run.

    Attributes:
      finish_times, start_times, item_times: ``[E, N]`` when each item finishes and starts on each
        stage, and its time there (``t`` plus MBKR costs: write, unhidden read, migration, blocking).
      stage_times, handoff_times: ``[E, N]`` ``t[k, s]`` and ``d[k, s]`` without MBKR.
      kv_bytes, activation_bytes: ``[E, N]`` KV each item writes and activation buffers it holds.
      weight_bytes_per_stage, kv_budget_bytes_per_stage: ``[N]``; capacity_bytes: usable HBM.
      peak_mem_bytes_per_stage: ``[N]`` largest weights + KV + in-flight activation.
      kv_peak_bytes_per_stage: ``[N]`` largest KV held, hosted or being written.
      feasible, overflow: the run fits; MBKR found no room for some overflow.
      prefill_latency_s, raw_latency_s, period_s, throughput_rps, bubble_fraction: see the module.
      stage_utilisation: ``[N]`` batch 0's work on each stage over the period.
      batch, items_per_batch, num_batches: requests per batch, items per batch, batches.
      timeline_times, timeline_kv_bytes, timeline_mem_bytes: ``[T]``, ``[T, N]``, ``[T, N]``: KV
        on each stage and its memory after everything at each instant.
      kv_audit: ``[A, 4]`` after every KV change: time, KV on every stage, written, released.
      item_moved, item_host, item_read_bytes, item_read_s, item_read_extra_s, item_write_s,
        item_migrated, item_migrate_s, item_block_s: ``[E, N]`` MBKR per item: KV written to the
        partner, the partner at the start (-1 none), bytes read back, read seconds and their
        unhidden part, write seconds, bytes migrated and their seconds, blocking it suffered as host.
      spilled_bytes, spilled_bytes_per_stage, remote_read_s, remote_read_unhidden_s,
        spill_write_s, migrate_s, blocking_s, blocking_s_per_stage: MBKR totals.
      decisions: one dict per MBKR start (the spill rule's inputs and outcome).
    """

    items: list[Item] = field(repr=False)
    placement: np.ndarray
    release: str
    admission: str
    mbkr: MBKRSettings | None
    finish_times: np.ndarray
    start_times: np.ndarray
    item_times: np.ndarray
    stage_times: np.ndarray
    handoff_times: np.ndarray
    kv_bytes: np.ndarray
    activation_bytes: np.ndarray
    weight_bytes_per_stage: np.ndarray
    kv_budget_bytes_per_stage: np.ndarray
    capacity_bytes: float
    peak_mem_bytes_per_stage: np.ndarray
    kv_peak_bytes_per_stage: np.ndarray
    feasible: bool
    overflow: bool
    prefill_latency_s: float
    raw_latency_s: float
    period_s: float
    throughput_rps: float
    bubble_fraction: float
    stage_utilisation: np.ndarray
    batch: int
    items_per_batch: int
    num_batches: int
    timeline_times: np.ndarray
    timeline_kv_bytes: np.ndarray
    timeline_mem_bytes: np.ndarray
    kv_audit: np.ndarray
    item_moved: np.ndarray
    item_host: np.ndarray
    item_read_bytes: np.ndarray
    item_read_s: np.ndarray
    item_read_extra_s: np.ndarray
    item_write_s: np.ndarray
    item_migrated: np.ndarray
    item_migrate_s: np.ndarray
    item_block_s: np.ndarray
    spilled_bytes: float
    spilled_bytes_per_stage: np.ndarray
    remote_read_s: float
    remote_read_unhidden_s: float
    spill_write_s: float
    migrate_s: float
    blocking_s: float
    blocking_s_per_stage: np.ndarray
    decisions: list = field(default_factory=list, repr=False)


def summarise(engine: Engine, q: Quantities, placement: np.ndarray) -> ReferenceResult:
    """The :class:`ReferenceResult` of a finished :class:`Engine`."""
    items, N = engine.items, engine.N
    batch0 = [it.index for it in items if it.batch == 0]
    requests = sum(items[k].requests for k in batch0 if items[k].last)
    finish, times = engine.array("finish"), engine.array("duration")
    latency = float(finish[engine.batch_last[0], N - 1])
    work = np.array([math.fsum(times[k, s] for k in batch0) for s in range(N)])
    period = latency if engine.admission == "synchronous" else float(work.max())
    peak = np.asarray(engine.peak, np.float64)
    if engine.mbkr is None:
        feasible = bool(np.all(peak <= q.usable))
    else:
        allowance = np.where(engine.touched, 1 + FIT_TOLERANCE, 1.0)
        feasible = not engine.overflow and bool(np.all(peak <= q.usable * allowance))
    moved, block = engine.array("moved"), engine.array("block_s")
    tl_times = np.array([t for t, _, _ in engine.timeline], np.float64)
    return ReferenceResult(
        items=items, placement=np.asarray(placement, np.int64), release=engine.release,
        admission=engine.admission, mbkr=engine.mbkr, finish_times=finish, start_times=engine.array("start"),
        item_times=times, stage_times=q.time.copy(), handoff_times=q.handoff.copy(), kv_bytes=q.kv.copy(),
        activation_bytes=q.activation.copy(), weight_bytes_per_stage=q.weights.copy(),
        kv_budget_bytes_per_stage=q.budget.copy(), capacity_bytes=q.usable, peak_mem_bytes_per_stage=peak,
        kv_peak_bytes_per_stage=np.asarray(engine.kv_peak, np.float64), feasible=feasible,
        overflow=engine.overflow, prefill_latency_s=latency if feasible else math.inf, raw_latency_s=latency,
        period_s=period, throughput_rps=requests / period if feasible else 0.0,
        bubble_fraction=1.0 - math.fsum(work) / (N * latency), stage_utilisation=work / period,
        batch=requests, items_per_batch=len(batch0), num_batches=items[-1].batch + 1,
        timeline_times=tl_times,
        timeline_kv_bytes=np.array([kv for _, kv, _ in engine.timeline], np.float64).reshape(-1, N),
        timeline_mem_bytes=np.array([m for _, _, m in engine.timeline], np.float64).reshape(-1, N),
        kv_audit=engine.ledger.audit_array(), item_moved=moved, item_host=engine.array("host"),
        item_read_bytes=engine.array("read_bytes"), item_read_s=engine.array("read_s"),
        item_read_extra_s=engine.array("read_extra_s"), item_write_s=engine.array("write_s"),
        item_migrated=engine.array("migrated"), item_migrate_s=engine.array("migrate_s"), item_block_s=block,
        spilled_bytes=float(moved.sum()), spilled_bytes_per_stage=moved.sum(axis=0),
        remote_read_s=float(engine.array("read_s").sum()),
        remote_read_unhidden_s=float(engine.array("read_extra_s").sum()),
        spill_write_s=float(engine.array("write_s").sum()), migrate_s=float(engine.array("migrate_s").sum()),
        blocking_s=float(block.sum()), blocking_s_per_stage=block.sum(axis=0), decisions=list(engine.decisions))


__all__ = ["ReferenceResult", "summarise"]
