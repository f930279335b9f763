"""Public Python API: validate inputs, build padded points, run the kernels, wrap results.

Research code normally needs only :func:`simulate` (one configuration, full detail),
:func:`simulate_batch` (thousands of configurations in one compiled call),
:func:`max_feasible_batch` and :func:`max_feasible_seq_len`.  All validation
happens here, before anything is traced: bad input raises ``ValueError`` with one
message that says what is wrong and how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import numpy as np

from . import chunked_prefill, costs
from .costs import HardwareParams, ModelParams, StageLayout
from .mbkr import (DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS, STATIC_PAIRING_CODE, MBKRParams,
                   check_thresholds, pair_routes, partner_of)
from .specs.mesh import snake_placement, stage_groups
from .schedule import ItemTable, Point, SimShape, bucket, evaluate_items_batched, evaluate_one
from .specs import LIMITS, HardwareSpec, ModelSpec, SpecError, get_hardware, get_model
from .specs.checks import integer

CORE_SCHEMES = ("gpipe", "terapipe")
MBKR_SCHEMES = ("mbkr",)
SCHEMES = CORE_SCHEMES + MBKR_SCHEMES
RELEASE_POLICIES = ("stage", "request")
ADMISSION_MODES = ("streaming", "synchronous")
DEFAULT_MAX_BATCH = 1024


# --------------------------------------------------------------------------- validation


def _choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}.{hint}")
    return value


def _positive_int(name: str, value, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer() and value > 0:
            return int(value)
        raise ValueError(f"{name} must be a positive integer, got {value!r}.{hint}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}.{hint}")
    return int(value)


def _dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    if dt == np.float64 and not jax.config.jax_enable_x64:
        raise ValueError("dtype float64 needs 64-bit JAX: set JAX_ENABLE_X64=1 or "
                         "jax.config.update('jax_enable_x64', True) before simulating")
    return dt


def uniform_partition(seq_len: int, chunks: int) -> np.ndarray:
    """TeraPipe-style equal chunks: ``S // M`` tokens each, the first ``S % M`` one more."""
    base, extra = divmod(int(seq_len), int(chunks))
    return np.array([base + (1 if k < extra else 0) for k in range(int(chunks))], dtype=np.int64)


def check_partition(partition, seq_len: int) -> np.ndarray:
    part = np.asarray(partition)
    if part.ndim != 1 or part.size == 0:
        raise ValueError(f"partition must be a non-empty list of chunk sizes, got shape {part.shape}")
    if not np.issubdtype(part.dtype, np.integer):
        if np.issubdtype(part.dtype, np.floating) and np.all(part == np.round(part)):
            part = part.astype(np.int64)
        else:
            raise ValueError("partition must hold integer token counts")
    if np.any(part <= 0):
        raise ValueError(f"every chunk in the partition must be a positive number of tokens, got {part.tolist()}")
    if int(part.sum()) != int(seq_len):
        raise ValueError(f"partition sums to {int(part.sum())} tokens but seq_len is {seq_len}: "
                         f"chunk sizes must add up to the sequence length")
    return part.astype(np.int64)


def check_tensor_parallel(model: ModelSpec, hw: HardwareSpec, tp) -> int:
    """Dies per stage group: a positive integer that divides the model's heads the way engines require."""
    t = integer("tp", tp, 1, LIMITS["dies"], " Pass the dies (GPUs) per pipeline stage, e.g. tp=4.")
    if t > hw.num_dies:
        raise SpecError(f"tp={t} needs {t} dies per stage but {hw.name} has {hw.num_dies}; use a smaller tp")
    if model.q_heads % t:
        raise SpecError(f"tp={t} does not divide the {model.q_heads} attention heads of {model.name}; "
                        f"choose a tp that divides {model.q_heads}")
    if model.attention == "gqa" and model.kv_heads % t and t % model.kv_heads:
        raise SpecError(f"tp={t} neither divides nor is a multiple of the {model.kv_heads} KV heads of {model.name}; "
                        f"choose a divisor or a multiple of {model.kv_heads}")
    return t


def check_stages(model: ModelSpec, hw: HardwareSpec, stages: int | None, tp: int = 1) -> int:
    n = hw.num_dies // tp if stages is None else _positive_int("stages", stages)
    if n * tp > hw.num_dies:
        raise ValueError(f"{n} stages of {tp} dies need {n * tp} dies but {hw.name} has {hw.num_dies}; "
                         f"use fewer stages, a smaller tp or a larger mesh")
    if n > model.layers:
        raise ValueError(f"{model.name} has {model.layers} layers, fewer than {n} pipeline stages; "
                         f"pass stages<={model.layers} or a smaller mesh")
    return n


def check_weights_fit(model: ModelSpec, hw: HardwareSpec, n: int, tp: int = 1) -> None:
    """Raise if some stage cannot even hold its weights."""
    mp = ModelParams.from_spec(model, np.float64)
    hp = HardwareParams.from_spec(hw, np.float64)
    w = costs.stage_weight_bytes(mp, hp, n, n, xp=np, tensor_parallel=float(tp))
    usable = hw.hbm_capacity * hw.usable_hbm_fraction
    worst = int(np.argmax(w))
    if w[worst] > usable:
        need = model.total_params * hw.weight_bytes / usable
        raise ValueError(
            f"{model.name} does not fit {hw.name}: stage {worst} needs {w[worst] / 1e9:.1f} GB of weights but a die "
            f"has {usable / 1e9:.1f} GB usable; use a mesh of at least ~{math.ceil(need)} dies "
            f"(e.g. --hardware mocap-RxC), a larger tp or a smaller model")


@functools.lru_cache(maxsize=64)
def searched_placement(hw: HardwareSpec, n: int, pairing: str) -> np.ndarray:
    """Placement minimising traffic-weighted hops for a pairing (cached per hardware, N, pairing)."""
    from .placement import search_placement

    static = pairing if pairing in ("cross-half", "head-to-tail") else "cross-half"
    return search_placement(hw, n, static).placement


def check_group_placement(hw: HardwareSpec, placement, n: int, tp: int) -> np.ndarray:
    """Dies of each stage group, ``[N, tp]``: the default groups (None or "snake") or a nested list."""
    if placement is None or (isinstance(placement, str) and placement == "snake"):
        try:
            return stage_groups(hw, n, tp)
        except ValueError as e:
            raise ValueError(f"{e}, or list the dies of each group as placement") from None
    if isinstance(placement, str):
        raise ValueError(f"with tp={tp} placement must be 'snake' or a list of {n} groups of {tp} die indices; "
                         f"a searched placement of stage groups is not available, got {placement!r}")
    try:
        groups = np.asarray(placement, dtype=np.int64)
    except (TypeError, ValueError):
        groups = None
    if groups is None or groups.shape != (n, tp) or len(np.unique(groups)) != n * tp or groups.min() < 0 \
            or groups.max() >= hw.num_dies:
        raise ValueError(f"placement must list {n} groups of {tp} distinct die indices in [0, {hw.num_dies}) "
                         f"(each group in ring order), got {placement!r}")
    return groups


def check_placement(hw: HardwareSpec, placement, n: int, scheme: str = "terapipe", pairing: str = "cross-half",
                    tp: int = 1) -> np.ndarray:
    """Resolve ``placement``: None (snake, or searched for MBKR schemes), "snake", "searched", or die indices;
    with ``tp > 1``, the dies of each stage group (:func:`check_group_placement`)."""
    if tp > 1:
        return check_group_placement(hw, placement, n, tp)
    if placement is None:
        placement = "searched" if scheme in ("mbkr", "mocap") and pairing != "none" else "snake"
    if isinstance(placement, str):
        if placement == "snake":
            return snake_placement(hw, n)
        if placement == "searched":
            return searched_placement(hw, n, pairing)
        raise ValueError(f"placement must be 'snake', 'searched' or a list of die indices, got {placement!r}")
    pl = np.asarray(placement, dtype=np.int64)
    if pl.shape != (n,) or len(set(pl.tolist())) != n or pl.min() < 0 or pl.max() >= hw.num_dies:
        raise ValueError(f"placement must list {n} distinct die indices in [0, {hw.num_dies}), got {placement!r}")
    return pl


# --------------------------------------------------------------------------- results


@dataclass
class SimResult:
    """One simulated configuration.

    Times in seconds, memory in bytes, throughput in requests/s.  Arrays:
    ``finish_times``/``start_times`` ``[K, N]`` over every real item of every batch
    (K = num_batches x items per batch, in order); ``stage_times``/``handoff_times``
    ``[K1, N]`` for one batch; per-stage vectors ``[N]``; ``timeline_times`` ``[T]``
    and ``timeline_kv_bytes`` ``[T, N]`` (held KV after each time).
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
    throughput_rps: float
    period_s: float
    bubble_fraction: float
    finish_times: np.ndarray
    start_times: np.ndarray
    stage_times: np.ndarray
    handoff_times: np.ndarray
    stage_utilisation: np.ndarray
    kv_peak_bytes_per_stage: np.ndarray
    workspace_bytes_per_stage: np.ndarray
    weight_bytes_per_stage: np.ndarray
    peak_mem_bytes_per_stage: np.ndarray
    capacity_bytes: float
    timeline_times: np.ndarray | None = None
    timeline_kv_bytes: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.placement)

    def to_dict(self, arrays: bool = False) -> dict[str, Any]:
        """JSON-ready summary (per-stage lists included; item-level arrays if ``arrays``)."""
        lat = self.prefill_latency_s
        d = {
            "scheme": self.scheme, "model": self.model, "hardware": self.hardware, "seq_len": self.seq_len,
            "batch": self.batch, "chunks": self.chunks, "partition": self.partition.tolist(),
            "release": self.release, "admission": self.admission, "num_batches": self.num_batches,
            "stages": self.num_stages, "placement": self.placement.tolist(), "feasible": self.feasible,
            "prefill_latency_s": lat if math.isfinite(lat) else None,
            "throughput_rps": self.throughput_rps, "period_s": self.period_s,
            "bubble_fraction": self.bubble_fraction,
            "stage_utilisation": self.stage_utilisation.tolist(),
            "peak_mem_bytes_per_stage": self.peak_mem_bytes_per_stage.tolist(),
            "kv_peak_bytes_per_stage": self.kv_peak_bytes_per_stage.tolist(),
            "weight_bytes_per_stage": self.weight_bytes_per_stage.tolist(),
            "workspace_bytes_per_stage": self.workspace_bytes_per_stage.tolist(),
            "capacity_bytes_per_stage": self.capacity_bytes,
        }
        d.update({k: v for k, v in self.extra.items() if not isinstance(v, np.ndarray)})
        if arrays:
            d["finish_times"] = self.finish_times.tolist()
            d["stage_times"] = self.stage_times.tolist()
        return d


def _np(x):
    return np.asarray(jax.device_get(x))


# --------------------------------------------------------------------------- building points


@dataclass(frozen=True)
class MBKRConfig:
    """User-facing MBKR settings (validated); see docs/semantics.md."""

    pairing: str = "cross-half"
    p1: float = DEFAULT_P1
    p2: float = DEFAULT_P2
    read_overlap: float = DEFAULT_READ_OVERLAP

    def __post_init__(self):
        _choice("pairing", self.pairing, PAIRINGS)
        check_thresholds(self.p1, self.p2, self.read_overlap)

    @property
    def mode(self) -> str:
        return {"dynamic": "dynamic", "none": "unpaired"}.get(self.pairing, "static")


def mbkr_mode(scheme: str, cfg: "MBKRConfig") -> str:
    """Static MBKR mode of a scheme: ``"off"``, ``"static"`` or ``"dynamic"``."""
    return cfg.mode if scheme in ("mbkr", "mocap") else "off"


def mbkr_params(hw: HardwareSpec, placement, n_pad: int, cfg: "MBKRConfig", mode: str, dtype) -> MBKRParams:
    """MBKR numbers; the route matrices share link bandwidth among hand-offs and pair routes."""
    n = len(placement)
    code = STATIC_PAIRING_CODE.get(cfg.pairing, 0)
    partner = partner_of(code, n, n, xp=np) if mode in ("static", "unpaired") else None
    hops, bw = pair_routes(hw, placement, partner, n_pad, dtype)
    return MBKRParams(p1=np.asarray(cfg.p1, dtype), p2=np.asarray(cfg.p2, dtype),
                      read_overlap=np.asarray(cfg.read_overlap, dtype), pairing=np.asarray(code, np.int32),
                      stage_hops=hops, stage_bandwidth=bw)


def _point(model: ModelSpec, hw: HardwareSpec, items: ItemTable, placement, n_pad: int, admission: str,
           release: str, dtype, mbkr: "MBKRConfig | None" = None, mode: str = "off") -> Point:
    mbkr = mbkr or MBKRConfig()
    if np.ndim(placement) == 2:   # stage groups (tensor parallelism); MBKR routes between their first dies
        groups = np.asarray(placement)
        return Point(items=items, model=ModelParams.from_spec(model, dtype),
                     hardware=HardwareParams.from_spec(hw, dtype),
                     layout=StageLayout.from_groups(hw, groups, n_pad, dtype),
                     synchronous=np.asarray(admission == "synchronous"),
                     release_request=np.asarray(release == "request"),
                     mbkr=mbkr_params(hw, groups[:, 0], n_pad, mbkr, mode, dtype))
    mp = mbkr_params(hw, placement, n_pad, mbkr, mode, dtype)
    layout = StageLayout.from_placement(hw, placement, n_pad, dtype)
    # hand-offs share links with each other (they run concurrently in a full pipeline);
    # MBKR transfers additionally share with hand-offs and other pairs (mbkr_params)
    n = len(placement)
    _, handoff_bw = pair_routes(hw, placement, None, n_pad, dtype)
    shared_bw = np.ones(n_pad, dtype)
    shared_bw[: n - 1] = handoff_bw[np.arange(n - 1), np.arange(1, n)]
    layout = dataclasses.replace(layout, handoff_bandwidth=shared_bw)
    return Point(items=items, model=ModelParams.from_spec(model, dtype), hardware=HardwareParams.from_spec(hw, dtype),
                 layout=layout, synchronous=np.asarray(admission == "synchronous"),
                 release_request=np.asarray(release == "request"), mbkr=mp)


def chunked_item_table(partition: np.ndarray, batch: int, k_pad: int) -> ItemTable:
    """Host-side (NumPy) items of a chunked batch, padded to ``k_pad``."""
    m = len(partition)
    tokens = np.zeros(k_pad, np.int64)
    tokens[:m] = partition
    prefix = np.zeros(k_pad, np.int64)
    prefix[:m] = np.cumsum(partition) - partition
    valid = np.arange(k_pad) < m
    return ItemTable(tokens=tokens.astype(np.int32), prefix=prefix.astype(np.int32),
                     requests=np.where(valid, batch, 0).astype(np.int32), last=np.arange(k_pad) == m - 1,
                     valid=valid, group_last=np.full(k_pad, m - 1, np.int32))


def gpipe_item_table(seq_len: int, batch: int, microbatch: int, k_pad: int) -> ItemTable:
    """Host-side items of a GPipe batch: microbatches of whole requests."""
    k = np.arange(k_pad)
    requests = np.clip(batch - k * microbatch, 0, microbatch)
    valid = requests > 0
    return ItemTable(tokens=np.where(valid, seq_len, 0).astype(np.int32), prefix=np.zeros(k_pad, np.int32),
                     requests=requests.astype(np.int32), last=valid, valid=valid, group_last=k.astype(np.int32))


def _items(scheme: str, seq_len: int, batch: int, partition: np.ndarray, microbatch: int, k_pad: int) -> ItemTable:
    if scheme == "gpipe":
        return gpipe_item_table(seq_len, batch, microbatch, k_pad)
    return chunked_item_table(partition, batch, k_pad)


def _items_per_batch(scheme: str, batch: int, partition, microbatch: int) -> int:
    return -(-batch // microbatch) if scheme == "gpipe" else len(partition)


# --------------------------------------------------------------------------- simulate


def simulate(model, hardware, seq_len: int, scheme: str = "terapipe", *, chunks: int | None = None,
             batch: int | str = 1, partition=None, release: str = "stage", admission: str = "streaming",
             num_batches: int = 2, microbatch: int = 1, placement=None, stages: int | None = None,
             dtype="float32", max_batch: int = DEFAULT_MAX_BATCH, timeline: bool = True,
             pairing: str = "cross-half", p1: float = DEFAULT_P1, p2: float = DEFAULT_P2,
             read_overlap: float = DEFAULT_READ_OVERLAP, tp: int = 1) -> SimResult:
    """Simulate prefill of ``num_batches`` batches of ``batch`` requests of ``seq_len`` tokens.

    Args:
      model: preset name (``"llama3-70b"``), spec file path, or :class:`ModelSpec`.
      hardware: preset name (``"mocap-4x4"``, any ``"mocap-RxC"``), spec file, or :class:`HardwareSpec`.
      seq_len: prompt tokens per request (S).
      scheme: ``"gpipe"`` (microbatches of whole requests) or ``"terapipe"`` (chunked pipelining).
      chunks: number of chunks M for chunked schemes (default 16, or ``len(partition)``).
      batch: requests per batch B, or ``"auto"`` for the largest feasible batch B'.
      partition: chunk sizes (ints summing to ``seq_len``); default uniform.
      release: KV release policy, ``"stage"`` or ``"request"`` (docs/semantics.md).
      admission: ``"streaming"`` or ``"synchronous"`` admission of consecutive batches.
      num_batches: consecutive identical batches (>= 2 shows batch overlap in memory).
      microbatch: requests per GPipe microbatch.
      placement: die index of each stage (default snake order); with ``tp > 1`` the dies of
        each stage group, ``[N][tp]`` (default: rectangles in snake order on a mesh,
        consecutive GPUs on a switch).
      stages: pipeline stages N (default: every die, ``dies // tp`` groups with ``tp``).
      dtype: ``"float32"`` (default) or ``"float64"``.
      max_batch: upper end of the ``batch="auto"`` search.
      timeline: compute the per-stage KV occupancy time series.
      pairing, p1, p2, read_overlap: MBKR settings for ``scheme="mbkr"`` (docs/semantics.md):
        pairing policy (``cross-half``, ``none``, ``head-to-tail``, ``dynamic``), role
        thresholds as fractions of a stage's KV budget, and the fraction of local
        attention time that hides a remote read.
      tp: tensor-parallel degree, dies (GPUs) per pipeline stage (Megatron-style sharding,
        two all-reduces per block over the group's ring; docs/cost_model.md).

    Returns:
      :class:`SimResult`; for MBKR, ``extra`` holds spilled bytes, remote-read,
      spill-write, blocking and migration seconds.
    """
    mb = MBKRConfig(pairing, p1, p2, read_overlap)
    cfg = _resolve(model, hardware, seq_len, scheme, chunks, batch, partition, release, admission, num_batches,
                   microbatch, placement, stages, dtype, max_batch, pairing, tp=tp)
    m, hw, S, part, n, pl, dt = cfg["model"], cfg["hardware"], cfg["seq_len"], cfg["partition"], cfg["stages"], cfg["placement"], cfg["dtype"]
    B = cfg["batch"]
    if B == "auto":
        B = max_feasible_batch(m, hw, S, scheme, partition=part, release=release, admission=admission,
                               num_batches=num_batches, microbatch=microbatch, placement=pl, stages=n,
                               dtype=dt, max_batch=max_batch, pairing=pairing, p1=p1, p2=p2,
                               read_overlap=read_overlap, tp=cfg["tp"])
        if B == 0:
            B = 1  # report the single-request configuration (infeasible)
    k1 = _items_per_batch(scheme, B, part, microbatch)
    mode = mbkr_mode(scheme, mb)
    shape = SimShape(k_pad=bucket(k1), n_pad=bucket(n), num_batches=num_batches, timeline=timeline, mbkr=mode)
    point = _point(m, hw, _items(scheme, S, B, part, microbatch, shape.k_pad), pl, shape.n_pad, admission, release, dt,
                   mb, mode)
    out = jax.device_get(evaluate_one(point, shape))
    f = np.asarray(out["finish_times"])[:, :k1, :n]                 # [nb, K1, N]
    t = np.asarray(out["stage_times"])[:k1, :n]
    t_eff = np.broadcast_to(t, (num_batches, k1, n))
    if mode != "off":
        t_eff = t_eff + np.asarray(out["mbkr_extra_times"])[:, :k1, :n]
    finish = f.reshape(num_batches * k1, n)
    start = finish - t_eff.reshape(num_batches * k1, n)
    extra = {"raw_latency_s": float(out["raw_latency_s"]), "items_per_batch": k1, "tensor_parallel": cfg["tp"]}
    timeline_times = np.asarray(out["timeline_times"]) if timeline and mode == "off" else None
    timeline_kv = np.asarray(out["timeline_kv_bytes"])[:, :n] if timeline and mode == "off" else None
    if mode != "off":
        extra.update(pairing=pairing, p1=p1, p2=p2, read_overlap=read_overlap,
                     spilled_bytes=float(out["spilled_bytes"]), remote_read_s=float(out["remote_read_s"]),
                     remote_read_unhidden_s=float(out["remote_read_unhidden_s"]),
                     spill_write_s=float(out["spill_write_s"]), blocking_s=float(out["blocking_s"]),
                     migrate_s=float(out["migrate_s"]),
                     spilled_bytes_per_stage=np.asarray(out["spilled_bytes_per_stage"])[:n],
                     blocking_s_per_stage=np.asarray(out["blocking_s_per_stage"])[:n],
                     kv_budget_bytes_per_stage=np.asarray(out["kv_budget_bytes_per_stage"])[:n],
                     mbkr_extra_times=np.asarray(out["mbkr_extra_times"])[:, :k1, :n],
                     mbkr_block_times=np.asarray(out["mbkr_block_times"])[:, :k1, :n],
                     partner=np.asarray(out["partner"])[:n])
        if timeline:
            timeline_times, timeline_kv = mbkr_timeline(out, n, mode, timeline_points=1024)
    return SimResult(
        scheme=scheme, model=m.name, hardware=hw.name, seq_len=S, batch=int(B),
        chunks=len(part) if scheme != "gpipe" else 1, partition=part if scheme != "gpipe" else np.full(1, S),
        release=release, admission=admission, num_batches=num_batches, placement=pl,
        feasible=bool(out["feasible"]), prefill_latency_s=float(out["prefill_latency_s"]),
        throughput_rps=float(out["throughput_rps"]), period_s=float(out["period_s"]),
        bubble_fraction=float(out["bubble_fraction"]), finish_times=finish, start_times=start, stage_times=t,
        handoff_times=np.asarray(out["handoff_times"])[:k1, :n],
        stage_utilisation=np.asarray(out["stage_utilisation"])[:n],
        kv_peak_bytes_per_stage=np.asarray(out["kv_peak_bytes_per_stage"])[:n],
        workspace_bytes_per_stage=np.asarray(out["workspace_bytes_per_stage"])[:n],
        weight_bytes_per_stage=np.asarray(out["weight_bytes_per_stage"])[:n],
        peak_mem_bytes_per_stage=np.asarray(out["peak_mem_bytes_per_stage"])[:n],
        capacity_bytes=float(out["capacity_bytes"]),
        timeline_times=timeline_times, timeline_kv_bytes=timeline_kv, extra=extra,
    )


def mbkr_timeline(out: dict, n: int, mode: str, timeline_points: int = 1024):
    """Per-stage local KV (own + hosted) after each MBKR event, on a common time grid.

    Returns ``times [T]`` and ``bytes [T, N]``: every distinct event time (at most
    ``timeline_points``, evenly subsampled), each stage's occupancy just after it.
    """
    t_ev = np.asarray(out["mbkr_event_time"])
    loc = np.asarray(out["mbkr_event_local"])
    series = []  # (times, values) per stage
    if mode == "dynamic":
        keep = np.isfinite(t_ev)
        series = [(t_ev[keep], loc[keep, s]) for s in range(n)]
    else:
        partner = np.asarray(out["partner"])[:n]
        loc_b = np.asarray(out["mbkr_event_local_partner"])
        for s in range(n):
            q = partner[s]
            slot, col = (s, loc) if (q < 0 or q > s) else (q, loc_b)
            keep = np.isfinite(t_ev[slot])
            series.append((t_ev[slot][keep], col[slot][keep]))
    grid = np.unique(np.concatenate([ts for ts, _ in series]))
    if len(grid) > timeline_points:
        grid = grid[np.linspace(0, len(grid) - 1, timeline_points).astype(int)]
    occ = np.zeros((len(grid), n))
    for s, (ts, vs) in enumerate(series):
        if len(ts) == 0:
            continue
        idx = np.searchsorted(ts, grid, side="right") - 1      # last event at or before each grid time
        occ[:, s] = np.where(idx >= 0, vs[np.clip(idx, 0, None)], 0.0)
    return grid, occ


def _resolve(model, hardware, seq_len, scheme, chunks, batch, partition, release, admission, num_batches,
             microbatch, placement, stages, dtype, max_batch, pairing: str = "cross-half", tp: int = 1) -> dict:
    """Validate everything a simulation takes; return resolved values."""
    m = get_model(model)
    hw = get_hardware(hardware)
    _choice("scheme", scheme, SCHEMES)
    _choice("release policy", release, RELEASE_POLICIES)
    _choice("admission mode", admission, ADMISSION_MODES)
    S = _positive_int("seq_len", seq_len, " Pass the prompt length in tokens, e.g. 65536.")
    if not (isinstance(batch, str) and batch == "auto"):
        batch = _positive_int("batch", batch, " Pass a number of requests or 'auto'.")
    _positive_int("num_batches", num_batches)
    _positive_int("microbatch", microbatch)
    _positive_int("max_batch", max_batch)
    if partition is not None:
        part = check_partition(partition, S)
        if chunks is not None and int(chunks) != len(part):
            raise ValueError(f"chunks={chunks} but the partition has {len(part)} chunks; pass one or the other")
    else:
        M = 16 if chunks is None else _positive_int("chunks", chunks)
        if M > S:
            raise ValueError(f"{M} chunks need at least {M} tokens but seq_len is {S}; use fewer chunks")
        part = uniform_partition(S, M)
    t = check_tensor_parallel(m, hw, tp)
    n = check_stages(m, hw, stages, t)
    check_weights_fit(m, hw, n, t)
    _choice("pairing", pairing, PAIRINGS)
    pl = check_placement(hw, placement, n, scheme, pairing, t)
    return dict(model=m, hardware=hw, seq_len=S, partition=part, stages=n, placement=pl, dtype=_dtype(dtype),
                batch=batch, tp=t)


# --------------------------------------------------------------------------- batched evaluation


def simulate_batch(model, hardware, seq_len, scheme: str = "terapipe", *, chunks: int | None = None, batch=1,
                   partition=None, release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                   microbatch: int = 1, stages: int | None = None, placement=None, dtype="float32",
                   block_size: int = 4096, k_pad: int | None = None, pairing: str = "cross-half",
                   p1: float = DEFAULT_P1, p2: float = DEFAULT_P2,
                   read_overlap: float = DEFAULT_READ_OVERLAP, tp: int = 1) -> dict[str, np.ndarray]:
    """Evaluate P configurations of one model and hardware in compiled, vectorised calls.

    Args:
      seq_len: int or ``[P]`` ints.
      batch: int or ``[P]`` ints.
      partition: optional ``[P, M]`` int chunk sizes (each row sums to its seq_len);
        rows may be zero-padded on the right to mix chunk counts.  Default:
        uniform partitions into ``chunks`` (default 16).
      block_size: points per compiled call (bounds memory; the last block is padded).
      k_pad: item bucket (default: next power of two of the largest item count).
      tp: dies per pipeline stage (tensor parallelism), as in :func:`simulate`.

    Returns:
      dict of NumPy arrays with a leading axis P: ``prefill_latency_s``, ``feasible``,
      ``throughput_rps``, ``bubble_fraction``, ``finish_times`` [P, nb, K_pad, N_pad],
      ``kv_peak_bytes_per_stage`` [P, N_pad], ``peak_mem_bytes_per_stage`` [P, N_pad], ...
    """
    m = get_model(model)
    hw = get_hardware(hardware)
    _choice("scheme", scheme, SCHEMES)
    _choice("release policy", release, RELEASE_POLICIES)
    _choice("admission mode", admission, ADMISSION_MODES)
    dt = _dtype(dtype)
    t = check_tensor_parallel(m, hw, tp)
    n = check_stages(m, hw, stages, t)
    check_weights_fit(m, hw, n, t)
    mb = MBKRConfig(pairing, p1, p2, read_overlap)
    pl = check_placement(hw, placement, n, scheme, pairing, t)
    seq = np.atleast_1d(np.asarray(seq_len))
    bat = np.atleast_1d(np.asarray(batch))
    if partition is not None:
        part = np.asarray(partition)
        if part.ndim == 1:
            part = part[None, :]
        P = max(len(part), len(seq), len(bat))
        part = np.broadcast_to(part, (P, part.shape[1]))
        seq = np.broadcast_to(seq, (P,))
        if np.any(part < 0) or np.any((part > 0).sum(1) == 0):
            raise ValueError("partition rows must hold positive chunk sizes (zeros only as right padding)")
        if np.any(part.sum(1) != seq):
            bad = int(np.argmax(part.sum(1) != seq))
            raise ValueError(f"partition row {bad} sums to {int(part[bad].sum())} but seq_len is {int(seq[bad])}")
    else:
        M = 16 if chunks is None else _positive_int("chunks", chunks)
        P = max(len(seq), len(bat))
        seq = np.broadcast_to(seq, (P,))
        if scheme != "gpipe" and np.any(seq < M):
            raise ValueError(f"{M} chunks need seq_len >= {M}; got seq_len {int(seq.min())}")
        part = _uniform_rows(seq, M)
    if np.any(seq <= 0) or np.any(bat <= 0):
        raise ValueError("seq_len and batch must be positive integers")
    bat = np.broadcast_to(bat, (P,))
    _positive_int("microbatch", microbatch)
    if scheme == "gpipe":
        k_items = int(-(-bat.max() // microbatch))
    else:
        k_items = int((part > 0).sum(1).max())
    k_pad = bucket(k_items) if k_pad is None else k_pad
    mode = mbkr_mode(scheme, mb)
    shape = SimShape(k_pad=k_pad, n_pad=bucket(n), num_batches=num_batches, timeline=False, mbkr=mode)
    items = _batched_items(scheme, seq, bat, part, microbatch, k_pad)
    base = _point(m, hw, _items(scheme, int(seq[0]), int(bat[0]), part[0][part[0] > 0], microbatch, k_pad), pl,
                  shape.n_pad, admission, release, dt, mb, mode)
    # one batch of full-length chunked partitions without MBKR: the configurations-last kernel
    # (same numbers as evaluate; tests/test_chunked_prefill.py) is about twice as fast
    fast = (scheme != "gpipe" and num_batches == 1 and mode == "off" and part.shape[1] == k_pad
            and bool(np.all(part > 0)))
    structure = chunked_prefill.stage_structure(base, shape) if fast else None
    outs = []
    for lo in range(0, P, block_size):
        hi = min(P, lo + block_size)
        size = block_size if P > block_size else min(bucket(P, 8), block_size)  # padded: one program per bucket
        if fast:
            out = jax.device_get(chunked_prefill.prefill_many_jit(
                _pad_rows(part[lo:hi], size), _pad_rows(bat[lo:hi], size), base, shape, structure, detail=True))
            outs.append({k: np.moveaxis(np.asarray(v), -1, 0)[: hi - lo] for k, v in out.items()})
            continue
        blk_items = jax.tree_util.tree_map(lambda x: _pad_rows(x[lo:hi], size), items)
        out = jax.device_get(evaluate_items_batched(blk_items, base, shape))
        outs.append({k: np.asarray(v)[: hi - lo] for k, v in out.items()})
    if len(outs) == 1:
        return outs[0]
    return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}


def _uniform_rows(seq: np.ndarray, M: int) -> np.ndarray:
    base, extra = np.divmod(seq.astype(np.int64), M)
    return base[:, None] + (np.arange(M)[None, :] < extra[:, None])


def _pad_rows(x: np.ndarray, size: int) -> np.ndarray:
    if len(x) == size:
        return x
    reps = np.repeat(x[-1:], size - len(x), axis=0)
    return np.concatenate([x, reps])


def _batched_items(scheme, seq, bat, part, microbatch, k_pad) -> ItemTable:
    P = len(seq)
    if scheme == "gpipe":
        k = np.arange(k_pad)[None, :]
        requests = np.clip(bat[:, None] - k * microbatch, 0, microbatch)
        valid = requests > 0
        return ItemTable(tokens=np.where(valid, seq[:, None], 0).astype(np.int32),
                         prefix=np.zeros((P, k_pad), np.int32), requests=requests.astype(np.int32), last=valid,
                         valid=valid, group_last=np.broadcast_to(k, (P, k_pad)).astype(np.int32))
    tokens = np.zeros((P, k_pad), np.int64)
    tokens[:, : part.shape[1]] = part
    valid = tokens > 0
    m = valid.sum(1)
    prefix = np.cumsum(tokens, 1) - tokens
    k = np.arange(k_pad)[None, :]
    return ItemTable(tokens=tokens.astype(np.int32), prefix=prefix.astype(np.int32),
                     requests=np.where(valid, bat[:, None], 0).astype(np.int32), last=k == (m - 1)[:, None],
                     valid=valid, group_last=np.broadcast_to((m - 1)[:, None], (P, k_pad)).astype(np.int32))


# --------------------------------------------------------------------------- feasibility searches


def _largest_true(feasible_fn, lo: int, hi: int, grid: int = 64) -> int:
    """Largest x in [lo, hi] with feasible_fn(x) True, assuming monotone (True then False).

    Each round evaluates ``grid`` candidates in one vectorised call (same shape, so
    one compiled program) and narrows the bracket; returns ``lo - 1`` if none.
    """
    best = lo - 1
    while lo <= hi:
        if hi - lo + 1 <= grid:
            cand = np.arange(lo, hi + 1)
        else:
            cand = np.unique(np.round(np.geomspace(lo, hi, grid)).astype(np.int64)) if lo > 0 else \
                np.unique(np.linspace(lo, hi, grid).astype(np.int64))
        cand = np.concatenate([cand, np.full(grid - len(cand), cand[-1])])
        ok = np.asarray(feasible_fn(cand), bool)
        if not ok[0]:
            return best
        i = int(np.max(np.nonzero(ok)[0]))
        best = int(cand[i])
        if i == len(cand) - 1 or cand[i] == cand[-1]:
            return best
        lo, hi = int(cand[i]) + 1, int(cand[i + 1]) - 1
    return best


def max_feasible_batch(model, hardware, seq_len: int, scheme: str = "terapipe", *, chunks: int | None = None,
                       partition=None, release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                       microbatch: int = 1, placement=None, stages: int | None = None, dtype="float32",
                       max_batch: int = DEFAULT_MAX_BATCH, tp: int = 1, **mbkr) -> int:
    """Largest batch B' (requests) whose every stage fits its usable HBM; 0 if even B = 1 does not.

    A vectorised bracket search over B in [1, max_batch] (feasibility is monotone in
    B: KV and workspace grow with it).  For GPipe with the ``stage`` release policy
    no KV outlives its microbatch, so B' is capped only by ``max_batch``.
    """
    cfg = _resolve(model, hardware, seq_len, scheme, chunks, 1, partition, release, admission, num_batches,
                   microbatch, placement, stages, dtype, max_batch, mbkr.get("pairing", "cross-half"), tp=tp)
    part = cfg["partition"]
    k_pad = bucket(-(-max_batch // microbatch)) if scheme == "gpipe" else bucket(len(part))

    def feasible(batches):
        out = simulate_batch(cfg["model"], cfg["hardware"], cfg["seq_len"], scheme, batch=batches,
                             partition=part[None, :], release=release, admission=admission, num_batches=num_batches,
                             microbatch=microbatch, stages=cfg["stages"], placement=cfg["placement"],
                             dtype=cfg["dtype"], k_pad=k_pad, tp=cfg["tp"], **mbkr)
        return out["feasible"]

    return max(_largest_true(feasible, 1, int(max_batch)), 0)


def max_feasible_seq_len(model, hardware, scheme: str = "terapipe", *, chunks: int = 16, batch: int = 1,
                         release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                         microbatch: int = 1, placement=None, stages: int | None = None, dtype="float32",
                         granularity: int = 1, max_seq_len: int = 1 << 24, tp: int = 1, **mbkr) -> int:
    """Longest prompt S (a multiple of ``granularity``) that fits with uniform ``chunks`` chunks.

    A vectorised bracket search over S in [chunks, max_seq_len]; returns 0 if even
    the shortest does not fit.  ``max_seq_len`` defaults to 2^24 tokens, the largest
    count float32 represents exactly.
    """
    M = _positive_int("chunks", chunks)
    g = _positive_int("granularity", granularity)
    cfg = _resolve(model, hardware, max(M * g, 1), scheme, M, batch, None, release, admission, num_batches,
                   microbatch, placement, stages, dtype, DEFAULT_MAX_BATCH, mbkr.get("pairing", "cross-half"), tp=tp)
    lo = -(-M // g) if scheme != "gpipe" else 1
    hi = int(max_seq_len) // g
    if hi < lo:
        raise ValueError(f"max_seq_len={max_seq_len} is below the shortest sequence {lo * g} for {M} chunks")

    def feasible(units):
        seqs = units * g
        out = simulate_batch(cfg["model"], cfg["hardware"], seqs, scheme, chunks=M, batch=cfg["batch"],
                             release=release, admission=admission, num_batches=num_batches, microbatch=microbatch,
                             stages=cfg["stages"], placement=cfg["placement"], dtype=cfg["dtype"], tp=cfg["tp"], **mbkr)
        return out["feasible"]

    best = _largest_true(feasible, lo, hi)
    return max(best, 0) * g
