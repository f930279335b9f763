"""Timing the grid: device peaks, interleaved timing rounds, and the isolated single-threaded
measurement process."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...specs import HardwareSpec, ModelSpec
from .sizes import CalibrationSize, GPU_NOMINAL
from .transformer import build_chunk_fn, init_weights, normal_source


SINGLE_THREAD_XLA_FLAGS = ("--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1")


def _clock(kind: str):
    """``"cpu"``: CPU time of this process (all threads); ``"wall"``: elapsed time."""
    if kind == "cpu":
        return time.process_time
    if kind == "wall":
        return time.perf_counter
    raise ValueError(f"clock must be 'cpu' or 'wall', got {kind!r}")


def _best_time(fn, args, repeats: int, clock) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(repeats):
        t0 = clock()
        jax.block_until_ready(fn(*args))
        best = min(best, clock() - t0)
    return max(best, 1e-9)


def measure_device_peaks(dtype, accelerator: bool, clock: str = "wall") -> dict[str, float]:
    """Best-of-several big matmul (FLOP/s) and streaming read (bytes/s, a reduction) at ``dtype``."""
    import jax
    import jax.numpy as jnp

    clk = _clock(clock)
    n = 8192 if accelerator else 1024
    a = jnp.asarray(np.random.default_rng(1).standard_normal((n, n), dtype=np.float32), dtype)
    mm = jax.jit(lambda x, y: x @ y)
    t_mm = _best_time(mm, (a, a), 10, clk)
    nbytes = (2 << 30) if accelerator else (256 << 20)
    itemsize = jnp.dtype(dtype).itemsize
    x = jnp.ones((nbytes // itemsize // 1024, 1024), dtype)
    rd = jax.jit(lambda x: jnp.sum(x, axis=0, dtype=jnp.float32))
    t_rd = _best_time(rd, (x,), 10 if accelerator else 5, clk)
    del a, x
    return {"matmul_flops": 2.0 * n ** 3 / t_mm, "matmul_n": n, "read_bandwidth": nbytes / t_rd,
            "read_bytes": nbytes}


def best_peaks(a: dict, b: dict) -> dict:
    return {**a, "matmul_flops": max(a["matmul_flops"], b["matmul_flops"]),
            "read_bandwidth": max(a["read_bandwidth"], b["read_bandwidth"])}


def nominal_hardware(device_kind: str, platform: str, dtype_bytes: float, measured: dict,
                     threads: str = "") -> tuple[HardwareSpec, str]:
    """HardwareSpec of the local device (one die, no links) and a sentence saying where its numbers come from."""
    kind = device_kind.lower()
    peak, bw, source = measured["matmul_flops"], measured["read_bandwidth"], None
    if platform == "gpu" and dtype_bytes == 2:
        for key, p_, b_, desc in GPU_NOMINAL:
            if key in kind:
                peak, bw, source = p_, b_, f"vendor nominal ({desc})"
                break
    if source is None:
        source = (f"measured{' (' + threads + ')' if threads else ''}, best of runs before and after the timed "
                  f"rounds: {measured['matmul_n']}^3 matmul {measured['matmul_flops'] / 1e9:.1f} GFLOP/s, streaming "
                  f"reduction over {measured['read_bytes'] >> 20} MiB {measured['read_bandwidth'] / 1e9:.1f} GB/s")
    hw = HardwareSpec(name=f"local-{platform}", rows=1, cols=1, topology="switch", peak_flops=float(peak),
                      hbm_capacity=80e9, hbm_bandwidth=float(bw), eff_gemm=1.0, eff_attention=1.0, eff_hbm=1.0,
                      weight_bytes=float(dtype_bytes), kv_bytes=float(dtype_bytes),
                      activation_bytes=float(dtype_bytes), layer_overhead_s=0.0, gemm_fixed_s=0.0,
                      description=f"{device_kind} ({platform}); peak/bandwidth {source}")
    return hw, source


# --------------------------------------------------------------------------- the cost model and its fit


PRECALL_BELOW_S = 0.05  # cells faster than this get an untimed call before each sample


def measure(cfg: CalibrationSize, seed: int, clock: str, threads: str, log=None) -> dict[str, Any]:
    """Compile, warm up and time every grid cell on JAX's default device; JSON-able result."""
    import concurrent.futures
    import os

    import jax
    import jax.numpy as jnp

    clk = _clock(clock)
    device = jax.devices()[0]
    accelerator = device.platform != "cpu"
    dtype = jnp.dtype(cfg.dtype)
    peaks = measure_device_peaks(dtype, accelerator, clock)
    if log:
        log(f"device {device.device_kind} ({device.platform}, {threads}); best matmul "
            f"{peaks['matmul_flops'] / 1e9:.1f} GFLOP/s, streaming read {peaks['read_bandwidth'] / 1e9:.1f} GB/s")

    model = cfg.model
    L, Hkv, hd = model.layers, model.kv_heads, model.head_dim
    weights = init_weights(model, dtype, seed, on_device=accelerator)
    fn = build_chunk_fn(model, dtype, cfg.kv_block, cfg.q_block, cfg.q_rows)
    s_max = max(cfg.kv_block, -(-max(cfg.prefixes) // cfg.kv_block) * cfg.kv_block)
    normal = normal_source(seed + 1, accelerator)
    caches, inputs = {}, {}
    for b in cfg.batches:
        shape = (L, b, Hkv, s_max, hd)
        caches[b] = (normal(shape, dtype), normal(shape, dtype))
        for c in cfg.chunks:
            inputs[(b, c)] = normal((b, c, model.hidden), dtype)
    p_dev = {p: jnp.asarray(p, jnp.int32) for p in cfg.prefixes}

    # Compile one executable per (B, c) (p is a runtime argument), a few at a time.
    t0 = time.perf_counter()

    def compile_one(bc):
        b, c = bc
        return bc, fn.lower(weights, inputs[bc], *caches[b], p_dev[cfg.prefixes[0]]).compile()

    workers = 1 if accelerator else max(1, min(len(inputs), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        compiled = dict(pool.map(compile_one, list(inputs)))
    compile_s = time.perf_counter() - t0
    if log:
        log(f"compiled {len(compiled)} executables in {compile_s:.1f} s")

    cells = [(c, p, b) for b in cfg.batches for c in cfg.chunks for p in cfg.prefixes]

    def call(cell):
        c, p, b = cell
        return compiled[(b, c)](weights, inputs[(b, c)], *caches[b], p_dev[p])

    # Warm-up: untimed calls per cell, then size the samples (n back-to-back synchronous calls each).
    # A sample of a short cell starts with one more untimed call, so its timed calls find the caches as
    # warm as the previous call of the same cell left them (not as the previous *cell* left them).
    n_inner, precall = {}, {}
    for cell in cells:
        jax.block_until_ready(call(cell))
        t_a = clk()
        jax.block_until_ready(call(cell))
        dt = clk() - t_a
        n_inner[cell] = int(min(max(math.ceil(cfg.min_sample_s / max(dt, 1e-7)), 1), 200))
        precall[cell] = dt < PRECALL_BELOW_S

    rng = np.random.default_rng(seed + 12345)
    samples = {cell: [] for cell in cells}
    walls = {cell: [] for cell in cells}
    t_start = time.perf_counter()
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(cfg.rounds):
            for i in rng.permutation(len(cells)):
                cell = cells[i]
                n = n_inner[cell]
                if precall[cell]:
                    jax.block_until_ready(call(cell))
                w0, c0 = time.perf_counter(), clk()
                for _ in range(n):
                    jax.block_until_ready(call(cell))
                c1, w1 = clk(), time.perf_counter()
                samples[cell].append((c1 - c0) / n)
                walls[cell].append((w1 - w0) / n)
            elapsed = time.perf_counter() - t_start
            if log:
                log(f"round {r + 1}/{cfg.rounds} done ({elapsed:.1f} s)")
            if r + 1 >= cfg.min_rounds and elapsed * (r + 2) / (r + 1) > cfg.measure_budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    measure_s = time.perf_counter() - t_start
    peaks = best_peaks(peaks, measure_device_peaks(dtype, accelerator, clock))  # best of before and after
    med = [float(np.median(samples[cell])) for cell in cells]
    iqr = [float((np.percentile(samples[cell], 75) - np.percentile(samples[cell], 25)) / np.median(samples[cell]))
           for cell in cells]
    all_s = np.concatenate([samples[cell] for cell in cells])
    all_w = np.concatenate([walls[cell] for cell in cells])
    return {
        "device_kind": device.device_kind, "platform": device.platform, "jax_version": jax.__version__,
        "local_devices": jax.local_device_count(), "threads": threads, "clock": clock, "dtype": str(dtype),
        "peaks": peaks,
        "c": [cell[0] for cell in cells], "p": [cell[1] for cell in cells], "b": [cell[2] for cell in cells],
        "t": med, "t_min": [float(min(samples[cell])) for cell in cells],
        "t_wall": [float(np.median(walls[cell])) for cell in cells], "spread": iqr,
        "n_inner": [n_inner[cell] for cell in cells], "rounds": len(samples[cells[0]]),
        "clock_to_wall": float(np.median(all_s / all_w)),
        "compile_s": compile_s, "measure_s": measure_s, "kv_cache_tokens": s_max,
    }


def _cfg_to_json(cfg: CalibrationSize) -> dict:
    d = dataclasses.asdict(cfg)
    d["model"] = cfg.model.to_dict()
    return d


def _cfg_from_json(d: dict) -> CalibrationSize:
    d = dict(d)
    d["model"] = ModelSpec(**d["model"])
    for k in ("chunks", "prefixes", "batches"):
        d[k] = tuple(int(v) for v in d[k])
    return CalibrationSize(**d)


def _child_xla_flags() -> str:
    import os

    keep = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith(("--xla_force_host_platform_device_count", "--xla_cpu_multi_thread_eigen",
                                 "intra_op_parallelism_threads"))]
    return " ".join(keep + list(SINGLE_THREAD_XLA_FLAGS))


def measure_isolated(cfg: CalibrationSize, seed: int, log=None) -> dict[str, Any]:
    """Run :func:`measure` in a fresh single-threaded XLA:CPU process timed by its CPU clock."""
    import collections
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mocap-calibrate-") as tmp:
        out = Path(tmp) / "measurement.json"
        env = dict(os.environ)
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = _child_xla_flags()
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = "1"
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        payload = {"cfg": _cfg_to_json(cfg), "seed": seed, "clock": "cpu", "out": str(out),
                   "threads": "XLA:CPU single-threaded, isolated process"}
        proc = subprocess.Popen([sys.executable, "-m", __name__, "--worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=root)
        tail = collections.deque(maxlen=30)
        try:
            proc.stdin.write(json.dumps(payload))
            proc.stdin.close()
            for line in proc.stderr:
                if line.startswith(_WORKER_TAG):
                    if log:
                        log(line[len(_WORKER_TAG):].rstrip())
                else:
                    tail.append(line)
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if rc != 0 or not out.exists():
            raise RuntimeError(f"calibration measurement process failed (exit {rc}):\n{''.join(tail)}")
        return json.loads(out.read_text())


_WORKER_TAG = "[calibrate] "


def _worker_main() -> int:
    import sys

    payload = json.loads(sys.stdin.read())
    cfg = _cfg_from_json(payload["cfg"])

    def log(msg):
        print(_WORKER_TAG + msg, file=sys.stderr, flush=True)

    res = measure(cfg, int(payload["seed"]), payload["clock"], payload["threads"], log)
    Path(payload["out"]).write_text(json.dumps(res))
    return 0


# --------------------------------------------------------------------------- public entry points


if __name__ == "__main__":  # the isolated measurement process (see measure_isolated)
    import sys

    if sys.argv[1:] != ["--worker"]:
        sys.exit("usage: python -m mocap_jax.validation.calibration.measure --worker\n"
                 "(the internal measurement process; run `mocap-jax calibrate` instead)")
    sys.exit(_worker_main())
