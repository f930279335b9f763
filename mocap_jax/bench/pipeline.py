"""``mocap-jax bench pipeline``: full EvaluatePrefill evaluations per second through ``simulate_batch``."""

from __future__ import annotations

import time

import numpy as np

from ..api.batch import simulate_batch
from ..api.search import max_feasible_batch
from ..specs import LIMITS, checks
from .machine import host, local_devices

#: what the benchmark returns per point: the full evaluation's summary (times, memory, feasibility)
FIELDS = ("prefill_latency_s", "feasible", "throughput_rps", "period_s", "bubble_fraction",
          "peak_mem_bytes_per_stage", "kv_peak_bytes_per_stage", "spilled_bytes_per_stage")


def random_partitions(rng: np.random.Generator, count: int, seq_len: int, chunks: int, granularity: int = 1):
    """``[count, chunks]`` random integer partitions of ``seq_len`` (each chunk >= granularity, multiples of it)."""
    units = seq_len // granularity
    if units < chunks:
        raise ValueError(f"cannot split {seq_len} tokens into {chunks} chunks of at least {granularity}")
    w = rng.dirichlet(np.ones(chunks), size=count)
    extra = units - chunks
    part = np.floor(w * extra).astype(np.int64)
    part[np.arange(count), rng.integers(0, chunks, size=count)] += extra - part.sum(1)
    return ((part + 1) * granularity).astype(np.int64)


def bench_pipeline(model: str = "llama3-70b", hardware: str = "mocap-4x4", seq_len: int = 65536, chunks: int = 32,
                   points: int = 131072, block: int = 16384, repeats: int = 3, seed: int = 0, scheme: str = "terapipe",
                   batch: int | None = None, num_batches: int = 1) -> dict:
    """Evaluations per second of ``points`` random partitions through ``simulate_batch`` (one batch each).

    ``batch`` defaults to 1 for TeraPipe and, for MBKR, to the largest batch the uniform partition
    fits without MBKR plus 10% (so most points spill and run the MBKR passes).
    """
    repeats = checks.integer("repeats", repeats, 1, LIMITS["repeats"])
    machine = host()
    rng = np.random.default_rng(seed)
    parts = random_partitions(rng, points, seq_len, chunks)
    if batch is None:
        batch = 1
        if scheme == "mbkr":
            plain = max_feasible_batch(model, hardware, seq_len, "terapipe", chunks=chunks, num_batches=num_batches)
            batch = max(int(plain * 1.1), plain + 1)
    kw = dict(batch=batch, partition=parts[:block], num_batches=num_batches, block_size=block, fields=FIELDS)
    t0 = time.perf_counter()
    simulate_batch(model, hardware, seq_len, scheme, **kw)             # compile (and one warm block)
    compile_s = time.perf_counter() - t0
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = simulate_batch(model, hardware, seq_len, scheme, **{**kw, "partition": parts})
        times.append(time.perf_counter() - t0)
    med = float(np.median(times))
    lat = out["prefill_latency_s"]
    return {"benchmark": "pipeline", "path": "simulate_batch (full evaluation: times, memory, feasibility)",
            "scheme": scheme, "model": model, "hardware": hardware, "seq_len": seq_len, "chunks": chunks,
            "batch": int(batch), "num_batches": num_batches, "points": int(points), "block": block,
            **local_devices(), **machine,
            "compile_and_first_block_s": compile_s, "median_s": med, "best_s": min(times),
            "evals_per_s": points / med, "evals_per_s_best": points / min(times),
            "feasible_share": float(np.mean(out["feasible"])),
            "spilling_share": float(np.mean(out["spilled_bytes_per_stage"].sum(1) > 0)),
            "latency_min_s": float(np.min(lat[np.isfinite(lat)])) if np.isfinite(lat).any() else None}
