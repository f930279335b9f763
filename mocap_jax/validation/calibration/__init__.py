"""Calibration of the roofline cost model (docs/cost_model.md) against real execution.

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
pairs, close to the cost model's ``B c (p + (c+1)/2)``.  Its output equals a plain dense
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

from .fit import (fit_cost_model, fit_linear_baseline, mape, predict_chunk_times, predict_linear_baseline,
                  roofline_binding, split_cells, with_fitted)
from .measure import measure_device_peaks, nominal_hardware
from .report import plot_calibration, run_calibration
from .sizes import SIZES, CalibrationSize
from .transformer import build_chunk_fn, init_weights

__all__ = [
    "CalibrationSize", "SIZES", "run_calibration", "plot_calibration", "fit_cost_model", "fit_linear_baseline",
    "predict_linear_baseline", "predict_chunk_times", "roofline_binding", "mape", "split_cells", "nominal_hardware",
    "measure_device_peaks", "build_chunk_fn", "init_weights", "with_fitted",
]
