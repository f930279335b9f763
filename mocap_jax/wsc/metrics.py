"""Serving metrics of a simulated design point: per-request latencies and aggregates.

TTFT, TPOT and E2E per request (:func:`request_metrics`), and their mean / p50 / p99,
throughput, tokens/s, SLO attainment, goodput and DRAM utilisation (:func:`aggregate_metrics`).
Both simulators report through these functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..specs import SpecError
from .setup import ServingSetup
from .traces import Trace


@dataclass
class RequestMetrics:
    """Per-request latencies (``[N]``, seconds; nan when the request never finished).

    ``ttft`` = first token - arrival; ``e2e`` = last token - arrival; ``tpot`` =
    (e2e - ttft) / (output - 1), nan for one-token outputs.
    """

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    finished: np.ndarray
    dropped: np.ndarray


def request_metrics(trace: Trace, ttft_t, finish_t, dropped) -> RequestMetrics:
    a = trace.arrival_s
    o = trace.output_tokens.astype(float)
    ttft_t = np.asarray(ttft_t, float)
    finish_t = np.asarray(finish_t, float)
    finished = np.isfinite(finish_t)
    ttft = np.where(np.isfinite(ttft_t), ttft_t - a, np.nan)
    e2e = np.where(finished, finish_t - a, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(finished & (o > 1), (finish_t - ttft_t) / np.maximum(o - 1, 1), np.nan)
    return RequestMetrics(ttft=ttft, tpot=tpot, e2e=e2e, finished=finished, dropped=np.asarray(dropped, bool))


def _stats(x: np.ndarray, prefix: str) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {f"{prefix}_mean_s": math.inf, f"{prefix}_p50_s": math.inf, f"{prefix}_p99_s": math.inf}
    return {f"{prefix}_mean_s": float(x.mean()), f"{prefix}_p50_s": float(np.percentile(x, 50)),
            f"{prefix}_p99_s": float(np.percentile(x, 99))}


def aggregate_metrics(trace: Trace, rm: RequestMetrics, setup: ServingSetup, kv_area: float, kv_peak: float,
                      end_s: float) -> dict[str, Any]:
    """Aggregate serving metrics of one design point.

    Returns a dict with ``ttft_*_s``, ``tpot_*_s``, ``e2e_*_s`` (mean / p50 / p99, s),
    ``finished``, ``dropped``, ``makespan_s`` (last finish - first arrival; inf if none finished),
    ``throughput_rps``, ``tokens_per_s`` (output tokens of finished requests),
    ``slo_attainment`` (share of the N requests meeting both the TTFT and the TPOT SLO),
    ``goodput_rps`` (offered rate x SLO attainment: requests/s served within the SLOs),
    ``dram_util_mean`` / ``dram_util_peak`` (resident + KV over physical DRAM, whole wafer) and
    ``offered_rps``.
    """
    cfg = setup.config
    n = len(trace)
    fin = rm.finished
    out = {"requests": n, "finished": int(fin.sum()), "dropped": int(rm.dropped.sum()),
           "offered_rps": trace.rate}
    out.update(_stats(rm.ttft, "ttft"))
    out.update(_stats(rm.tpot, "tpot"))
    out.update(_stats(rm.e2e, "e2e"))
    # with no request finished the last finish never comes: the makespan is infinite, like the latencies
    last = float(np.max(np.where(fin, trace.arrival_s + np.nan_to_num(rm.e2e, nan=0.0), -np.inf))) if fin.any() \
        else math.inf
    makespan = last - float(trace.arrival_s[0])
    ok_tpot = np.where(np.isnan(rm.tpot), True, rm.tpot <= cfg.tpot_slo_s)
    good = fin & (rm.ttft <= cfg.ttft_slo_s) & ok_tpot
    out["makespan_s"] = makespan
    pos = makespan > 0
    out["throughput_rps"] = float(fin.sum() / makespan) if pos else 0.0
    out["tokens_per_s"] = float(trace.output_tokens[fin].sum() / makespan) if pos else 0.0
    out["slo_attainment"] = float(good.sum() / n)
    out["goodput_rps"] = out["slo_attainment"] * trace.rate if math.isfinite(trace.rate) else 0.0
    cap = float(np.sum(setup.capacity))
    res = float(np.sum(setup.resident))
    span = float(end_s - trace.arrival_s[0])
    out["dram_util_mean"] = (res + (kv_area / span if span > 0 else 0.0)) / cap
    out["dram_util_peak"] = (res + kv_peak) / cap
    return out


#: Both simulators keep one absolute clock, so every step they add rounds to the clock's spacing at
#: that time.  A run is trusted when the spacing at its last event is at most this share of the
#: shortest latency it reports (the median TPOT, or the median TTFT).  Measured against float64, the
#: clock's error stays at float32's own floor (about 1e-3 in TTFT, TPOT and E2E) up to this share and
#: grows about linearly beyond it (5e-3 at 0.47, 2-6% at 3.8); docs/wsc_llm.md has the numbers.
CLOCK_RESOLUTION = 0.1


def check_clock(trace: Trace, metrics: dict[str, Any], dtype, label: str) -> None:
    """Refuse a run whose float clock is too coarse for the latencies it reports (see :data:`CLOCK_RESOLUTION`)."""
    names = {"tpot_p50_s": "time per output token", "ttft_p50_s": "time to first token"}
    reported = [(metrics[k], names[k]) for k in names if math.isfinite(metrics[k])]
    if not reported:
        return
    shortest, name = min(reported)
    end = float(trace.arrival_s[-1])
    if math.isfinite(metrics["makespan_s"]):
        end = max(end, float(trace.arrival_s[0]) + metrics["makespan_s"])
    dtype = np.dtype(dtype)
    spacing = float(np.spacing(np.abs(np.asarray(end, dtype))))
    if spacing > CLOCK_RESOLUTION * shortest:
        # so coarse a clock may even make a latency negative: then that is what the message says
        what = (f"too coarse for its median {name} of {shortest * 1e3:.3g} ms, which the clock must resolve to "
                f"{CLOCK_RESOLUTION:.0%}" if shortest > 0 else
                f"too coarse to measure its latencies (its median {name} comes out as {shortest * 1e3:.3g} ms)")
        raise SpecError(
            f"{label}: {len(trace)} requests at {trace.rate:.3g} req/s run to t = {end:.4g} s, where {dtype} "
            f"resolves time only to {spacing:.3g} s, {what}; use float64 (--dtype float64 on the command line), "
            f"a higher rate or fewer requests")


@dataclass
class ServingResult:
    """Outcome of one design point: set-up, trace, per-request and aggregate metrics."""

    setup: ServingSetup
    trace: Trace
    metrics: dict[str, Any]
    requests: RequestMetrics | None = None
    raw: dict[str, np.ndarray] | None = None

    def row(self) -> dict[str, Any]:
        d = self.setup.describe()
        d.update(workload=self.trace.name, offered_rps=self.trace.rate)
        d.update(self.metrics)
        return d


def infeasible_metrics(trace: Trace) -> dict[str, Any]:
    """Metrics row of a design point that cannot serve the model (infinite latency, zero throughput)."""
    out = {"requests": len(trace), "finished": 0, "dropped": 0, "offered_rps": trace.rate}
    for k in ("ttft", "tpot", "e2e"):
        out.update({f"{k}_mean_s": math.inf, f"{k}_p50_s": math.inf, f"{k}_p99_s": math.inf})
    # nothing is placed, so DRAM holds nothing of the model; its use is not defined (an empty cell, JSON null)
    out.update(makespan_s=math.inf, throughput_rps=0.0, tokens_per_s=0.0, goodput_rps=0.0, slo_attainment=0.0,
               dram_util_mean=None, dram_util_peak=None)
    return out


def agreement(array_result: ServingResult, ref: ServingResult) -> dict[str, Any]:
    """Relative error of one simulation against another, e.g. the array program against the reference.

    Returns:
      ``{ttft,tpot,e2e}_{mean,max}_rel_err`` over requests finished by both,
      ``same_finished`` (identical sets of finished / dropped requests), the largest relative
      difference of the aggregate metrics (``aggregate_max_rel_err``) and of SLO goodput
      (``goodput_rel_err``).
    """
    a, b = array_result.requests, ref.requests
    out: dict[str, Any] = {"same_finished": bool(np.array_equal(a.finished, b.finished)
                                                 and np.array_equal(a.dropped, b.dropped))}
    both = a.finished & b.finished
    for k in ("ttft", "tpot", "e2e"):
        x, y = getattr(a, k)[both], getattr(b, k)[both]
        ok = np.isfinite(x) & np.isfinite(y)
        rel = np.abs(x[ok] - y[ok]) / np.maximum(np.abs(y[ok]), 1e-12)
        out[f"{k}_mean_rel_err"] = float(rel.mean()) if rel.size else 0.0
        out[f"{k}_max_rel_err"] = float(rel.max()) if rel.size else 0.0
    worst = 0.0
    for k in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s", "e2e_p99_s", "tokens_per_s", "dram_util_mean"):
        x, y = array_result.metrics[k], ref.metrics[k]
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
            worst = max(worst, abs(x - y) / max(abs(y), 1e-12))
    out["aggregate_max_rel_err"] = worst
    ga, gb = array_result.metrics["goodput_rps"], ref.metrics["goodput_rps"]
    out["goodput_rel_err"] = abs(ga - gb) / max(abs(gb), 1e-12)
    return out


__all__ = ["CLOCK_RESOLUTION", "check_clock", "RequestMetrics", "request_metrics", "aggregate_metrics",
           "ServingResult", "infeasible_metrics", "agreement"]
