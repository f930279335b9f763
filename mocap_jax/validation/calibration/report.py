"""``run_calibration``: measure, fit, score on held-out cells, write the report and its figure."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np

from ...specs.files import write_atomic

from .fit import (fit_cost_model, fit_linear_baseline, mape, predict_chunk_times, predict_linear_baseline, split_cells,
                  with_fitted)
from .measure import PRECALL_BELOW_S, measure, measure_isolated, nominal_hardware
from .sizes import check_size



def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def run_calibration(size: str = "cpu", seed: int = 0, json_path=None, figure_path=None, *,
                    test_fraction: float | None = None, isolate: bool | None = None, log=None) -> dict:
    """Measure chunked prefill on the local device, fit the roofline cost model, score it on held-out cells.

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
    cfg = check_size(size)
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
        meas = measure_isolated(cfg, seed, log)
    else:
        threads = "XLA default threading, this process" if backend == "cpu" else "accelerator"
        meas = measure(cfg, seed, "wall", threads, log)

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
                                   f"{PRECALL_BELOW_S * 1e3:.0f} ms starts with one more untimed call"),
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
    report = jsonable(report)
    if json_path is not None:
        path = write_atomic(json_path, json.dumps(report, indent=2) + "\n")
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
    ax.set_title(f"cost model vs measured chunked prefill: {report['device']} ({report['dtype']}, "
                 f"{'CPU-time clock, 1 thread' if clock == 'cpu' else 'wall clock'}), size {report['size']}\n"
                 f"{m['layers']} layers, hidden {m['hidden']}, GQA {m['q_heads']}/{m['kv_heads']}x{m['head_dim']}; "
                 f"nominal {hw['peak_flops'] / 1e9:.0f} GFLOP/s, {hw['hbm_bandwidth'] / 1e9:.0f} GB/s; "
                 f"c {min(report['grid']['chunk_sizes'])}-{max(report['grid']['chunk_sizes'])}, "
                 f"p {min(report['grid']['prefix_lengths'])}-{max(report['grid']['prefix_lengths'])}, "
                 f"B {min(report['grid']['batch_sizes'])}-{max(report['grid']['batch_sizes'])}",
                 fontsize=8.5)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left", fontsize=8)
    from ...figures.style import save

    return Path(save(fig, path, tight_layout=False))
