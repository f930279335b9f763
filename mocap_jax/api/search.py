"""Feasibility searches: the largest batch B' and the longest sequence that fit (vectorised brackets)."""

from __future__ import annotations

import math

import numpy as np

from ..mbkr.pairing import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP
from ..prefill.batch import evaluate_points
from ..prefill.points import batched_items
from ..schedule.items import Chunks, gpipe_items, uniform_partitions
from ..schedule.shape import bucket
from ..specs import LIMITS, SpecError, checks
from .config import Config, check_chunks, resolve

#: candidates evaluated together in one round of a bracket search
GRID = 64


def largest_true(feasible_fn, lo: int, hi: int, grid: int = GRID) -> int:
    """Largest x in ``[lo, hi]`` with ``feasible_fn(x)`` true, assuming feasibility is monotone (true, then false).

    Each round evaluates ``grid`` candidates in one vectorised call (same shape, so one compiled
    program) and narrows the bracket; returns ``lo - 1`` if none is feasible.
    """
    best = lo - 1
    while lo <= hi:
        if hi - lo + 1 <= grid:
            cand = np.arange(lo, hi + 1)
        else:
            spaced = np.geomspace(lo, hi, grid) if lo > 0 else np.linspace(lo, hi, grid)
            cand = np.unique(np.round(spaced).astype(np.int64))
        cand = np.concatenate([cand, np.full(grid - len(cand), cand[-1])])
        ok = np.asarray(feasible_fn(cand), bool)
        if not ok[0]:
            return best
        i = int(np.max(np.nonzero(ok)[0]))
        best = int(cand[i])
        if cand[i] == cand[-1]:
            return best
        lo, hi = int(cand[i]) + 1, int(cand[np.searchsorted(cand, cand[i], side="right")]) - 1
    return best


def feasible_batches(cfg: Config, batches: np.ndarray, slots: int) -> np.ndarray:
    """Whether ``cfg`` fits at each of ``batches`` (``slots`` item slots for every candidate)."""
    batches = np.asarray(batches, np.int64)
    if cfg.scheme == "gpipe":
        items = gpipe_items(cfg.seq_len, batches, cfg.microbatch, slots)
    else:
        items = Chunks.padded(np.broadcast_to(cfg.partition, (len(batches), len(cfg.partition))), batches, slots)
    pts, axes = batched_items(cfg.point(slots), items)
    out = evaluate_points(pts, cfg.shape(slots), axes, len(batches), ("feasible",))
    return out["feasible"]


def largest_feasible_batch(cfg: Config, max_batch: int) -> int:
    """B': the largest batch in ``[1, max_batch]`` that fits (0 if none)."""
    slots = bucket(-(-max_batch // cfg.microbatch)) if cfg.scheme == "gpipe" else bucket(len(cfg.partition))
    return max(largest_true(lambda b: feasible_batches(cfg, b, slots), 1, int(max_batch)), 0)


def max_feasible_batch(model, hardware, seq_len: int, scheme: str = "terapipe", *, chunks: int | None = None,
                       partition=None, release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                       microbatch: int = 1, placement=None, stages: int | None = None, dtype="float32",
                       max_batch: int = 1024, pairing: str = "cross-half", p1: float = DEFAULT_P1,
                       p2: float = DEFAULT_P2, read_overlap: float = DEFAULT_READ_OVERLAP, spill: str = "overflow",
                       tp: int = 1) -> int:
    """Largest batch B' (requests) whose every stage fits its usable HBM at every instant; 0 if even B = 1 does not.

    A vectorised bracket search over B in ``[1, max_batch]`` (feasibility is monotone in B: KV and
    activations grow with it).
    """
    limit = checks.integer("max_batch", max_batch, 1, LIMITS["batch"])
    cfg = resolve(model, hardware, seq_len, scheme, chunks=chunks, batch=1, partition=partition, release=release,
                  admission=admission, num_batches=num_batches, microbatch=microbatch, placement=placement,
                  stages=stages, dtype=dtype, pairing=pairing, p1=p1, p2=p2, read_overlap=read_overlap, spill=spill,
                  tp=tp)
    if cfg.scheme == "gpipe" and -(-limit // cfg.microbatch) > LIMITS["chunks"]:
        raise SpecError(f"max_batch {limit} needs {-(-limit // cfg.microbatch)} GPipe microbatches, more than the "
                        f"{LIMITS['chunks']} items a batch holds; use a larger microbatch or a smaller max_batch")
    return largest_feasible_batch(cfg, limit)


def max_feasible_seq_len(model, hardware, scheme: str = "terapipe", *, chunks: int = 16, batch: int = 1,
                         release: str = "stage", admission: str = "streaming", num_batches: int = 1,
                         microbatch: int = 1, placement=None, stages: int | None = None, dtype="float32",
                         granularity: int = 1, max_seq_len: int = 1 << 24, pairing: str = "cross-half",
                         p1: float = DEFAULT_P1, p2: float = DEFAULT_P2, read_overlap: float = DEFAULT_READ_OVERLAP,
                         spill: str = "overflow", fractions=None, tp: int = 1) -> int:
    """Longest prompt S (a multiple of ``granularity``, at most ``max_seq_len``) that fits.

    By default ``num_batches`` is 1: the longest sequence of one batch alone, the quantity the study
    reports (``compare``, ``reproduce``, ``claims``).  With 2 the batch must also fit beside the next
    one, streaming behind it; then every stage fills up at once, which leaves MBKR's creditors
    little room (Llama-3-70B on mocap-4x4, M = 16: 6.80M tokens with MBKR against 6.43M without
    for one batch, 6.43M for both with two).

    Chunked schemes use ``chunks`` uniform chunks, or the chunk-size ``fractions`` (summing to 1)
    scaled to each S.  A vectorised bracket search; 0 if even the shortest does not fit.
    """
    M = check_chunks(chunks)
    g = checks.integer("granularity", granularity, 1, LIMITS["seq_len"])
    top = checks.integer("max_seq_len", max_seq_len, 1, LIMITS["seq_len"],
                         f" The simulator represents prompts of up to {LIMITS['seq_len']:,} tokens.")
    cfg = resolve(model, hardware, max(M, g), scheme, chunks=M, batch=batch, release=release, admission=admission,
                  num_batches=num_batches, microbatch=microbatch, placement=placement, stages=stages, dtype=dtype,
                  pairing=pairing, p1=p1, p2=p2, read_overlap=read_overlap, spill=spill, tp=tp)
    lo = 1 if scheme == "gpipe" else -(-M // g)
    hi = top // g
    if hi < lo:
        raise SpecError(f"max_seq_len={top} is below the shortest sequence {lo * g} for {M} chunks")
    frac = None if fractions is None else check_fractions(fractions, M, scheme)
    slots = bucket(-(-cfg.batch // cfg.microbatch)) if scheme == "gpipe" else bucket(M)

    def feasible(units):
        seqs = np.asarray(units, np.int64) * g
        if scheme == "gpipe":
            items = gpipe_items(seqs, cfg.batch, cfg.microbatch, slots)
        else:
            parts = uniform_partitions(seqs, M) if frac is None else scaled_partitions(frac, seqs)
            items = Chunks.padded(parts, cfg.batch, slots)
        pts, axes = batched_items(cfg.point(slots), items)
        return evaluate_points(pts, cfg.shape(slots), axes, len(seqs), ("feasible",))["feasible"]

    units = largest_true(feasible, lo, hi)
    return units * g if units >= lo else 0   # below lo: not even the shortest sequence fits


def check_fractions(fractions, chunks: int, scheme: str) -> np.ndarray:
    """Chunk-size fractions of a length search: ``chunks`` positive shares summing to 1."""
    if scheme == "gpipe":
        raise SpecError("fractions apply to the chunked schemes (terapipe, mbkr), not gpipe")
    try:
        frac = np.asarray(fractions, np.float64)
    except (TypeError, ValueError):
        raise SpecError(f"fractions must be a list of {chunks} numbers, got {fractions!r}") from None
    if frac.shape != (chunks,):
        raise SpecError(f"fractions must list one share per chunk ({chunks}), got shape {frac.shape}")
    if not np.all(np.isfinite(frac) & (frac > 0)) or abs(math.fsum(frac) - 1.0) > 1e-6:
        raise SpecError(f"fractions must be positive shares of the sequence summing to 1, got {frac.tolist()}; "
                        f"divide chunk sizes by their sum")
    return frac


def scaled_partitions(fractions: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Chunk-size fractions scaled to each sequence length, ``[P, M]`` (rows sum exactly; chunks >= 1 token)."""
    raw = np.outer(seqs, fractions)
    part = np.maximum(np.floor(raw).astype(np.int64), 1)
    part[:, -1] += seqs - part.sum(1)
    if np.any(part[:, -1] < 1):
        bad = part[:, -1] < 1
        part[bad] = uniform_partitions(seqs[bad], len(fractions))
    return part
