"""``simulate``: one configuration in full detail (times in s, memory in bytes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import numpy as np

from ..costs.computed_once import COMPILE_BOUND_OPTIONS
from ..mbkr.pairing import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP
from ..prefill.batch import check_honest
from ..prefill.evaluate import Structure, evaluate
from ..prefill.points import replace_items
from ..schedule import memory
from ..schedule.shape import MBKRMode, SimShape
from ..specs import LIMITS, checks
from .config import Config, resolve

_evaluate_one = jax.jit(evaluate, static_argnums=1, compiler_options=COMPILE_BOUND_OPTIONS)

#: default largest batch of ``batch="auto"`` searches
DEFAULT_MAX_BATCH = 1024


@dataclass
class SimResult:
    """One simulated configuration.

    Times in seconds, memory in bytes, throughput in requests/s.  Arrays: ``finish_times`` /
    ``start_times`` ``[K, N]`` over every real item of every batch (K = num_batches x items per
    batch, in order); ``stage_times`` / ``handoff_times`` ``[K1, N]`` for one batch without MBKR;
    per-stage vectors ``[N]``; ``timeline_times [T]``, ``timeline_kv_bytes [T, N]`` (KV each stage
    holds, hosts or is writing after each time) and ``timeline_mem_bytes [T, N]`` (weights + KV +
    in-flight activations).
    """

    scheme: str
    model: str
    hardware: str
    seq_len: int
    batch: int
    chunks: int
    partition: np.ndarray
    release: str
    admission: str
    num_batches: int
    placement: np.ndarray
    feasible: bool
    prefill_latency_s: float
    raw_latency_s: float
    throughput_rps: float
    period_s: float
    bubble_fraction: float
    finish_times: np.ndarray
    start_times: np.ndarray
    stage_times: np.ndarray
    handoff_times: np.ndarray
    stage_utilisation: np.ndarray
    kv_peak_bytes_per_stage: np.ndarray
    weight_bytes_per_stage: np.ndarray
    peak_mem_bytes_per_stage: np.ndarray
    capacity_bytes: float
    timeline_times: np.ndarray | None = None
    timeline_kv_bytes: np.ndarray | None = None
    timeline_mem_bytes: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.placement)

    def to_dict(self, arrays: bool = False) -> dict[str, Any]:
        """JSON-ready summary (per-stage lists included; item-level arrays if ``arrays``)."""
        finite = lambda v: v if math.isfinite(v) else None
        d = {
            "scheme": self.scheme, "model": self.model, "hardware": self.hardware, "seq_len": self.seq_len,
            "batch": self.batch, "chunks": self.chunks, "partition": self.partition.tolist(),
            "release": self.release, "admission": self.admission, "num_batches": self.num_batches,
            "stages": self.num_stages, "placement": self.placement.tolist(), "feasible": self.feasible,
            "prefill_latency_s": finite(self.prefill_latency_s), "raw_latency_s": self.raw_latency_s,
            "throughput_rps": self.throughput_rps, "period_s": self.period_s,
            "bubble_fraction": self.bubble_fraction, "stage_utilisation": self.stage_utilisation.tolist(),
            "peak_mem_bytes_per_stage": self.peak_mem_bytes_per_stage.tolist(),
            "kv_peak_bytes_per_stage": self.kv_peak_bytes_per_stage.tolist(),
            "weight_bytes_per_stage": self.weight_bytes_per_stage.tolist(), "capacity_bytes": self.capacity_bytes,
        }
        d.update({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.extra.items()
                  if not (isinstance(v, np.ndarray) and v.ndim > 1)})
        if arrays:
            d["finish_times"] = self.finish_times.tolist()
            d["stage_times"] = self.stage_times.tolist()
        return d


@partial(jax.jit, static_argnums=2)
def _timeline_tables(point, finish, shape: SimShape):
    """What the occupancy timeline reads of a configuration's structure, as one program (``[E, N]``
    KV and activation bytes, ``[E, N]`` release time of each item's KV, ``[E]`` valid items): the
    structure's tables built op by op would compile each operation on its own, every new shape."""
    s = Structure(point, shape)
    release = memory.release_times(finish, s.ends, shape.release)
    return s.kv_all, s.act_all, memory.item_release_times(release, s.group), s.valid


def occupancy_timeline(ev, point, n: int, shape: SimShape, points: int = 1024):
    """Per-stage KV (own, hosted, being written) and memory over time from one evaluation.

    Returns ``(times [T], kv [T, N], mem [T, N])`` at every distinct start and finish time (at most
    ``points`` of them, evenly subsampled), each stage's level just after it.
    """
    start, finish = np.asarray(ev.start), np.asarray(ev.finish)
    kv, act, item_release, valid = jax.device_get(_timeline_tables(point, ev.finish, shape))
    valid = valid[:, None]
    moved = np.asarray(ev.moved)
    host = np.asarray(ev.host)
    times = np.unique(np.concatenate([start[valid[:, 0]].ravel(), finish[valid[:, 0]].ravel()]))
    if len(times) > points:
        times = times[np.linspace(0, len(times) - 1, points).astype(int)]
    own_kv, active = memory.occupancy(start, finish, np.where(valid, kv - moved, 0.0), np.where(valid, act, 0.0),
                                      item_release, times, xp=np)
    at = times[:, None, None]
    held = (start[None] <= at) & (at < item_release[None])                    # spilled KV lives from the start
    hosted = np.zeros_like(own_kv)
    for q in range(n):
        for stage in range(n):
            mask = host[:, q] == stage
            if mask.any():
                hosted[:, stage] += np.sum(np.where(held[:, mask, q], moved[mask, q][None, :], 0.0), axis=1)
    kv_total = (own_kv + hosted)[:, :n]
    weights = np.asarray(ev.weight_bytes_per_stage)[:n]
    return times, kv_total, kv_total + active[:, :n] + weights[None, :]


def simulate(model, hardware, seq_len: int, scheme: str = "terapipe", *, chunks: int | None = None,
             batch: int | str = 1, partition=None, release: str = "stage", admission: str = "streaming",
             num_batches: int = 2, microbatch: int = 1, placement=None, stages: int | None = None,
             dtype="float32", max_batch: int = DEFAULT_MAX_BATCH, timeline: bool = True,
             pairing: str = "cross-half", p1: float = DEFAULT_P1, p2: float = DEFAULT_P2,
             read_overlap: float = DEFAULT_READ_OVERLAP, spill: str = "overflow", tp: int = 1) -> SimResult:
    """Simulate prefill of ``num_batches`` batches of ``batch`` requests of ``seq_len`` tokens.

    Args:
      model: preset name (``"llama3-70b"``), spec file path, or :class:`~mocap_jax.specs.ModelSpec`.
      hardware: preset name (``"mocap-4x4"``, any ``"mocap-RxC"``), spec file, or
        :class:`~mocap_jax.specs.HardwareSpec`.
      seq_len: prompt tokens per request (S).
      scheme: ``"gpipe"`` (microbatches of whole requests), ``"terapipe"`` (chunked pipelining) or
        ``"mbkr"`` (chunked with memory-balanced KV reallocation).
      chunks: chunks M for chunked schemes (default 16, or ``len(partition)``).
      batch: requests per batch B, or ``"auto"`` for the largest feasible batch B'.
      partition: chunk sizes (ints summing to ``seq_len``); default uniform.
      release: KV release policy, ``"stage"`` or ``"request"``.
      admission: ``"streaming"`` or ``"synchronous"`` admission of consecutive batches.
      num_batches: consecutive identical batches.
      microbatch: requests per GPipe microbatch.
      placement: ``"snake"``, ``"searched"`` or the die of each stage (default: searched for MBKR, else snake).
      stages: pipeline stages N (default every die).
      dtype: ``"float32"`` (default) or ``"float64"``.
      max_batch: upper end of the ``batch="auto"`` search.
      timeline: also compute per-stage KV and memory over time.
      pairing, p1, p2, read_overlap, spill: MBKR settings (:mod:`mocap_jax.mbkr.pairing`).
      tp: tensor-parallel degree, dies (GPUs) per pipeline stage (Megatron sharding, two all-reduces per
        block over the group's ring; docs/cost_model.md); with ``tp > 1`` a listed ``placement`` gives each
        group's dies ``[N, tp]``, and ``"searched"`` (the MBKR default) the group tile each stage occupies.

    Returns:
      :class:`SimResult`; for MBKR, ``extra`` holds spilled bytes and remote-read, spill-write,
      blocking and migration seconds.
    """
    auto = isinstance(batch, str) and batch == "auto"
    cfg = resolve(model, hardware, seq_len, scheme, chunks=chunks, batch=1 if auto else batch, partition=partition,
                  release=release, admission=admission, num_batches=num_batches, microbatch=microbatch,
                  placement=placement, stages=stages, dtype=dtype, pairing=pairing, p1=p1, p2=p2,
                  read_overlap=read_overlap, spill=spill, tp=tp)
    if auto:
        from .search import largest_feasible_batch

        limit = checks.integer("max_batch", max_batch, 1, LIMITS["batch"])
        cfg = cfg.with_batch(max(largest_feasible_batch(cfg, limit), 1))
    return run(cfg, timeline=timeline)


def run(cfg: Config, timeline: bool = True, items=None) -> SimResult:
    """Evaluate a resolved configuration and wrap the result.

    ``items``: optionally ``(item table, slots)`` replacing the configuration's own items (e.g. a
    TeraPipe plan of several request groups); the table must carry ``cfg.batch`` requests.
    """
    if items is None:
        shape, point, k1 = cfg.shape(), cfg.point(), cfg.items_per_batch
    else:
        table, slots = items
        shape = cfg.shape(slots)._replace(groups=slots)
        point = replace_items(cfg.point(), table)        # only the items depend on the slot count
        k1 = int(np.sum(table.valid))
    ev = jax.device_get(_evaluate_one(point, shape))
    check_honest({k: np.asarray(getattr(ev, k))[None] for k in (
        "feasible", "prefill_latency_s", "raw_latency_s", "throughput_rps", "period_s", "peak_mem_bytes_per_stage",
        "kv_peak_bytes_per_stage", "finish")})
    n, K, nb = cfg.stages, shape.items, cfg.num_batches
    rows = (np.arange(nb)[:, None] * K + np.arange(k1)[None, :]).reshape(-1)
    finish, start = np.asarray(ev.finish)[rows, :n], np.asarray(ev.start)[rows, :n]
    extra: dict = {"items_per_batch": k1, "tensor_parallel": cfg.tp}
    if cfg.mbkr_mode != MBKRMode.OFF:
        s = cfg.mbkr
        extra.update(pairing=s.pairing, p1=s.p1, p2=s.p2, read_overlap=s.read_overlap, spill=s.spill,
                     overflow=bool(ev.overflow), mbkr_converged=bool(ev.mbkr_converged),
                     spilled_bytes=float(np.sum(ev.spilled_bytes_per_stage)), remote_read_s=float(ev.remote_read_s),
                     remote_read_unhidden_s=float(ev.remote_read_unhidden_s), spill_write_s=float(ev.spill_write_s),
                     blocking_s=float(np.sum(ev.blocking_s_per_stage)), migrate_s=float(ev.migrate_s),
                     spilled_bytes_per_stage=np.asarray(ev.spilled_bytes_per_stage)[:n],
                     blocking_s_per_stage=np.asarray(ev.blocking_s_per_stage)[:n],
                     mbkr_extra_times=np.asarray(ev.extra)[rows, :n], mbkr_block_times=np.asarray(ev.block)[rows, :n],
                     spill_host=np.asarray(ev.host)[rows, :n])
    times = kv_t = mem_t = None
    if timeline:
        times, kv_t, mem_t = occupancy_timeline(ev, point, cfg.stages, shape)
    gpipe = cfg.scheme == "gpipe"
    return SimResult(
        scheme=cfg.scheme, model=cfg.model.name, hardware=cfg.hardware.name, seq_len=cfg.seq_len, batch=cfg.batch,
        chunks=1 if gpipe else k1, partition=np.full(1, cfg.seq_len) if gpipe else (
            cfg.partition if items is None else np.asarray(items[0].tokens)[:k1]),
        release=cfg.release.value, admission=cfg.admission.value, num_batches=nb, placement=cfg.placement,
        feasible=bool(ev.feasible), prefill_latency_s=float(ev.prefill_latency_s), raw_latency_s=float(ev.raw_latency_s),
        throughput_rps=float(ev.throughput_rps), period_s=float(ev.period_s), bubble_fraction=float(ev.bubble_fraction),
        finish_times=finish, start_times=start, stage_times=np.asarray(ev.stage_times)[:k1, :n],
        handoff_times=np.asarray(ev.handoff_times)[:k1, :n], stage_utilisation=np.asarray(ev.stage_utilisation)[:n],
        kv_peak_bytes_per_stage=np.asarray(ev.kv_peak_bytes_per_stage)[:n],
        weight_bytes_per_stage=np.asarray(ev.weight_bytes_per_stage)[:n],
        peak_mem_bytes_per_stage=np.asarray(ev.peak_mem_bytes_per_stage)[:n], capacity_bytes=float(ev.capacity_bytes),
        timeline_times=times, timeline_kv_bytes=kv_t, timeline_mem_bytes=mem_t, extra=extra)
