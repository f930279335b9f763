"""Benchmarks (commands, not tests).  ``mocap-jax bench pipeline`` lives here.

Throughput numbers depend on the machine; the README quotes the figures measured
with the exact commands shown there.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from .costs import HardwareParams, ModelParams, StageLayout
from .schedule import bucket, partition_latency
from .specs import get_hardware, get_model


def random_partitions(rng: np.random.Generator, count: int, seq_len: int, chunks: int, granularity: int = 1):
    """``[count, chunks]`` random integer partitions of ``seq_len`` (each chunk >= granularity, multiples of it)."""
    units = seq_len // granularity
    if units < chunks:
        raise ValueError(f"cannot split {seq_len} tokens into {chunks} chunks of at least {granularity}")
    w = rng.dirichlet(np.ones(chunks), size=count)
    extra = units - chunks
    part = np.floor(w * extra).astype(np.int64)
    short = extra - part.sum(1)
    idx = rng.integers(0, chunks, size=count)
    part[np.arange(count), idx] += short
    return ((part + 1) * granularity).astype(np.int32)


def device_mesh():
    """A 1-D mesh over every local device, with plain data-parallel (Auto) axes."""
    devices = jax.devices()
    return jax.make_mesh((len(devices),), ("points",), axis_types=(AxisType.Auto,))


def bench_pipeline(model: str = "llama3-70b", hardware: str = "mocap-4x4", seq_len: int = 65536, chunks: int = 32,
                   partitions: int = 131072, block: int = 1024, repeats: int = 5, seed: int = 0,
                   dtype=np.float32) -> dict:
    """Chunked-pipeline evaluations per second over random partitions.

    Each evaluation computes the §4 stage times and hand-offs of one partition and
    runs the §5 recurrence to the last item's finish on the last stage.  Points are
    sharded over every local device and evaluated in blocks of ``block``.
    """
    m = get_model(model)
    hw = get_hardware(hardware)
    n = hw.num_dies
    mesh = device_mesh()
    nd = mesh.size
    per = block * nd
    partitions = -(-partitions // per) * per
    rng = np.random.default_rng(seed)
    parts = random_partitions(rng, partitions, seq_len, chunks)
    mp, hp = ModelParams.from_spec(m, dtype), HardwareParams.from_spec(hw, dtype)
    layout = StageLayout.snake(hw, n, bucket(n), dtype)
    sharding = NamedSharding(mesh, PartitionSpec("points"))
    n_pad = bucket(n)

    def per_device(x):  # x: [blocks, block, M] on one device
        return jax.lax.map(lambda y: partition_latency(y, 1, mp, hp, layout, n_pad), x)

    fn = jax.jit(jax.vmap(per_device), out_shardings=sharding)
    x = jax.device_put(parts.reshape(nd, -1, block, chunks), sharding)
    t0 = time.perf_counter()
    compiled = fn.lower(x).compile()
    compile_s = time.perf_counter() - t0
    compiled(x).block_until_ready()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = compiled(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    lat = np.asarray(out).reshape(-1)
    return {
        "benchmark": "pipeline", "model": m.name, "hardware": hw.name, "seq_len": seq_len, "chunks": chunks,
        "stages": n, "evaluations": int(partitions), "devices": nd, "device_kind": jax.devices()[0].device_kind,
        "compile_s": compile_s, "best_s": min(times), "median_s": float(np.median(times)),
        "evals_per_s": partitions / float(np.median(times)), "evals_per_s_best": partitions / min(times),
        "latency_min_s": float(lat.min()), "latency_max_s": float(lat.max()),
    }
