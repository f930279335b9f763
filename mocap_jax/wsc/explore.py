"""Hardware design-space exploration for WSC-LLM serving (DESIGN §10).

The wafer template trades DRAM per die against D2D bandwidth: a die's shoreline is shared
by its DRAM interface and its die-to-die links.  :func:`template_points` builds the
hardware points -- DRAM capacity per die (32-96 GB) with its bandwidth (by default
1 TB/s per 32 GB, the ratio of the published points 64 GB / 2 TB/s and 96 GB / 3 TB/s),
against D2D bandwidth (1.5-2.5 TB/s), for one or more die grids.

:func:`explore` crosses them with models, workloads and request rates.  Every point gets
the WSC-LLM central scheduler's decisions for its hardware (partition, decode-centred
placement, greedy KV memory scheduler; :func:`mocap_jax.wsc.serving.build_setup`), then
all points are simulated by :func:`mocap_jax.wsc.serving.simulate` as one batched run:
points are grouped by static structure (die count), each group one compiled
``jit(vmap(scan))`` program.  Request rates are common to all hardware points of a
(model, workload): ``load x`` the partition capacity of the reference design
(``wsc-llm-64g``), and every hardware point sees the same synthetic trace (common random
numbers).

**Best design.**  Per (model, workload) a point's score is its goodput (requests meeting
the TTFT and TPOT SLOs per second) summed over the swept rates; per workload the best
hardware point maximises the geometric mean over models of the score normalised by the
best score of that model (ties: lower mean E2E latency).  Points that cannot serve a model
score 0 for it (and are ranked last when any model cannot be served).
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from ..specs import SpecError, get_model
from . import serving as sv
from .hardware import WaferSpec, wsc_wafer
from .workload import WORKLOAD_PRESETS, resolve_workload_name, synthetic_trace

DEFAULT_MODELS = ("llama2-7b", "llama3-70b", "llama3.1-405b")
DEFAULT_WORKLOADS = ("azure-code", "azure-conv")
DEFAULT_LOADS = (0.5, 0.8, 1.1)
DEFAULT_DRAM_GB = (32.0, 48.0, 64.0, 80.0, 96.0)
DEFAULT_D2D_TBPS = (1.5, 2.0, 2.5)
DEFAULT_GRIDS = ((6, 9), (5, 8))
REFERENCE_HARDWARE = "wsc-llm-64g"


@dataclass(frozen=True)
class HardwarePoint:
    """One point of the hardware template.

    Attributes:
      rows, cols: die grid.
      dram_gb: DRAM capacity per die, GB.  dram_tbps: DRAM bandwidth per die, TB/s.
      d2d_tbps: D2D bandwidth per link per direction, TB/s.
    """

    rows: int
    cols: int
    dram_gb: float
    dram_tbps: float
    d2d_tbps: float

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.cols} {self.dram_gb:g}GB {self.dram_tbps:g}TB/s D2D {self.d2d_tbps:g}TB/s"

    def spec(self) -> WaferSpec:
        return wsc_wafer(self.rows, self.cols, self.dram_gb, self.dram_tbps, self.d2d_tbps)

    @property
    def on_shoreline(self) -> bool:
        """On the template's trade-off line ``D2D = 3 - DRAM bandwidth / 2`` (TB/s).

        The line through the published points (2 TB/s DRAM with 2 TB/s D2D, 3 with 1.5)
        and the 1 TB/s / 2.5 TB/s corner: a die's shoreline buys DRAM or D2D bandwidth.
        """
        return abs(self.d2d_tbps + self.dram_tbps / 2.0 - 3.0) < 1e-9

    def as_dict(self) -> dict[str, Any]:
        return {"grid": f"{self.rows}x{self.cols}", "dies": self.rows * self.cols, "dram_gb": self.dram_gb,
                "dram_tbps": self.dram_tbps, "d2d_tbps": self.d2d_tbps, "shoreline": self.on_shoreline}


def _positive_list(name: str, values) -> tuple[float, ...]:
    vals = tuple(float(v) for v in values)
    if not vals:
        raise SpecError(f"{name}: give at least one value")
    for v in vals:
        if not math.isfinite(v) or v <= 0:
            raise SpecError(f"{name} must be positive numbers, got {v:g}")
    return vals


def template_points(grids: Sequence[tuple[int, int]] = DEFAULT_GRIDS, dram_gb: Sequence[float] = DEFAULT_DRAM_GB,
                    d2d_tbps: Sequence[float] = DEFAULT_D2D_TBPS,
                    dram_tbps: Sequence[float] | None = None) -> list[HardwarePoint]:
    """Hardware points: grids x DRAM (capacity, bandwidth) x D2D bandwidth.

    Args:
      grids: die grids ``(rows, cols)``.
      dram_gb: DRAM capacities per die, GB.
      d2d_tbps: D2D bandwidths, TB/s.
      dram_tbps: DRAM bandwidths, TB/s, crossed with the capacities; default ``None``
        ties each capacity to ``capacity / 32`` TB/s (the template's ratio).

    Raises:
      SpecError: empty or non-positive values.
    """
    dram_gb = _positive_list("dram_gb", dram_gb)
    d2d_tbps = _positive_list("d2d_tbps", d2d_tbps)
    if dram_tbps is not None:
        dram_tbps = _positive_list("dram_tbps", dram_tbps)
    grids = tuple(grids)
    if not grids:
        raise SpecError("grids: give at least one die grid")
    for g in grids:
        if len(g) != 2 or any(not isinstance(x, int) or x < 1 for x in g):
            raise SpecError(f"grids must be pairs of positive integers (rows, cols), got {g!r}")
    mem = [(c, c / 32.0) for c in dram_gb] if dram_tbps is None else [(c, b) for c in dram_gb for b in dram_tbps]
    return [HardwarePoint(r, c, cap, bw, d2d) for (r, c) in grids for cap, bw in mem for d2d in d2d_tbps]


def parse_grids(text: str) -> tuple[tuple[int, int], ...]:
    """``"6x9,5x8"`` -> ``((6, 9), (5, 8))``."""
    out = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        try:
            r, c = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise SpecError(f"die grids are given as RxC, e.g. 6x9,5x8; got {part!r}") from None
        if r < 1 or c < 1:
            raise SpecError(f"die grid {part!r}: rows and cols must be positive")
        out.append((r, c))
    if not out:
        raise SpecError("give at least one die grid, e.g. 6x9")
    return tuple(out)


@dataclass
class ExploreResult:
    """Rows of every simulated point, the best designs and timings.

    Attributes:
      rows: one dict per (hardware, model, workload, load): hardware fields, partition
        summary and serving metrics (see :func:`mocap_jax.wsc.serving.aggregate_metrics`).
      best: per workload, the best hardware point and its per-model scores.
      best_per_model: per (workload, model), the best hardware point.
      rates: ``{(model, workload): [rate per load]}``, requests/s.
      timing: wall seconds of set-up, simulation (and its compile share), groups,
        simulated requests and requests per wall-second.
    """

    rows: list[dict[str, Any]]
    best: list[dict[str, Any]]
    best_per_model: list[dict[str, Any]]
    rates: dict[tuple[str, str], list[float]]
    timing: dict[str, Any] = field(default_factory=dict)

    def write_csv(self, path: "str | Path") -> Path:
        return write_rows(self.rows, path)


def write_rows(rows: Sequence[dict[str, Any]], path: "str | Path") -> Path:
    """Write dict rows as CSV (union of keys, in first-seen order)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})
    return path


def reference_rates(models: Sequence[str], workloads: Sequence[str], loads: Sequence[float],
                    config: sv.ServingConfig, fallback: Sequence[WaferSpec] = ()) -> dict[tuple[str, str], list[float]]:
    """Offered rates per (model, workload): ``load x`` the reference design's partition capacity.

    The reference is ``wsc-llm-64g``; when the model does not fit it, the largest capacity
    among ``fallback`` hardware is used.

    Raises:
      SpecError: the model fits none of them.
    """
    out = {}
    for m in models:
        for w in workloads:
            wl = WORKLOAD_PRESETS[w]
            cap = sv.build_setup(m, REFERENCE_HARDWARE, wl, "wsc", config=config).served_rps
            if not cap > 0:
                caps = [sv.build_setup(m, h, wl, "wsc", config=config).served_rps for h in fallback]
                cap = max(caps, default=0.0)
            if not cap > 0:
                raise SpecError(f"model {m} fits none of the explored hardware points; drop it or add larger DRAM")
            out[(m, w)] = [float(l) * cap for l in loads]
    return out


def explore(models: Sequence[str] = DEFAULT_MODELS, workloads: Sequence[str] = DEFAULT_WORKLOADS,
            loads: Sequence[float] = DEFAULT_LOADS, hardware: Sequence[HardwarePoint] | None = None,
            requests: int | None = None, window_s: float = 20.0, min_requests: int = 64,
            max_requests: int = 3000, config: sv.ServingConfig | None = None, seed: int = 0,
            dtype=jnp.float32, batch_size: int | None = None) -> ExploreResult:
    """Sweep hardware x models x workloads x request rates as one batched serving run.

    Args:
      models: model presets.
      workloads: workload presets (synthetic traces fitted to the Azure traces).
      loads: request rates as multiples of the reference design's capacity per (model, workload).
      hardware: hardware points (default :func:`template_points` with its defaults).
      requests: requests per simulated point; default ``None`` sizes each (model, workload,
        load) to cover ``window_s`` seconds of arrivals, rounded up to one of three size
        classes (``max_requests / 12``, ``/ 3``, ``max_requests``; at least ``min_requests``),
        so queues can build up at every rate and the points share at most three programs.
      window_s, min_requests, max_requests: that sizing.
      config: serving knobs (chunk, SLOs, batch, window, ...).
      seed: trace seed (the same for every point of a (workload, load)).
      dtype: float dtype of the array program.
      batch_size: points per vmap call (default: all points of a group at once).

    Returns:
      :class:`ExploreResult`.

    Raises:
      SpecError: bad names, empty lists, non-positive loads or requests (before any simulation).
    """
    config = config or sv.ServingConfig()
    models = [get_model(m).name for m in models]
    workloads = [resolve_workload_name(w) for w in workloads]
    if not models or not workloads:
        raise SpecError("give at least one model and one workload")
    loads = _positive_list("loads", loads)
    if requests is not None and (not isinstance(requests, int) or isinstance(requests, bool) or requests < 2):
        raise SpecError(f"requests must be an integer >= 2, got {requests!r}")
    if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
        raise SpecError(f"window_s must be a positive number of seconds, got {window_s!r}")
    if not (isinstance(min_requests, int) and isinstance(max_requests, int) and 2 <= min_requests <= max_requests):
        raise SpecError(f"need 2 <= min_requests <= max_requests, got {min_requests!r}, {max_requests!r}")
    hardware = list(template_points() if hardware is None else hardware)
    if not hardware:
        raise SpecError("give at least one hardware point")
    t0 = time.perf_counter()
    specs = [h.spec() for h in hardware]
    rates = reference_rates(models, workloads, loads, config, specs)
    # request counts come from three size classes (max/12, max/3, max) so that the points share
    # at most three compiled programs
    classes = sorted({max(min_requests, max_requests // 12), max(min_requests, max_requests // 3), max_requests})

    def size(rate):
        if requests is not None:
            return requests
        target = rate * window_s
        return next((c for c in classes if c >= target), classes[-1])

    traces = {(m, w, k): synthetic_trace(w, size(rates[(m, w)][k]), rates[(m, w)][k], seed + 1000 * k)
              for m in models for w in workloads for k in range(len(loads))}
    points, meta = [], []
    for h, spec in zip(hardware, specs):
        for m in models:
            for w in workloads:
                setup = sv.build_setup(m, spec, WORKLOAD_PRESETS[w], "wsc", config=config,
                                       label=f"{h.label}/{m}/{w}")
                for k, load in enumerate(loads):
                    points.append((setup, traces[(m, w, k)]))
                    meta.append((h, m, w, load, rates[(m, w)][k]))
    t_setup = time.perf_counter() - t0
    rep = sv.simulate(points, dtype=dtype, batch_size=batch_size)
    rows = []
    for (h, m, w, load, rate), res in zip(meta, rep.results):
        row = dict(h.as_dict())
        row.update(model=m, workload=w, load=load, rate_rps=rate, requests=len(res.trace))
        d = res.setup.describe()
        row.update({k: d.get(k) for k in ("feasible", "prefill", "n_prefill", "decode", "n_decode", "batch_cap",
                                           "served_rps", "dies_used")})
        row.update({k: v for k, v in res.metrics.items() if k != "requests"})
        row["goodput_per_die"] = row["goodput_rps"] / h.rows / h.cols
        row["reason"] = res.setup.reason
        rows.append(row)
    best, best_model = best_designs(rows, hardware, models, workloads)
    timing = {"setup_s": t_setup, "simulate_s": rep.wall_s, "compile_s": rep.compile_s, "groups": rep.groups,
              "points": len(points), "simulated_requests": rep.simulated_requests,
              "requests_per_wall_s": rep.requests_per_wall_s, "total_s": time.perf_counter() - t0}
    return ExploreResult(rows=rows, best=best, best_per_model=best_model, rates=rates, timing=timing)


def scores(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Per (hardware label, model, workload): goodput summed over loads and mean E2E over loads."""
    acc: dict = {}
    for r in rows:
        key = (_hw_key(r), r["model"], r["workload"])
        a = acc.setdefault(key, {"score": 0.0, "e2e": [], "feasible": bool(r.get("feasible"))})
        a["score"] += float(r.get("goodput_rps") or 0.0)
        e = r.get("e2e_mean")
        a["e2e"].append(float(e) if e is not None and math.isfinite(float(e)) else math.inf)
    return {k: {"score": v["score"], "e2e_mean": float(np.mean(v["e2e"])), "feasible": v["feasible"]}
            for k, v in acc.items()}


def _hw_key(r: dict[str, Any]) -> str:
    return f"{r['grid']} {r['dram_gb']:g}GB {r['dram_tbps']:g}TB/s D2D {r['d2d_tbps']:g}TB/s"


def best_designs(rows, hardware: Sequence[HardwarePoint], models: Sequence[str], workloads: Sequence[str]):
    """Best hardware point per workload (geometric mean of normalised scores) and per (workload, model).

    Returned twice per workload when some points lie on the template's shoreline trade-off
    (:attr:`HardwarePoint.on_shoreline`): over all points (``subset`` ``all``) and over
    those only (``shoreline``).
    """
    sc = scores(rows)
    label = lambda h: f"{h.rows}x{h.cols} {h.dram_gb:g}GB {h.dram_tbps:g}TB/s D2D {h.d2d_tbps:g}TB/s"
    best, per_model = [], []
    subsets = [("all", list(dict.fromkeys(label(h) for h in hardware)))]
    shore = list(dict.fromkeys(label(h) for h in hardware if h.on_shoreline))
    if shore and len(shore) < len(subsets[0][1]):
        subsets.append(("shoreline", shore))
    for subset, labels in subsets:
        b, pm = _best_of(sc, labels, models, workloads)
        best += [dict(x, subset=subset) for x in b]
        per_model += [dict(x, subset=subset) for x in pm]
    return best, per_model


def _best_of(sc, labels, models, workloads):
    best, per_model = [], []
    for w in workloads:
        norm = {}
        for m in models:
            top = max((sc[(l, m, w)]["score"] for l in labels if (l, m, w) in sc), default=0.0)
            for l in labels:
                s = sc.get((l, m, w), {"score": 0.0})["score"]
                norm[(l, m)] = s / top if top > 0 else 0.0
            ranked = sorted(labels, key=lambda l: (-sc.get((l, m, w), {"score": 0.0})["score"],
                                                   sc.get((l, m, w), {"e2e_mean": math.inf})["e2e_mean"]))
            b = ranked[0]
            per_model.append({"workload": w, "model": m, "hardware": b, "goodput_sum_rps": sc[(b, m, w)]["score"],
                              "e2e_mean_s": sc[(b, m, w)]["e2e_mean"]})
        def key(l):
            vals = [norm[(l, m)] for m in models]
            geo = float(np.exp(np.mean(np.log(np.maximum(vals, 1e-12))))) if all(v > 0 for v in vals) else 0.0
            e2e = float(np.mean([sc.get((l, m, w), {"e2e_mean": math.inf})["e2e_mean"] for m in models]))
            return (-geo, e2e), geo
        ranked = sorted(labels, key=lambda l: key(l)[0])
        b = ranked[0]
        best.append({"workload": w, "hardware": b, "score_geomean": key(b)[1],
                     **{f"score_{m}": norm[(b, m)] for m in models},
                     "runner_up": ranked[1] if len(ranked) > 1 else None,
                     "runner_up_score": key(ranked[1])[1] if len(ranked) > 1 else None})
    return best, per_model


__all__ = ["HardwarePoint", "template_points", "parse_grids", "ExploreResult", "explore", "reference_rates",
           "best_designs", "scores", "write_rows", "DEFAULT_MODELS", "DEFAULT_WORKLOADS", "DEFAULT_LOADS",
           "DEFAULT_DRAM_GB", "DEFAULT_D2D_TBPS", "DEFAULT_GRIDS"]
