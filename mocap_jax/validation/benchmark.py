"""Speed of the vectorised evaluator against the event-driven reference on the same configurations.

:func:`run_bench_reference` draws random chunked configurations of one model and mesh (random
partitions, batches and sequence lengths), evaluates them all in one
:func:`mocap_jax.api.simulate_batch` call (a warm-up call first, which includes tracing and
compilation; then the median of several timed calls) and one by one through the reference, and
reports both wall times, the speed-up and the largest latency disagreement as a sanity check.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..specs import LIMITS, SpecError, checks
from .agreement import random_partition


def bench_configs(n: int, seed: int, chunks: int) -> dict[str, np.ndarray]:
    """``n`` random points with ``chunks`` chunks each: ``seq_len [n]``, ``batch [n]``, ``partition [n, chunks]``."""
    rng = np.random.default_rng(seed)
    seq = np.round(2 ** rng.uniform(max(10, math.log2(chunks)), 17, size=n)).astype(np.int64)
    batch = rng.integers(1, 9, size=n).astype(np.int64)
    part = np.stack([random_partition(rng, int(s), chunks) for s in seq]).astype(np.int64)
    return dict(seq_len=seq, batch=batch, partition=part)


def run_bench_reference(configs: int = 1000, model: str = "llama3-70b", hardware: str = "mocap-4x4",
                        chunks: int = 16, dtype: str = "float32", seed: int = 0, repeats: int = 5,
                        num_batches: int = 1) -> dict[str, Any]:
    """Time ``configs`` TeraPipe points through one ``simulate_batch`` call and through the reference.

    Returns:
      ``configs``, the settings, ``devices`` (of ``local_devices``) the vectorised call ran on and
      their ``device_kind``, ``vectorised_wall_s`` (median of ``repeats`` timed calls) and
      ``vectorised_best_s``, ``warmup_call_s`` and ``compile_s`` (warm-up minus the median),
      ``reference_wall_s`` (every point one by one), ``speedup`` (reference / vectorised median),
      per-configuration microseconds of both, ``max_rel_err_latency`` between them and
      ``feasible_configs`` (reference), and the host (:func:`mocap_jax.bench.machine.host`).
    """
    import jax

    from ..api import resolve, simulate_batch
    from ..bench.machine import host
    from ..prefill.batch import block_devices
    from .reference import reference_simulate

    configs = checks.integer("configs", configs, 1, LIMITS["reference_configs"])
    chunks = checks.integer("chunks", chunks, 1, 1024)
    repeats = checks.integer("repeats", repeats, 1, LIMITS["repeats"])
    machine = host()
    if dtype not in ("float32", "float64"):
        raise SpecError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    pts = bench_configs(configs, seed, chunks)
    kw = dict(scheme="terapipe", release="stage", admission="streaming", num_batches=num_batches, dtype=dtype,
              fields=("raw_latency_s", "feasible"))
    call = lambda: simulate_batch(model, hardware, pts["seq_len"], batch=pts["batch"], partition=pts["partition"],
                                  **kw)
    t0 = time.perf_counter()
    call()
    warm = time.perf_counter() - t0
    walls = []
    for _ in range(repeats):
        t1 = time.perf_counter()
        out = call()
        walls.append(time.perf_counter() - t1)
    vec_wall = float(np.median(walls))
    # the devices the call's blocks ran on (a small block runs on one: sharding costs more than it saves)
    shape = resolve(model, hardware, int(pts["seq_len"][0]), "terapipe", partition=pts["partition"][0],
                    num_batches=num_batches, dtype=dtype).shape()
    devices = block_devices(shape, configs)
    lat_vec = np.asarray(out["raw_latency_s"], np.float64)
    lat_ref = np.empty(configs)
    feasible = 0
    t2 = time.perf_counter()
    for i in range(configs):
        r = reference_simulate(model, hardware, int(pts["seq_len"][i]), "terapipe", batch=int(pts["batch"][i]),
                               partition=pts["partition"][i], num_batches=num_batches)
        lat_ref[i] = r.raw_latency_s
        feasible += int(r.feasible)
    ref_wall = time.perf_counter() - t2
    return dict(configs=configs, model=model, hardware=hardware, chunks=chunks, dtype=dtype, num_batches=num_batches,
                devices=len(devices), device_kind=devices[0].device_kind, local_devices=len(jax.local_devices()),
                vectorised_wall_s=vec_wall, vectorised_best_s=float(min(walls)), warmup_call_s=warm,
                compile_s=max(warm - vec_wall, 0.0), reference_wall_s=ref_wall, speedup=ref_wall / vec_wall,
                reference_per_config_us=1e6 * ref_wall / configs, vectorised_per_config_us=1e6 * vec_wall / configs,
                max_rel_err_latency=float(np.max(np.abs(lat_vec - lat_ref) / lat_ref)), feasible_configs=feasible,
                **machine)


__all__ = ["bench_configs", "run_bench_reference"]
