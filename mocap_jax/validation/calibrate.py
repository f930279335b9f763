"""Calibration of the §4 cost model against real execution (DESIGN §9.2).

What is measured
----------------
Chunked prefill of a small Llama-style transformer with random weights, run by JAX
on the local device: ``L`` blocks of RMSNorm, fused QKV projection, RoPE, GQA
causal attention of the chunk over a KV cache holding ``p`` prefix tokens plus
the chunk itself, output projection, RMSNorm and a SwiGLU MLP.  One call processes
one chunk of ``c`` tokens for each of ``B`` requests through all ``L`` blocks and
returns the hidden states and the chunk's new K/V (to be appended to the cache).
No embedding and no LM head: the input is a ``[B, c, hidden]`` activation.

Attention is written the way a real prefill kernel works (flash-attention
style, online softmax in float32, head-major KV cache ``[L, B, kv_heads, S, hd]``):
the prefix is read from a preallocated cache in blocks of ``kv_block`` tokens by a
loop whose trip count is ``ceil(p / kv_block)`` (``p`` is a *runtime* argument, so
one executable per ``(B, c)`` serves every prefix length), and the chunk attends
to itself causally in query blocks of ``q_block`` tokens that skip the masked upper
triangle.  The work done is therefore ``B c (p + (c + q_block) / 2)`` query-key
pairs, close to the ``B c (p + (c+1)/2)`` of §4.  Its output equals a plain dense
causal forward over the whole sequence (``tests/test_calibration.py``).

How it is timed
---------------
After compiling and two untimed calls per cell, the cells are timed in interleaved
rounds (every round visits every cell in a fresh random order, so a burst of load
spreads over many cells instead of ruining one); a sample is the mean of ``n``
back-to-back synchronous calls (``block_until_ready`` after each), ``n`` chosen so
a sample lasts at least ``min_sample_s``, preceded by one untimed call for cells
under 50 ms (so the timed calls find caches warmed by the same cell); the cell's
latency is the median of its samples.

On a CPU (the default there) this runs in a separate process whose XLA:CPU is
single-threaded, and the clock is that process's CPU time: the latency on one
dedicated core.  Wall-clock timings of multi-threaded XLA on a small shared machine
swing by 2x whenever another process takes a core; the CPU time of a
single-threaded process does not (measured here: within a few percent while two
busy loops competed for both cores).  The wall-clock medians are kept in the
records.  On a GPU/TPU the measurement runs in this process by wall clock.

What is fitted
--------------
The prediction is ``L x costs.dense_layer_time(model, hw, c, p, B, xp=numpy)`` for
the :class:`~mocap_jax.specs.ModelSpec` of the test transformer and a
:class:`~mocap_jax.specs.HardwareSpec` of the local device.  Its nominal
``peak_flops`` and ``hbm_bandwidth`` are, on a CPU, measured in the same process
(best of several 1024^3 matmuls at the run's precision and best of several
streaming reductions over a 256 MiB array, before and after the timed rounds); on
a GPU they are the vendor's dense peak and HBM bandwidth for the device kind when
known (measured otherwise, and reported either way).  The fitted
parameters are ``eff_gemm``, ``eff_attention``, ``eff_hbm`` (each in (0, 1]) and
``layer_overhead_s`` (>= 0), by bounded least squares on the log of
predicted / measured (a relative error, which is what MAPE scores), from several
starting points.  An efficiency whose roofline branch binds on no training point
does not influence the fit and is reported as not identified.

The split is a seeded random ``1 - test_fraction`` / ``test_fraction`` split of the
grid cells; the score is the MAPE on the held-out cells.  The baseline is a linear
least-squares model ``t = a + b (Bc) + d (Bp) + e (Bc p)`` (the plain
``(c, p, c p)`` model with the token counts of all ``B`` requests, identical to
it when ``B = 1``), fitted on the same training cells by relative-error weighted
least squares; the literal ``(c, p, c p)`` model, which cannot see ``B``, is also
reported.

What it shows on a 2-core CPU (AMD EPYC, float32, one XLA thread)
-----------------------------------------------------------------
Held-out MAPE about 4-7 % for ``small`` and ``cpu`` (15 % is the test's bound), on
par with the linear baseline (which has one more free coefficient); the plain
``(c, p, c p)`` fit that ignores ``B`` is off by 25-45 %.  The worst cells are the
smallest chunks (c = 32), where XLA:CPU's fixed per-call and per-KV-block costs,
which the roofline has no term for, dominate.  The four parameters are only
loosely identified on a CPU (a GEMM memory branch with a low ``eff_hbm`` and the
per-layer overhead can stand in for each other); the report gives Jacobian
standard errors and which branches bind.  Small models' weights fit in the L3
cache, so the "HBM" of these runs is partly cache.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..costs import HardwareParams, ModelParams, dense_layer_time
from ..specs import HardwareSpec, ModelSpec

# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class CalibrationSize:
    """One calibration configuration: the test transformer, the grid and the measurement plan."""

    name: str
    model: ModelSpec
    chunks: tuple[int, ...]
    prefixes: tuple[int, ...]
    batches: tuple[int, ...]
    dtype: str                   # "float32" or "bfloat16"
    kv_block: int                # prefix tokens per attention step
    q_block: int                 # query block of the causal in-chunk attention
    q_rows: int                  # query rows per prefix tile (0: the whole chunk at once)
    rounds: int                  # timed rounds over the whole grid (after one warm-up round)
    min_rounds: int              # rounds kept even when the time budget runs out
    min_sample_s: float          # a timing sample lasts at least this long (back-to-back calls)
    measure_budget_s: float      # stop adding rounds after this much measuring time
    test_fraction: float = 0.4
    needs_accelerator: bool = False


def _llama_like(name, layers, hidden, ffn, q_heads, kv_heads, head_dim) -> ModelSpec:
    # vocab is irrelevant (no embedding / LM head is run) but must be positive.
    return ModelSpec(name=name, layers=layers, hidden=hidden, ffn=ffn, q_heads=q_heads, kv_heads=kv_heads,
                     head_dim=head_dim, vocab=32000)


SIZES: dict[str, CalibrationSize] = {
    "small": CalibrationSize(
        name="small",
        model=_llama_like("calib-small", layers=2, hidden=512, ffn=1536, q_heads=8, kv_heads=2, head_dim=64),
        chunks=(32, 64, 128, 256), prefixes=(0, 512, 1024, 2048, 3072), batches=(1, 2),
        dtype="float32", kv_block=256, q_block=128, q_rows=512,
        rounds=11, min_rounds=3, min_sample_s=0.01, measure_budget_s=20.0),
    "cpu": CalibrationSize(
        name="cpu",
        model=_llama_like("calib-cpu", layers=4, hidden=768, ffn=2048, q_heads=12, kv_heads=4, head_dim=64),
        chunks=(32, 64, 128, 256, 512), prefixes=(0, 1024, 2048, 4096, 8192), batches=(1, 2, 4),
        dtype="float32", kv_block=256, q_block=128, q_rows=512,
        rounds=4, min_rounds=3, min_sample_s=0.02, measure_budget_s=120.0),
    "gpu": CalibrationSize(
        name="gpu",
        # Llama-3.1-8B blocks (hidden 4096, FFN 14336, GQA 32/8 x 128), four of them, in bf16.
        model=_llama_like("calib-gpu-llama8b-blocks", layers=4, hidden=4096, ffn=14336, q_heads=32, kv_heads=8,
                          head_dim=128),
        chunks=(128, 256, 512, 1024, 2048, 4096), prefixes=(0, 2048, 4096, 8192, 16384, 32768), batches=(1, 2),
        dtype="bfloat16", kv_block=512, q_block=256, q_rows=0,
        rounds=7, min_rounds=3, min_sample_s=0.02, measure_budget_s=240.0, needs_accelerator=True),
}

# Vendor dense peaks (FLOP/s) at bf16/fp16 and HBM bandwidths (bytes/s) by JAX device_kind substring.
_GPU_NOMINAL = (
    ("gh200", 989e12, 4.0e12, "GH200: 989 TFLOP/s dense BF16, 4 TB/s HBM3"),  # before "h200": a substring
    ("h200", 989e12, 4.8e12, "H200 SXM: 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e"),
    ("h100", 989e12, 3.35e12, "H100 SXM: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3"),
    ("b200", 2.25e15, 7.7e12, "B200: 2.25 PFLOP/s dense BF16, 7.7 TB/s HBM3e"),
    ("a100", 312e12, 2.039e12, "A100 SXM 80GB: 312 TFLOP/s dense BF16, 2.039 TB/s HBM2e"),
)

FIT_NAMES = ("eff_gemm", "eff_attention", "eff_hbm", "layer_overhead_s")


def _check_size(size) -> CalibrationSize:
    if isinstance(size, CalibrationSize):
        return size
    if not isinstance(size, str) or size not in SIZES:
        raise ValueError(f"unknown calibration size {size!r}; choose one of {', '.join(SIZES)} "
                         f"(small: the test grid, under a minute on a 2-core CPU; cpu: a fuller CPU grid; "
                         f"gpu: Llama-8B-sized blocks, needs a GPU)")
    return SIZES[size]


# --------------------------------------------------------------------------- the test transformer


def _normal_source(seed: int, on_device: bool):
    """``normal(shape, dtype, scale)``: numpy's generator on a CPU (no per-shape compiles), jax.random on device."""
    import jax
    import jax.numpy as jnp

    if on_device:
        state = {"key": jax.random.key(seed)}

        def normal(shape, dtype, scale=1.0):
            state["key"], k = jax.random.split(state["key"])
            return (jax.random.normal(k, shape, jnp.float32) * scale).astype(dtype)
    else:
        rng = np.random.default_rng(seed)

        def normal(shape, dtype, scale=1.0):
            x = rng.standard_normal(shape, dtype=np.float32)
            x *= np.float32(scale)
            return jnp.asarray(x, dtype=dtype)
    return normal


def init_weights(model: ModelSpec, dtype, seed: int = 0, on_device: bool = False):
    """Random weights of ``model.layers`` stacked Llama blocks (a dict of ``[L, ...]`` arrays)."""
    import jax.numpy as jnp

    L, d, f = model.layers, model.hidden, model.ffn
    qd, kvd = model.q_heads * model.head_dim, model.kv_heads * model.head_dim
    normal = _normal_source(seed, on_device)
    return {
        "ln1": jnp.ones((L, d), dtype),
        "ln2": jnp.ones((L, d), dtype),
        "wqkv": normal((L, d, qd + 2 * kvd), dtype, d ** -0.5),
        "wo": normal((L, qd, d), dtype, qd ** -0.5),
        "w13": normal((L, d, 2 * f), dtype, d ** -0.5),
        "w2": normal((L, f, d), dtype, f ** -0.5),
    }


def build_chunk_fn(model: ModelSpec, dtype, kv_block: int, q_block: int, q_rows: int = 0):
    """A jitted ``f(weights, x, k_cache, v_cache, p) -> (y, (k_new, v_new))``: one chunk through all blocks.

    ``x`` is ``[B, c, hidden]``; the caches are ``[L, B, kv_heads, S_max, head_dim]`` (head-major, as paged
    KV caches are) with the first ``p`` positions valid (``p`` an int32 scalar, traced: one executable per
    input shape serves every prefix length); ``k_new``/``v_new`` are ``[L, B, kv_heads, c, head_dim]``, the
    chunk's entries for the cache.

    Attention, per KV head, treats the ``c x (q_heads / kv_heads)`` queries of the group as the rows of one
    matrix (token-major).  The prefix is read in ``kv_block``-token steps of a loop whose trip count is
    ``ceil(p / kv_block)``, with an online softmax in float32, for row tiles of ``q_rows`` rows (0: all rows
    at once); the chunk then attends to itself causally in query blocks of ``q_block`` tokens, each reading
    only the keys up to its own end.
    """
    import jax
    import jax.numpy as jnp

    if q_block <= 0 or kv_block <= 0 or q_rows < 0:
        raise ValueError("q_block and kv_block must be positive and q_rows >= 0")
    Hq, Hkv, hd = model.q_heads, model.kv_heads, model.head_dim
    g = Hq // Hkv
    f32 = jnp.promote_types(dtype, jnp.float32)  # softmax statistics, norms and RoPE: at least float32
    neg = jnp.asarray(-1e30, f32)
    half = hd // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) * 2.0 / hd))

    def rmsnorm(x, w):
        xf = x.astype(f32)
        return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(dtype) * w

    def rope(x, pos):  # x [B, c, H, hd], pos [c]
        ang = pos.astype(f32)[:, None] * jnp.asarray(inv_freq, f32)[None, :]
        cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
        x1, x2 = x[..., :half].astype(f32), x[..., half:].astype(f32)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(dtype)

    def update(state, q, kb, vb, mask):
        m, l, acc = state  # m, l: [B, Hkv, R]; acc: [B, Hkv, R, hd]; q [B, Hkv, R, hd]; kb, vb [B, Hkv, K, hd]
        s = jnp.einsum("bhrd,bhkd->bhrk", q, kb, preferred_element_type=f32)
        s = jnp.where(mask, s, neg)
        m_new = jnp.maximum(m, s.max(-1))
        alpha = jnp.exp(m - m_new)
        pr = jnp.exp(s - m_new[..., None])
        l = l * alpha + pr.sum(-1)
        pv = jnp.einsum("bhrk,bhkd->bhrd", pr.astype(dtype), vb, preferred_element_type=f32)
        return m_new, l, acc * alpha[..., None] + pv

    def attention(q, k, v, kc, vc, layer, p):
        # kc, vc: the whole [L, B, Hkv, S, hd] caches; only kv_block-token blocks of layer ``layer`` are read
        # (slicing a layer out first would make XLA copy all S_max positions of it on every call).
        # q [B, c, Hq, hd] -> rows (token, group member) per KV head: [B, Hkv, c*g, hd]
        B, c = q.shape[:2]
        R = c * g
        q = (q * jnp.asarray(hd ** -0.5, dtype)).reshape(B, c, Hkv, g, hd).transpose(0, 2, 1, 3, 4)
        q = q.reshape(B, Hkv, R, hd)
        kv_pos = jnp.arange(kv_block, dtype=jnp.int32)
        n_blocks = ((p + kv_block - 1) // kv_block).astype(jnp.int32)
        tile = R if q_rows == 0 else max(g, min(R, (q_rows // g) * g))
        states = []
        for lo in range(0, R, tile):  # prefix, one row tile at a time
            qt = q[:, :, lo:lo + tile]
            r = qt.shape[2]
            st0 = (jnp.full((B, Hkv, r), neg, f32), jnp.zeros((B, Hkv, r), f32), jnp.zeros((B, Hkv, r, hd), f32))

            def prefix_step(j, st, qt=qt):
                start = j * kv_block
                zero = jnp.zeros((), jnp.int32)
                at, size = (layer, zero, zero, start, zero), (1, B, Hkv, kv_block, hd)
                kb = jax.lax.dynamic_slice(kc, at, size)[0]
                vb = jax.lax.dynamic_slice(vc, at, size)[0]
                return update(st, qt, kb, vb, (start + kv_pos) < p)

            states.append(jax.lax.fori_loop(jnp.int32(0), n_blocks, prefix_step, st0))
        state = tuple(jnp.concatenate(parts, 2) for parts in zip(*states))
        qb = min(q_block, c)
        outs = []
        for i in range(-(-c // qb)):  # the chunk against itself, causal, each block up to its own end
            lo, hi = i * qb, min((i + 1) * qb, c)
            rows = slice(lo * g, hi * g)
            st = (state[0][:, :, rows], state[1][:, :, rows], state[2][:, :, rows])
            tok = lo + jnp.arange((hi - lo) * g, dtype=jnp.int32) // g
            mask = jnp.arange(hi, dtype=jnp.int32)[None, :] <= tok[:, None]
            _, l, acc = update(st, q[:, :, rows], k[:, :, :hi], v[:, :, :hi], mask)
            outs.append(acc / l[..., None])
        o = jnp.concatenate(outs, 2).reshape(B, Hkv, c, g, hd).transpose(0, 2, 1, 3, 4)
        return o.reshape(B, c, Hq * hd).astype(dtype)

    def block(x, w, kc, vc, layer, p):
        B, c, _ = x.shape
        h = rmsnorm(x, w["ln1"])
        q, k, v = jnp.split(h @ w["wqkv"], [Hq * hd, (Hq + Hkv) * hd], -1)
        pos = p + jnp.arange(c, dtype=jnp.int32)
        q = rope(q.reshape(B, c, Hq, hd), pos)
        k = rope(k.reshape(B, c, Hkv, hd), pos).transpose(0, 2, 1, 3)  # [B, Hkv, c, hd]
        v = v.reshape(B, c, Hkv, hd).transpose(0, 2, 1, 3)
        x = x + attention(q, k, v, kc, vc, layer, p) @ w["wo"]
        h = rmsnorm(x, w["ln2"])
        a, b = jnp.split(h @ w["w13"], 2, -1)
        x = x + (jax.nn.silu(a) * b) @ w["w2"]
        return x, (k, v)

    def chunk(weights, x, k_cache, v_cache, p):
        layers = jnp.arange(k_cache.shape[0], dtype=jnp.int32)
        return jax.lax.scan(lambda x, xs: block(x, xs[0], k_cache, v_cache, xs[1], p), x, (weights, layers))

    return jax.jit(chunk)


# --------------------------------------------------------------------------- clocks and device peaks

# XLA:CPU flags of the isolated measurement process: one thread for everything.
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


def _best_peaks(a: dict, b: dict) -> dict:
    return {**a, "matmul_flops": max(a["matmul_flops"], b["matmul_flops"]),
            "read_bandwidth": max(a["read_bandwidth"], b["read_bandwidth"])}


def nominal_hardware(device_kind: str, platform: str, dtype_bytes: float, measured: dict,
                     threads: str = "") -> tuple[HardwareSpec, str]:
    """HardwareSpec of the local device (one die, no links) and a sentence saying where its numbers come from."""
    kind = device_kind.lower()
    peak, bw, source = measured["matmul_flops"], measured["read_bandwidth"], None
    if platform == "gpu" and dtype_bytes == 2:
        for key, p_, b_, desc in _GPU_NOMINAL:
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


def _params(model: ModelSpec, hw: HardwareSpec):
    return ModelParams.from_spec(model, np.float64), HardwareParams.from_spec(hw, np.float64)


def with_fitted(hw: HardwareSpec, fitted: dict[str, float]) -> HardwareSpec:
    """``hw`` with the fitted efficiencies and layer overhead."""
    return dataclasses.replace(hw, **{k: float(fitted[k]) for k in FIT_NAMES})


def predict_chunk_times(model: ModelSpec, hw: HardwareSpec, c, p, b) -> np.ndarray:
    """Seconds for one chunk through all ``model.layers`` blocks: ``L x dense_layer_time`` (numpy, float64)."""
    mp, hp = _params(model, hw)
    c, p, b = (np.asarray(v, np.float64) for v in (c, p, b))
    return model.layers * np.asarray(dense_layer_time(mp, hp, c, p, b, xp=np), np.float64)


def roofline_binding(model: ModelSpec, hw: HardwareSpec, c, p, b) -> dict[str, np.ndarray]:
    """Which roofline branch binds at each point, found by perturbing the project's own cost function.

    ``gemm_compute[i]`` is True where the GEMM time depends on ``eff_gemm`` (so its compute branch binds;
    otherwise the memory branch does), likewise ``attention_compute`` for ``eff_attention``.
    """
    base = predict_chunk_times(model, hw, c, p, b)

    def moved(name):
        h = dataclasses.replace(hw, **{name: getattr(hw, name) * (1 - 1e-6)})
        return np.abs(predict_chunk_times(model, h, c, p, b) - base) > 1e-9 * base

    return {"gemm_compute": moved("eff_gemm"), "attention_compute": moved("eff_attention")}


def mape(pred, meas) -> float:
    """Mean absolute percentage error, in percent."""
    pred, meas = np.asarray(pred, np.float64), np.asarray(meas, np.float64)
    if pred.size == 0:
        return float("nan")
    return float(100.0 * np.mean(np.abs(pred - meas) / meas))


def fit_cost_model(model: ModelSpec, hw: HardwareSpec, c, p, b, t, *, eff_floor: float = 1e-4,
                   loss: str = "linear", f_scale: float = 0.1) -> dict[str, Any]:
    """Fit ``eff_gemm``, ``eff_attention``, ``eff_hbm`` in ``[eff_floor, 1]`` and ``layer_overhead_s >= 0``.

    Minimises the sum of squared ``log(predicted / measured)`` over the given points with
    ``scipy.optimize.least_squares`` (trust-region reflective, bounds), started from several points
    (the roofline ``max`` makes the objective piecewise smooth); the best end point wins.

    Returns ``{"fitted": {...}, "identified": {...}, "binding": {...}, "cost": ..., "starts": ...}``.
    ``identified[name]`` is False for an efficiency whose roofline branch binds on no point (its value is
    then the start value and only bounded by the data).
    """
    from scipy.optimize import least_squares

    c, p, b, t = (np.asarray(v, np.float64).ravel() for v in (c, p, b, t))
    if not (c.size == p.size == b.size == t.size) or c.size < len(FIT_NAMES):
        raise ValueError(f"need at least {len(FIT_NAMES)} points with matching c, p, b, t to fit the cost model")
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("measured times must be positive and finite")
    mp, hp0 = _params(model, hw)
    L = model.layers
    ovh_unit = max(float(np.min(t)) / L, 1e-9)  # overhead is fitted in units of the fastest point's per-layer time

    def hp_of(x):
        return dataclasses.replace(hp0, eff_gemm=np.float64(x[0]), eff_attention=np.float64(x[1]),
                                   eff_hbm=np.float64(x[2]), layer_overhead_s=np.float64(x[3] * ovh_unit))

    logt = np.log(t)

    def resid(x):
        pred = L * dense_layer_time(mp, hp_of(x), c, p, b, xp=np)
        return np.log(pred) - logt

    lo = np.array([eff_floor, eff_floor, eff_floor, 0.0])
    hi = np.array([1.0, 1.0, 1.0, 1.0])  # overhead can't exceed the fastest point's time
    best = None
    starts = [(g, a, h, o) for g in (0.05, 0.3, 0.9) for a in (0.02, 0.2, 0.9) for h in (0.2, 0.9) for o in (0.05, 0.5)]
    for x0 in starts:
        r = least_squares(resid, np.array(x0, np.float64), bounds=(lo, hi), method="trf", x_scale=1.0,
                          loss=loss, f_scale=f_scale, xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
        if best is None or r.cost < best.cost - 1e-15:
            best = r
    x = best.x
    fitted = {"eff_gemm": float(x[0]), "eff_attention": float(x[1]), "eff_hbm": float(x[2]),
              "layer_overhead_s": float(x[3] * ovh_unit)}
    # Standard errors from the Jacobian (free parameters only; None at a bound or when not estimable).
    std = dict.fromkeys(FIT_NAMES)
    free = best.active_mask == 0
    dof = c.size - int(free.sum())
    if dof > 0 and free.any():
        J = best.jac[:, free]
        s2 = 2 * best.cost / dof
        cov = s2 * np.linalg.pinv(J.T @ J)
        units = np.array([1.0, 1.0, 1.0, ovh_unit])[free]
        for name, v, u in zip(np.array(FIT_NAMES)[free], np.diag(cov), units):
            std[str(name)] = float(np.sqrt(v) * u) if np.isfinite(v) and v >= 0 else None
    bind = roofline_binding(model, with_fitted(hw, fitted), c, p, b)
    gemm_mem, att_mem = ~bind["gemm_compute"], ~bind["attention_compute"]
    binding = {"gemm_compute_bound": int(np.sum(~gemm_mem)), "gemm_memory_bound": int(np.sum(gemm_mem)),
               "attention_compute_bound": int(np.sum(~att_mem)), "attention_memory_bound": int(np.sum(att_mem))}
    identified = {"eff_gemm": bool(np.any(~gemm_mem)), "eff_attention": bool(np.any(~att_mem)),
                  "eff_hbm": bool(np.any(gemm_mem) or np.any(att_mem)), "layer_overhead_s": True}
    return {"fitted": fitted, "std_error": std, "identified": identified, "binding": binding, "cost": float(best.cost),
            "rms_log_error": float(np.sqrt(2 * best.cost / c.size)), "starts": len(starts)}


def _linear_features(c, p, b, scale_by_batch: bool):
    c, p, b = (np.asarray(v, np.float64).ravel() for v in (c, p, b))
    s = b if scale_by_batch else np.ones_like(b)
    return np.stack([np.ones_like(c), s * c, s * p, s * c * p], axis=1)


def fit_linear_baseline(c, p, b, t, scale_by_batch: bool = True) -> np.ndarray:
    """Coefficients ``(a, b1, b2, b3)`` of ``t = a + b1 c + b2 p + b3 c p`` (times ``B`` when ``scale_by_batch``).

    Relative-error weighted least squares (each row divided by its measured time), the same
    objective MAPE scores; ``lstsq`` handles rank deficiency (e.g. a single prefix length).
    """
    X = _linear_features(c, p, b, scale_by_batch)
    t = np.asarray(t, np.float64).ravel()
    scale = np.maximum(np.abs(X).max(axis=0), 1e-300)
    coef, *_ = np.linalg.lstsq((X / scale) / t[:, None], np.ones_like(t), rcond=None)
    return coef / scale


def predict_linear_baseline(coef, c, p, b, scale_by_batch: bool = True) -> np.ndarray:
    return _linear_features(c, p, b, scale_by_batch) @ np.asarray(coef, np.float64)


def split_cells(n: int, test_fraction: float, seed: int) -> np.ndarray:
    """Boolean ``is_test[n]``: a seeded random choice of ``round(test_fraction n)`` held-out cells."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    n_test = min(max(int(round(test_fraction * n)), 1), n - len(FIT_NAMES))
    if n_test < 1:
        raise ValueError(f"a grid of {n} cells is too small to hold out cells and fit {len(FIT_NAMES)} parameters")
    rng = np.random.default_rng(seed)
    is_test = np.zeros(n, bool)
    is_test[rng.choice(n, size=n_test, replace=False)] = True
    return is_test


# --------------------------------------------------------------------------- measurement


_PRECALL_BELOW_S = 0.05  # cells faster than this get an untimed call before each sample


def _measure(cfg: CalibrationSize, seed: int, clock: str, threads: str, log=None) -> dict[str, Any]:
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
    normal = _normal_source(seed + 1, accelerator)
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
        precall[cell] = dt < _PRECALL_BELOW_S

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
    peaks = _best_peaks(peaks, measure_device_peaks(dtype, accelerator, clock))  # best of before and after
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


def _measure_isolated(cfg: CalibrationSize, seed: int, log=None) -> dict[str, Any]:
    """Run :func:`_measure` in a fresh single-threaded XLA:CPU process timed by its CPU clock."""
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

    res = _measure(cfg, int(payload["seed"]), payload["clock"], payload["threads"], log)
    Path(payload["out"]).write_text(json.dumps(res))
    return 0


# --------------------------------------------------------------------------- public entry points


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def run_calibration(size: str = "cpu", seed: int = 0, json_path=None, figure_path=None, *,
                    test_fraction: float | None = None, isolate: bool | None = None, log=None) -> dict:
    """Measure chunked prefill on the local device, fit the §4 cost model, score it on held-out cells.

    Args:
      size: ``"small"`` (the test grid: under a minute on a 2-core CPU, compile included),
        ``"cpu"`` (a fuller CPU grid, a few minutes) or ``"gpu"`` (Llama-8B-sized blocks in bf16,
        c up to 4096, p up to 32K; refuses to run without an accelerator).  A
        :class:`CalibrationSize` is accepted too.
      seed: seeds the weights, the caches, the round order and the train/test split.
      json_path, figure_path: where to write the JSON report and the predicted-vs-measured plot
        (nothing is written for ``None``).
      test_fraction: share of grid cells held out (default 0.4).
      isolate: on a CPU backend (the default there), measure in a fresh process whose XLA:CPU runs
        single-threaded, timed by that process's CPU clock: latency on one dedicated core, which other
        processes sharing the machine barely disturb.  ``False`` measures in this process, with its XLA
        threading, by wall clock (always the case on a GPU/TPU).
      log: optional ``callable(str)`` for progress lines.

    Returns a JSON-able dict with at least ``calibration_mape`` (held-out MAPE of the cost model, %),
    ``baseline_linear_mape``, ``fitted``, ``points``, ``device``, ``grid``, ``wall_s``, and the per-cell
    ``records`` (c, p, B, measured and predicted seconds, split).

    Raises:
      ValueError: unknown size, bad seed or test fraction, or the gpu size without an accelerator.
    """
    cfg = _check_size(size)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    if test_fraction is not None:
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
            raise ValueError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
        cfg = dataclasses.replace(cfg, test_fraction=float(test_fraction))
    n_cells = len(cfg.chunks) * len(cfg.prefixes) * len(cfg.batches)
    split_cells(n_cells, cfg.test_fraction, seed)  # validates the split before anything runs
    t_wall = time.perf_counter()

    import jax

    backend = jax.default_backend()
    if cfg.needs_accelerator and backend == "cpu":
        raise ValueError(f"calibration size {cfg.name!r} needs a GPU/TPU (JAX's default backend here is cpu); "
                         f"use --size cpu or --size small on a CPU")
    if isolate is None:
        isolate = backend == "cpu"
    if isolate and backend != "cpu":
        raise ValueError("isolate=True measures a single-threaded CPU process; it is only for a CPU backend")
    if isolate:
        meas = _measure_isolated(cfg, seed, log)
    else:
        threads = "XLA default threading, this process" if backend == "cpu" else "accelerator"
        meas = _measure(cfg, seed, "wall", threads, log)

    dtype_bytes = float(np.dtype(jax.numpy.dtype(cfg.dtype)).itemsize)
    hw, hw_source = nominal_hardware(meas["device_kind"], meas["platform"], dtype_bytes, meas["peaks"],
                                     meas["threads"])
    c, p, b, t = (np.asarray(meas[k], np.float64) for k in ("c", "p", "b", "t"))
    is_test = split_cells(len(t), cfg.test_fraction, seed)
    tr = ~is_test

    fit = fit_cost_model(cfg.model, hw, c[tr], p[tr], b[tr], t[tr])
    hw_fit = with_fitted(hw, fit["fitted"])
    pred = predict_chunk_times(cfg.model, hw_fit, c, p, b)
    coef = fit_linear_baseline(c[tr], p[tr], b[tr], t[tr], scale_by_batch=True)
    base = predict_linear_baseline(coef, c, p, b, scale_by_batch=True)
    coef_u = fit_linear_baseline(c[tr], p[tr], b[tr], t[tr], scale_by_batch=False)
    base_u = predict_linear_baseline(coef_u, c, p, b, scale_by_batch=False)
    rel = (pred - t) / t

    records = [{"c": int(c[i]), "p": int(p[i]), "batch": int(b[i]), "split": "test" if is_test[i] else "train",
                "measured_s": float(t[i]), "measured_min_s": float(meas["t_min"][i]),
                "measured_wall_s": float(meas["t_wall"][i]), "spread_iqr_rel": float(meas["spread"][i]),
                "calls_per_sample": int(meas["n_inner"][i]), "predicted_s": float(pred[i]),
                "baseline_linear_s": float(base[i]), "error_pct": float(100 * rel[i])} for i in range(len(t))]
    clock_desc = ("process CPU time (single-threaded process: the latency on a dedicated core)"
                  if meas["clock"] == "cpu" else "wall clock")
    report = {
        "calibration_mape": mape(pred[is_test], t[is_test]),
        "train_mape": mape(pred[tr], t[tr]),
        "max_abs_test_error_pct": float(100 * np.max(np.abs(rel[is_test]))),
        "baseline_linear_mape": mape(base[is_test], t[is_test]),
        "baseline_linear_train_mape": mape(base[tr], t[tr]),
        "baseline_linear_unscaled_mape": mape(base_u[is_test], t[is_test]),
        "baseline_linear": {
            "model": "t = a + b1*(B*c) + b2*(B*p) + b3*(B*c*p); relative-error weighted least squares on the "
                     "training cells",
            "coefficients": coef.tolist(),
            "unscaled_model": "t = a + b1*c + b2*p + b3*c*p (ignores B)", "unscaled_coefficients": coef_u.tolist()},
        "fitted": fit["fitted"],
        "fitted_std_error": fit["std_error"],
        "identified": fit["identified"],
        "binding_train": fit["binding"],
        "fit_rms_log_error": fit["rms_log_error"],
        "points": {"train": int(tr.sum()), "test": int(is_test.sum()), "total": int(len(t)),
                   "split": f"seeded random {1 - cfg.test_fraction:.0%}/{cfg.test_fraction:.0%} of grid cells "
                            f"(seed {seed})"},
        "device": meas["device_kind"],
        "device_info": {"platform": meas["platform"], "device_kind": meas["device_kind"],
                        "local_devices": meas["local_devices"], "jax_version": meas["jax_version"],
                        "execution": meas["threads"]},
        "size": cfg.name,
        "seed": seed,
        "dtype": meas["dtype"],
        "grid": {"chunk_sizes": list(cfg.chunks), "prefix_lengths": list(cfg.prefixes),
                 "batch_sizes": list(cfg.batches), "cells": int(len(t))},
        "model": cfg.model.to_dict(),
        "hardware_nominal": hw.to_dict(),
        "hardware_fitted": hw_fit.to_dict(),
        "nominal_source": hw_source,
        "device_peaks_measured": meas["peaks"],
        "measurement": {"clock": meas["clock"], "clock_description": clock_desc, "rounds": meas["rounds"],
                        "warmup": (f"two untimed calls per cell after compile; each sample of a cell faster than "
                                   f"{_PRECALL_BELOW_S * 1e3:.0f} ms starts with one more untimed call"),
                        "statistic": "median over interleaved rounds of the mean of back-to-back synchronous calls",
                        "min_sample_s": cfg.min_sample_s, "kv_block": cfg.kv_block, "q_block": cfg.q_block,
                        "kv_cache_tokens": meas["kv_cache_tokens"],
                        "median_spread_iqr_rel": float(np.median(meas["spread"])),
                        "clock_to_wall": meas["clock_to_wall"],
                        "compile_s": meas["compile_s"], "measure_s": meas["measure_s"]},
        "predicted": "layers x mocap_jax.costs.dense_layer_time(ModelParams, HardwareParams, c, p, B, xp=numpy) "
                     "(float64); no embedding / LM head / hand-off",
        "records": records,
    }
    report["wall_s"] = time.perf_counter() - t_wall
    report = _jsonable(report)
    if json_path is not None:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        report["json_path"] = str(path)
    if figure_path is not None:
        report["figure_path"] = str(plot_calibration(report, figure_path))
    return report


def plot_calibration(report: dict, path) -> Path:
    """Predicted vs measured per-chunk latency (log-log): train and held-out cells, the linear baseline on the
    held-out cells, y = x and a +-15 % band; fitted parameters and MAPEs in the legend."""
    from matplotlib.figure import Figure

    recs = report["records"]
    meas = np.array([r["measured_s"] for r in recs]) * 1e3
    pred = np.array([r["predicted_s"] for r in recs]) * 1e3
    base = np.array([r["baseline_linear_s"] for r in recs]) * 1e3
    test = np.array([r["split"] == "test" for r in recs])

    fig = Figure(figsize=(7.0, 6.4), layout="constrained")
    ax = fig.add_subplot()
    lo = min(meas.min(), pred.min(), base[test].min() if test.any() else np.inf) / 1.4
    hi = max(meas.max(), pred.max()) * 1.4
    lo = max(lo, hi * 1e-6)
    ax.plot([lo, hi], [lo, hi], color="0.25", lw=1, ls="--", label="y = x")
    ax.plot([lo, hi], [lo * 1.15, hi * 1.15], color="0.6", lw=0.8, ls=":", label="±15 %")
    ax.plot([lo, hi], [lo * 0.85, hi * 0.85], color="0.6", lw=0.8, ls=":")
    f = report["fitted"]
    ident = report.get("identified", {})
    ax.scatter(meas[~test], pred[~test], marker="o", s=30, facecolors="none", edgecolors="tab:blue",
               label=f"cost model, train ({int((~test).sum())} cells, MAPE {report['train_mape']:.1f} %)")
    ax.scatter(meas[test], pred[test], marker="^", s=42, color="tab:orange", edgecolors="k", linewidths=0.4,
               label=f"cost model, held out ({int(test.sum())} cells, MAPE {report['calibration_mape']:.1f} %)")
    ax.scatter(meas[test], base[test], marker="x", s=24, color="tab:red", alpha=0.7,
               label=f"linear baseline, held out (MAPE {report['baseline_linear_mape']:.1f} %)")
    hbm_note = "" if ident.get("eff_hbm", True) else " (not identified)"
    ax.plot([], [], " ", label=(f"fitted: eff_gemm {f['eff_gemm']:.3f}, eff_attention {f['eff_attention']:.3f},\n"
                                f"eff_hbm {f['eff_hbm']:.3f}{hbm_note}, "
                                f"overhead {f['layer_overhead_s'] * 1e6:.0f} µs/layer"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured per-chunk latency (ms)")
    ax.set_ylabel("predicted per-chunk latency (ms)")
    m = report["model"]
    hw = report["hardware_nominal"]
    clock = report.get("measurement", {}).get("clock", "wall")
    ax.set_title(f"§4 cost model vs measured chunked prefill: {report['device']} ({report['dtype']}, "
                 f"{'CPU-time clock, 1 thread' if clock == 'cpu' else 'wall clock'}), size {report['size']}\n"
                 f"{m['layers']} layers, hidden {m['hidden']}, GQA {m['q_heads']}/{m['kv_heads']}x{m['head_dim']}; "
                 f"nominal {hw['peak_flops'] / 1e9:.0f} GFLOP/s, {hw['hbm_bandwidth'] / 1e9:.0f} GB/s; "
                 f"c {min(report['grid']['chunk_sizes'])}-{max(report['grid']['chunk_sizes'])}, "
                 f"p {min(report['grid']['prefix_lengths'])}-{max(report['grid']['prefix_lengths'])}, "
                 f"B {min(report['grid']['batch_sizes'])}-{max(report['grid']['batch_sizes'])}",
                 fontsize=8.5)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left", fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    return path


__all__ = [
    "CalibrationSize", "SIZES", "run_calibration", "plot_calibration", "fit_cost_model", "fit_linear_baseline",
    "predict_linear_baseline", "predict_chunk_times", "roofline_binding", "mape", "split_cells", "nominal_hardware",
    "measure_device_peaks", "build_chunk_fn", "init_weights", "with_fitted",
]


if __name__ == "__main__":  # the isolated measurement process (see _measure_isolated)
    import sys

    if sys.argv[1:] != ["--worker"]:
        sys.exit("usage: python -m mocap_jax.validation.calibrate --worker  (internal; use `mocap-jax calibrate`)")
    sys.exit(_worker_main())
