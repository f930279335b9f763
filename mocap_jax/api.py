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
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import costs
from .costs import HardwareParams, ModelParams, StageLayout
from .mesh import snake_placement
from .schedule import ItemTable, Point, SimShape, bucket, evaluate_batched, evaluate_one
from .specs import HardwareSpec, ModelSpec, get_hardware, get_model

CORE_SCHEMES = ("gpipe", "terapipe")
SCHEMES = CORE_SCHEMES
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


def check_stages(model: ModelSpec, hw: HardwareSpec, stages: int | None) -> int:
    n = hw.num_dies if stages is None else _positive_int("stages", stages)
    if n > hw.num_dies:
        raise ValueError(f"{n} stages need {n} dies but {hw.name} has {hw.num_dies}; use fewer stages or a larger mesh")
    if n > model.layers:
        raise ValueError(f"{model.name} has {model.layers} layers, fewer than {n} pipeline stages; "
                         f"pass stages<={model.layers} or a smaller mesh")
    return n


def check_weights_fit(model: ModelSpec, hw: HardwareSpec, n: int) -> None:
    """Raise if some stage cannot even hold its weights."""
    mp = ModelParams.from_spec(model, np.float64)
    hp = HardwareParams.from_spec(hw, np.float64)
    w = costs.stage_weight_bytes(mp, hp, n, n, xp=np)
    usable = hw.hbm_capacity * hw.usable_hbm_fraction
    worst = int(np.argmax(w))
    if w[worst] > usable:
        need = model.total_params * hw.weight_bytes / usable
        raise ValueError(
            f"{model.name} does not fit {hw.name}: stage {worst} needs {w[worst] / 1e9:.1f} GB of weights but a die "
            f"has {usable / 1e9:.1f} GB usable; use a mesh of at least ~{math.ceil(need)} dies "
            f"(e.g. --hardware mocap-RxC) or a smaller model")


def check_placement(hw: HardwareSpec, placement, n: int) -> np.ndarray:
    if placement is None:
        return snake_placement(hw, n)
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


def _point(model: ModelSpec, hw: HardwareSpec, items: ItemTable, placement, n_pad: int, admission: str,
           release: str, dtype) -> Point:
    return Point(items=items, model=ModelParams.from_spec(model, dtype), hardware=HardwareParams.from_spec(hw, dtype),
                 layout=StageLayout.from_placement(hw, placement, n_pad, dtype),
                 synchronous=np.asarray(admission == "synchronous"), release_request=np.asarray(release == "request"))


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
             dtype="float32", max_batch: int = DEFAULT_MAX_BATCH, timeline: bool = True) -> SimResult:
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
      placement: die index of each stage (default snake order).
      stages: pipeline stages N (default: every die).
      dtype: ``"float32"`` (default) or ``"float64"``.
      max_batch: upper end of the ``batch="auto"`` search.
      timeline: compute the per-stage KV occupancy time series.

    Returns:
      :class:`SimResult`.
    """
    cfg = _resolve(model, hardware, seq_len, scheme, chunks, batch, partition, release, admission, num_batches,
                   microbatch, placement, stages, dtype, max_batch)
    m, hw, S, part, n, pl, dt = cfg["model"], cfg["hardware"], cfg["seq_len"], cfg["partition"], cfg["stages"], cfg["placement"], cfg["dtype"]
    B = cfg["batch"]
    if B == "auto":
        B = max_feasible_batch(m, hw, S, scheme, partition=part, release=release, admission=admission,
                               num_batches=num_batches, microbatch=microbatch, placement=pl, stages=n,
                               dtype=dt, max_batch=max_batch)
        if B == 0:
            B = 1  # report the single-request configuration (infeasible)
    k1 = _items_per_batch(scheme, B, part, microbatch)
    shape = SimShape(k_pad=bucket(k1), n_pad=bucket(n), num_batches=num_batches, timeline=timeline)
    point = _point(m, hw, _items(scheme, S, B, part, microbatch, shape.k_pad), pl, shape.n_pad, admission, release, dt)
    out = jax.device_get(evaluate_one(point, shape))
    f = np.asarray(out["finish_times"])[:, :k1, :n]                 # [nb, K1, N]
    t = np.asarray(out["stage_times"])[:k1, :n]
    finish = f.reshape(num_batches * k1, n)
    start = finish - np.tile(t, (num_batches, 1))
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
        timeline_times=np.asarray(out["timeline_times"]) if timeline else None,
        timeline_kv_bytes=np.asarray(out["timeline_kv_bytes"])[:, :n] if timeline else None,
        extra={"raw_latency_s": float(out["raw_latency_s"]), "items_per_batch": k1},
    )


def _resolve(model, hardware, seq_len, scheme, chunks, batch, partition, release, admission, num_batches,
             microbatch, placement, stages, dtype, max_batch) -> dict:
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
    n = check_stages(m, hw, stages)
    check_weights_fit(m, hw, n)
    pl = check_placement(hw, placement, n)
    return dict(model=m, hardware=hw, seq_len=S, partition=part, stages=n, placement=pl, dtype=_dtype(dtype),
                batch=batch)


# --------------------------------------------------------------------------- batched evaluation


def simulate_batch(model, hardware, seq_len, scheme: str = "terapipe", *, chunks: int | None = None, batch=1,
                   partition=None, release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                   microbatch: int = 1, stages: int | None = None, placement=None, dtype="float32",
                   block_size: int = 4096, k_pad: int | None = None) -> dict[str, np.ndarray]:
    """Evaluate P configurations of one model and hardware in compiled, vectorised calls.

    Args:
      seq_len: int or ``[P]`` ints.
      batch: int or ``[P]`` ints.
      partition: optional ``[P, M]`` int chunk sizes (each row sums to its seq_len);
        rows may be zero-padded on the right to mix chunk counts.  Default:
        uniform partitions into ``chunks`` (default 16).
      block_size: points per compiled call (bounds memory; the last block is padded).
      k_pad: item bucket (default: next power of two of the largest item count).

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
    n = check_stages(m, hw, stages)
    check_weights_fit(m, hw, n)
    pl = check_placement(hw, placement, n)
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
    shape = SimShape(k_pad=k_pad, n_pad=bucket(n), num_batches=num_batches, timeline=False)
    items = _batched_items(scheme, seq, bat, part, microbatch, k_pad)
    base = _point(m, hw, _items(scheme, int(seq[0]), int(bat[0]), part[0][part[0] > 0], microbatch, k_pad), pl,
                  shape.n_pad, admission, release, dt)
    outs = []
    for lo in range(0, P, block_size):
        hi = min(P, lo + block_size)
        size = block_size if P > block_size else P
        blk_items = jax.tree_util.tree_map(lambda x: _pad_rows(x[lo:hi], size), items)
        pts = jax.tree_util.tree_map(lambda x: np.broadcast_to(np.asarray(x), (size,) + np.shape(x)), base)
        pts = dataclasses.replace(pts, items=blk_items)
        out = jax.device_get(evaluate_batched(pts, shape))
        outs.append({k: np.asarray(v)[: hi - lo] for k, v in out.items()})
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
                       max_batch: int = DEFAULT_MAX_BATCH) -> int:
    """Largest batch B' (requests) whose every stage fits its usable HBM; 0 if even B = 1 does not.

    A vectorised bracket search over B in [1, max_batch] (feasibility is monotone in
    B: KV and workspace grow with it).  For GPipe with the ``stage`` release policy
    no KV outlives its microbatch, so B' is capped only by ``max_batch``.
    """
    cfg = _resolve(model, hardware, seq_len, scheme, chunks, 1, partition, release, admission, num_batches,
                   microbatch, placement, stages, dtype, max_batch)
    part = cfg["partition"]
    k_pad = bucket(-(-max_batch // microbatch)) if scheme == "gpipe" else bucket(len(part))

    def feasible(batches):
        out = simulate_batch(cfg["model"], cfg["hardware"], cfg["seq_len"], scheme, batch=batches,
                             partition=part[None, :], release=release, admission=admission, num_batches=num_batches,
                             microbatch=microbatch, stages=cfg["stages"], placement=cfg["placement"],
                             dtype=cfg["dtype"], k_pad=k_pad)
        return out["feasible"]

    return max(_largest_true(feasible, 1, int(max_batch)), 0)


def max_feasible_seq_len(model, hardware, scheme: str = "terapipe", *, chunks: int = 16, batch: int = 1,
                         release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                         microbatch: int = 1, placement=None, stages: int | None = None, dtype="float32",
                         granularity: int = 1, max_seq_len: int = 1 << 24) -> int:
    """Longest prompt S (a multiple of ``granularity``) that fits with uniform ``chunks`` chunks.

    A vectorised bracket search over S in [chunks, max_seq_len]; returns 0 if even
    the shortest does not fit.  ``max_seq_len`` defaults to 2^24 tokens, the largest
    count float32 represents exactly.
    """
    M = _positive_int("chunks", chunks)
    g = _positive_int("granularity", granularity)
    cfg = _resolve(model, hardware, max(M * g, 1), scheme, M, batch, None, release, admission, num_batches,
                   microbatch, placement, stages, dtype, DEFAULT_MAX_BATCH)
    lo = -(-M // g) if scheme != "gpipe" else 1
    hi = int(max_seq_len) // g
    if hi < lo:
        raise ValueError(f"max_seq_len={max_seq_len} is below the shortest sequence {lo * g} for {M} chunks")

    def feasible(units):
        seqs = units * g
        out = simulate_batch(cfg["model"], cfg["hardware"], seqs, scheme, chunks=M, batch=cfg["batch"],
                             release=release, admission=admission, num_batches=num_batches, microbatch=microbatch,
                             stages=cfg["stages"], placement=cfg["placement"], dtype=cfg["dtype"])
        return out["feasible"]

    best = _largest_true(feasible, lo, hi)
    return max(best, 0) * g
